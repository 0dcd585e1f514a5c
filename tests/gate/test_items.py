"""The item vocabulary: how the spec's defaults read an item without a type."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.gate import items

# (item, its readings, its kind)
READINGS = [
    pytest.param(
        {"type": "function_call_output", "call_id": "c"}, set(), "function_call_output", id="typed"
    ),
    pytest.param({"type": "acme:call", "id": "x"}, set(), "acme:call", id="vendor-type"),
    pytest.param({"type": 5, "call_id": "c", "output": "x"}, set(), None, id="type-a-number"),
    pytest.param(
        {"call_id": "c", "output": "x"},
        {"function_call_output"},
        "function_call_output",
        id="output",
    ),
    pytest.param(
        {"call_id": 5, "output": 5},
        {"function_call_output"},
        "function_call_output",
        id="bad-fields",
    ),
    pytest.param(
        {"type": None, "call_id": "c", "output": "x"},
        {"function_call_output"},
        "function_call_output",
        id="null-type-output",
    ),
    pytest.param(
        {"type": "", "call_id": "c", "output": "x"},
        {"function_call_output"},
        "function_call_output",
        id="empty-type-output",
    ),
    pytest.param(
        {"call_id": "c", "name": "n", "arguments": "{}"},
        {"function_call"},
        "function_call",
        id="call",
    ),
    pytest.param({"call_id": "c", "name": "n"}, {"function_call"}, "function_call", id="no-args"),
    pytest.param({"id": "fc_1"}, {"item_reference"}, "item_reference", id="bare-id"),
    pytest.param({"type": None, "id": "fc_1"}, {"item_reference"}, "item_reference", id="null-ref"),
    pytest.param({"role": "user", "content": "hi"}, {"message"}, "message", id="message"),
    pytest.param({"content": "hi"}, {"message"}, "message", id="content-only"),
    pytest.param({"role": "user", "call_id": "c"}, {"message"}, "message", id="message-call-id"),
    pytest.param({"summary": []}, {"reasoning"}, "reasoning", id="reasoning"),
    pytest.param({"encrypted_content": "x"}, {"compaction"}, "compaction", id="compaction"),
    pytest.param({}, set(), None, id="empty"),
    pytest.param({"call_id": "c"}, set(), None, id="call-id-alone"),
    pytest.param(
        {"id": "fc_1", "call_id": "c", "name": "n", "arguments": "{}"},
        {"item_reference", "function_call"},
        None,
        id="call-or-reference",
    ),
    pytest.param(
        {"call_id": "c", "name": "n", "output": "x"},
        {"function_call", "function_call_output"},
        None,
        id="call-or-output",
    ),
    pytest.param(
        {"role": "user", "content": "x", "call_id": "c", "output": "y"},
        {"message", "function_call_output"},
        None,
        id="message-or-output",
    ),
    pytest.param(
        {"role": "user", "content": "x", "id": "msg_1"},
        {"message", "item_reference"},
        None,
        id="message-or-reference",
    ),
]


@pytest.mark.parametrize(("item", "found", "kind"), READINGS)
def test_readings_and_kind(item: dict[str, Any], found: set[str], kind: str | None) -> None:
    assert items.readings(item) == found
    assert items.kind(item) == kind
    assert items.is_ambiguous(item) == (len(found) > 1)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(None, id="null"),
        pytest.param(1, id="number"),
        pytest.param("x", id="string"),
        pytest.param([{"call_id": "c", "output": "x"}], id="array-of-an-output"),
    ],
)
def test_a_non_object_has_no_kind(value: Any) -> None:
    assert items.kind(value) is None
    assert not items.is_ambiguous(value)
