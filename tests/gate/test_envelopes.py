"""Request-level: Chat Completions envelopes inside `input`, and bodies with nothing to gate."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.gate.policy import Policy
from proxy.gate.reasons import Outcome
from proxy.gate.verdict import Verdict, inspect
from tests.builders import GLOBAL, call, message, only, output, request

# Request-level: Chat Completions envelopes inside `input`.
ENVELOPES = [
    pytest.param(
        [call("c"), {"role": "tool", "tool_call_id": "c", "content": "x"}],
        1,
        "c",
        id="role-tool",
    ),
    pytest.param(
        [{"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}, message("hi")],
        0,
        None,
        id="tool-calls",
    ),
    pytest.param([message("hi"), {"role": "tool", "content": "x"}], 1, None, id="role-tool-no-id"),
    pytest.param(
        [call("c"), output("c") | {"tool_call_id": "c"}], 1, "c", id="tool-call-id-on-output"
    ),
    pytest.param([message("hi") | {"tool_call_id": 7}], 0, None, id="tool-call-id-number"),
    pytest.param(
        [call("c", tool_calls=[]), output("c")], 0, None, id="tool-calls-on-function-call"
    ),
]


@pytest.mark.parametrize(("input_items", "index", "call_id"), ENVELOPES)
def test_envelope(input_items: list[Any], index: int, call_id: str | None) -> None:
    verdict = inspect(request(*input_items), Policy())
    assert only(verdict) == {
        "index": index,
        "call_id": call_id,
        "paired_index": None,
        "name": None,
        "reason": "envelope",
        "message": (
            "a Chat Completions message (role: tool, tool_calls or tool_call_id) inside input: "
            "Open Responses carries function_call and function_call_output items instead"
        ),
    }
    assert verdict.outcome == "block"


def test_envelope_does_not_hide_a_failing_call() -> None:
    # Logging envelopes must not let an output carrying `tool_call_id` skip the replay gate.
    body = request(call("c", GLOBAL), output("c") | {"tool_call_id": "c"})
    verdict = inspect(body, Policy(actions={"envelope": "log"}))
    assert verdict.outcome == "block"
    assert [(f.index, f.reason, f.action) for f in verdict.findings] == [
        (1, "envelope", "log"),
        (1, "arguments_schema", "block"),
    ]


NOT_REQUESTS = [
    pytest.param(None, id="null"),
    pytest.param([output("c")], id="array"),
    pytest.param("text", id="string"),
    pytest.param({}, id="no-input"),
    pytest.param({"input": "one user message"}, id="string-input"),
    pytest.param({"input": {"type": "function_call_output"}}, id="object-input"),
    pytest.param({"input": None}, id="null-input"),
    pytest.param({"input": []}, id="empty-input"),
    pytest.param({"input": [None, 1, "x", [], {}]}, id="junk-items"),
]


@pytest.mark.parametrize("body", NOT_REQUESTS)
def test_nothing_to_gate_is_forwarded(body: Any) -> None:
    assert inspect(body, Policy()) == Verdict(Outcome.FORWARD)
