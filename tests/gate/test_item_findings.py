"""Items read as a lenient server reads them, and the findings about single items."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.gate.policy import Policy
from proxy.gate.verdict import inspect, rejection
from tests.builders import GLOBAL, call, message, only, output, ref, request, typeless, without
from tests.gate.ledger_double import Ledger

# Items as a lenient server reads them (the spec's defaults), and item-level findings:
# (input items, policy settings, ledger, every finding as (index, reason)).
CLASSIFIED = [
    # A typeless item with `call_id` and `output` is a function_call_output.
    pytest.param(
        [call("c", GLOBAL), typeless(output("c"))],
        {},
        None,
        [(1, "arguments_schema")],
        id="typeless-output-gated",
    ),
    pytest.param(
        [call("c", GLOBAL), output("c") | {"type": None}],
        {},
        None,
        [(1, "arguments_schema")],
        id="null-type-output-gated",
    ),
    pytest.param([typeless(output("c"))], {}, None, [(0, "orphan")], id="typeless-output-orphan"),
    pytest.param(
        [call("c", GLOBAL), output("c") | {"type": ""}],
        {},
        None,
        [(1, "arguments_schema")],
        id="empty-type-output-gated",
    ),
    pytest.param(
        [call("c", GLOBAL), output("c") | {"type": False}],
        {},
        None,
        [(1, "arguments_schema")],
        id="false-type-output-gated",
    ),
    pytest.param(
        [without(call("c", type=""), "id"), output("c")],
        {},
        None,
        [(1, "not_function_call")],
        id="empty-type-call",
    ),
    pytest.param(
        [call("c"), typeless(output("c")), typeless(output("c"))],
        {},
        None,
        [(1, "duplicate_call_id"), (2, "duplicate_call_id")],
        id="typeless-outputs-duplicate",
    ),
    pytest.param([call("c"), typeless(output("c"))], {}, None, [], id="typeless-output-ok"),
    # A typeless call pairs (and counts for duplicate_call_id) but must say it is one.
    pytest.param(
        [call("c"), typeless(without(call("c", GLOBAL), "id")), output("c")],
        {},
        None,
        [(2, "duplicate_call_id")],
        id="typeless-call-beside-a-good-one",
    ),
    pytest.param(
        [call("c"), {"call_id": "c", "name": "get_latest_sales_report"}, output("c")],
        {},
        None,
        [(2, "duplicate_call_id")],
        id="typeless-call-without-arguments-beside-a-good-one",
    ),
    # Several readings: the gate cannot know which one the upstream takes.
    pytest.param(
        [call("c"), typeless(call("c", GLOBAL)), output("c")],
        {},
        None,
        [(1, "ambiguous_item"), (2, "duplicate_call_id")],
        id="typeless-call-with-id-beside-a-good-one",
    ),
    pytest.param(
        [typeless(call("c", GLOBAL)), output("c")],
        {},
        Ledger(stored={"fc_c": call("c")}),
        [(0, "ambiguous_item"), (1, "namespaced")],
        id="typeless-call-or-reference",
    ),
    pytest.param(
        [call("c", GLOBAL), message("hi") | {"call_id": "c", "output": "x"}],
        {},
        None,
        [(1, "ambiguous_item")],
        id="message-or-output",
    ),
    pytest.param(
        [call("c", GLOBAL) | {"type": None, "output": "x"}],
        {},
        None,
        [(0, "ambiguous_item")],
        id="call-or-output",
    ),
    pytest.param(
        [message("hi") | {"id": "msg_1"}],
        {},
        Ledger(stored={"msg_1": call("c")}),
        [(0, "ambiguous_item")],
        id="message-or-reference",
    ),
    pytest.param(
        [{"role": "tool", "call_id": "c", "output": "x"}],
        {},
        None,
        [(0, "envelope"), (0, "ambiguous_item")],
        id="envelope-and-ambiguous",
    ),
    pytest.param(
        [message("hi"), {"summary": [], "encrypted_content": None}],
        {},
        None,
        [(1, "ambiguous_item")],
        id="reasoning-or-compaction",
    ),
    pytest.param(
        [message("hi"), {"id": "rs_1", "summary": []}],
        {},
        Ledger(stored={"rs_1": {"type": "reasoning", "id": "rs_1"}}),
        [(1, "ambiguous_item")],
        id="reasoning-or-reference",
    ),
    pytest.param(
        [message("hi"), {"summary": []}, {"content": "x"}, {"foo": 1}, {}],
        {},
        None,
        [],
        id="one-reading-or-none-pass",
    ),
    # item_reference: to nothing the proxy relayed, it is a finding of its own.
    pytest.param([ref("fco_1")], {}, None, [(0, "unknown_reference")], id="unknown-ref"),
    pytest.param([{"id": "fco_1"}], {}, None, [(0, "unknown_reference")], id="unknown-bare-id"),
    pytest.param(
        [{"type": None, "id": "fco_1"}], {}, None, [(0, "unknown_reference")], id="unknown-null"
    ),
    pytest.param(
        [{"type": "item_reference", "id": 5}], {}, None, [(0, "unknown_reference")], id="id-num"
    ),
    pytest.param(
        [{"type": "item_reference"}], {}, None, [(0, "unknown_reference")], id="ref-without-id"
    ),
    pytest.param(
        [ref("fc_c"), output("c")],
        {},
        None,
        [(0, "unknown_reference"), (1, "orphan")],
        id="unknown-ref-orphans-its-output",
    ),
    pytest.param(
        [ref("fc_c"), output("c")],
        {"actions": {"unknown_reference": "log"}},
        None,
        [(0, "unknown_reference"), (1, "orphan")],
        id="unknown-ref-logged-output-still-orphan",
    ),
    pytest.param(
        [ref("fco_1")],
        {},
        Ledger(trust_unpaired=True),
        [(0, "unknown_reference")],
        id="unknown-ref-not-waived-by-fail-open",
    ),
    pytest.param(
        [ref("msg_1"), message("hi")],
        {},
        Ledger(stored={"msg_1": {"type": "message", "id": "msg_1", "role": "assistant"}}),
        [],
        id="known-ref-to-a-message",
    ),
    # Provenance compares status too.
    pytest.param(
        [call("c"), output("c")],
        {"require_provenance": True},
        Ledger(emitted=[call("c", status="incomplete")]),
        [(1, "provenance")],
        id="provenance-emitted-incomplete-replayed-completed",
    ),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {"require_provenance": True},
        Ledger(emitted=[call("c")]),
        [],
        id="provenance-status-missing-emitted-completed",
    ),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {"require_provenance": True},
        Ledger(emitted=[call("c", status="incomplete")]),
        [(1, "status")],
        id="provenance-status-missing-emitted-incomplete",
    ),
    # A call replayed without status: the status the proxy relayed it with, if it did.
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {},
        Ledger(emitted=[call("c")]),
        [],
        id="status-missing-relayed-completed",
    ),
    pytest.param(
        [without(call("c", id=None), "status", "id"), output("c")],
        {},
        Ledger(emitted=[call("c")]),
        [],
        id="status-and-id-missing-relayed-completed",
    ),
    pytest.param(
        [call("c", status=None), output("c")],
        {},
        Ledger(emitted=[call("c")]),
        [],
        id="status-null-relayed-completed",
    ),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {},
        Ledger(emitted=[call("c", status="incomplete")]),
        [(1, "status")],
        id="status-missing-relayed-incomplete",
    ),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {"allow_missing_status": True},
        Ledger(emitted=[call("c", status="incomplete")]),
        [(1, "status")],
        id="status-missing-relayed-incomplete-not-allowed",
    ),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {},
        Ledger(emitted=[call("c"), call("c", status="incomplete")]),
        [(1, "status")],
        id="status-missing-relayed-twice-differently",
    ),
    pytest.param(
        [without(call("c", '{"region":"emea"}'), "status"), output("c")],
        {},
        Ledger(emitted=[call("c")]),
        [(1, "status")],
        id="status-missing-relayed-other-arguments",
    ),
    pytest.param(
        [without(call("c", name="lookup"), "status"), output("c")],
        {},
        Ledger(emitted=[call("c")]),
        [(1, "status")],
        id="status-missing-relayed-other-name",
    ),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {},
        Ledger(emitted=[call("other")]),
        [(1, "status")],
        id="status-missing-relayed-other-call-id",
    ),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {},
        Ledger(emitted=[without(call("c"), "status")]),
        [(1, "status")],
        id="status-missing-relayed-without-status",
    ),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {"allow_missing_status": True},
        Ledger(emitted=[without(call("c"), "status")]),
        [],
        id="status-missing-relayed-without-status-allowed",
    ),
    pytest.param(
        [call("c", status="in_progress"), output("c")],
        {},
        Ledger(emitted=[call("c")]),
        [(1, "status")],
        id="status-given-is-judged-as-given",
    ),
    pytest.param(
        [without(call("c", GLOBAL), "status"), output("c")],
        {},
        Ledger(emitted=[call("c", GLOBAL)]),
        [(1, "arguments_schema")],
        id="status-from-record-then-schema",
    ),
]


@pytest.mark.parametrize(("input_items", "settings", "ledger", "expected"), CLASSIFIED)
def test_items_are_read_as_a_lenient_server_reads_them(
    input_items: list[Any],
    settings: dict[str, Any],
    ledger: Ledger | None,
    expected: list[tuple[int, str]],
) -> None:
    policy = Policy(**settings)
    body = request(*input_items)
    verdict = inspect(body, policy) if ledger is None else inspect(body, policy, ledger)
    assert [(f.index, f.reason) for f in verdict.findings] == expected
    assert (verdict.outcome == "block") == any(f.action == "block" for f in verdict.findings)


def test_unknown_reference_names_its_id() -> None:
    verdict = inspect(request(message("hi"), ref("fco_1")), Policy())
    assert only(verdict) == {
        "index": 1,
        "call_id": None,
        "paired_index": None,
        "name": None,
        "reason": "unknown_reference",
        "id": "fco_1",
        "message": "item_reference fco_1 names no item the proxy relayed",
    }
    assert rejection(verdict)["error"]["message"] == (
        "input[1]: item_reference fco_1 names no item the proxy relayed: unknown_reference"
    )


@pytest.mark.parametrize(
    ("input_items", "forwarded"),
    [
        pytest.param([message("a"), ref("fco_1"), message("b")], [0, 2], id="unknown-reference"),
        pytest.param(
            [call("c"), output("c"), message("hi") | {"id": "msg_1"}], [0, 1], id="ambiguous"
        ),
        pytest.param(
            [typeless(call("c")), output("c"), message("m")], [2], id="ambiguous-takes-its-output"
        ),
    ],
)
def test_strip_removes_an_item_level_finding(input_items: list[Any], forwarded: list[int]) -> None:
    verdict = inspect(request(*input_items), Policy(action="strip"))
    assert verdict.outcome == "strip"
    assert verdict.input is not None
    assert [id(item) for item in verdict.input] == [id(input_items[i]) for i in forwarded]
    assert inspect(request(*verdict.input), Policy(action="strip")).findings == ()


def test_provenance_is_asked_about_the_paired_call() -> None:
    paired = call("c")
    ledger = Ledger(emitted=[paired])
    verdict = inspect(request(paired, output("c")), Policy(require_provenance=True), ledger)
    assert verdict.outcome == "forward"
    assert ledger.asked == [paired]


def test_duplicate_outputs_are_each_a_finding() -> None:
    verdict = inspect(request(call("c"), output("c"), output("c")), Policy())
    assert [(f.index, f.reason, f.paired_index) for f in verdict.findings] == [
        (1, "duplicate_call_id", 0),
        (2, "duplicate_call_id", 0),
    ]


def test_finding_names_the_call() -> None:
    verdict = inspect(
        request(message("hi"), call("call_129", GLOBAL), output("call_129")), Policy()
    )
    assert only(verdict) == {
        "index": 2,
        "call_id": "call_129",
        "paired_index": 1,
        "name": "get_latest_sales_report",
        "reason": "arguments_schema",
        "pass": [],
        "fail": [{"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}],
        "message": "region failed schema: expected one of apac, emea, amer",
    }


@pytest.mark.parametrize(
    ("include", "expected"),
    [
        pytest.param(False, None, id="without"),
        pytest.param(True, GLOBAL, id="with"),
    ],
)
def test_finding_arguments_only_on_request(include: bool, expected: str | None) -> None:
    verdict = inspect(request(call("c", GLOBAL), output("c")), Policy())
    [finding] = verdict.findings
    assert finding.as_dict(include_arguments=include).get("arguments") == expected
