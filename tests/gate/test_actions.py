"""The gate's actions on a failing pair, one outcome for several findings, and strip's history."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from proxy.gate import items
from proxy.gate.policy import Policy
from proxy.gate.verdict import inspect
from tests.builders import GLOBAL, call, message, output, ref, request
from tests.gate.ledger_double import Ledger

# Actions. BAD_PAIR fails the gate; the other items are fine.
HISTORY = [
    message("sales?"),
    call("ok"),
    output("ok"),
    call("bad", GLOBAL),
    message("thinking"),
    output("bad"),
    message("done"),
]


@pytest.mark.parametrize(
    ("settings", "outcome", "action", "forwarded"),
    [
        pytest.param({"action": "block"}, "block", "block", None, id="block"),
        pytest.param(
            {"action": "strip"}, "strip", "strip", [0, 1, 2, 4, 6], id="strip-removes-the-pair"
        ),
        pytest.param({"action": "log"}, "forward", "log", None, id="log"),
        pytest.param(
            {"action": "block", "actions": {"arguments_schema": "log"}},
            "forward",
            "log",
            None,
            id="override-log",
        ),
        pytest.param(
            {"action": "log", "actions": {"arguments_schema": "strip"}},
            "strip",
            "strip",
            [0, 1, 2, 4, 6],
            id="override-strip",
        ),
        pytest.param(
            {"action": "strip", "actions": {"arguments_schema": "block"}},
            "block",
            "block",
            None,
            id="override-block",
        ),
        pytest.param(
            {"action": "block", "actions": {"orphan": "log", "status": "strip"}},
            "block",
            "block",
            None,
            id="override-other-reason-unused",
        ),
    ],
)
def test_action(
    settings: dict[str, Any], outcome: str, action: str, forwarded: list[int] | None
) -> None:
    verdict = inspect(request(*HISTORY), Policy(**settings))
    assert verdict.outcome == outcome
    assert [(f.index, f.reason, f.action) for f in verdict.findings] == [
        (5, "arguments_schema", action)
    ]
    if forwarded is None:
        assert verdict.input is None
    else:
        assert verdict.input is not None
        # The same items, in order: nothing but the pair is touched.
        assert [id(item) for item in verdict.input] == [id(HISTORY[i]) for i in forwarded]


@pytest.mark.parametrize(
    ("actions", "outcome", "header"),
    [
        pytest.param({"orphan": "strip", "status": "block"}, "block", None, id="block-beats-strip"),
        pytest.param({"orphan": "block", "status": "strip"}, "block", None, id="strip-loses"),
        pytest.param({"orphan": "log", "status": "block"}, "block", None, id="block-beats-log"),
        pytest.param(
            {"orphan": "log", "status": "strip"}, "strip", "stripped=1, logged=1", id="strip-log"
        ),
        pytest.param({"orphan": "strip", "status": "strip"}, "strip", "stripped=2", id="strip-2"),
        pytest.param({"orphan": "log", "status": "log"}, "forward", "logged=2", id="log-2"),
    ],
)
def test_two_findings_one_outcome(
    actions: dict[str, Any], outcome: str, header: str | None
) -> None:
    body = request(output("lost"), call("c", status="in_progress"), output("c"), message("next"))
    verdict = inspect(body, Policy(actions=actions))
    assert verdict.outcome == outcome
    assert {f.reason: f.action for f in verdict.findings} == actions
    if outcome == "block":
        assert verdict.input is None
    else:
        assert verdict.header() == header


def history_errors(input_items: Sequence[Any]) -> list[str]:
    """What would make a provider reject the history: dangling outputs or calls."""
    errors = []
    calls: dict[str, int] = {}
    answered: set[str] = set()
    for index, item in enumerate(input_items):
        if items.is_output(item):
            call_id = item["call_id"]
            if call_id not in calls:
                errors.append(f"input[{index}]: output without its call")
            answered.add(call_id)
        elif items.kind(item) == items.FUNCTION_CALL:
            calls[item["call_id"]] = index
    errors.extend(f"input[{i}]: call without output" for c, i in calls.items() if c not in answered)
    return errors


# (input, settings, indexes of the forwarded input)
STRIPS = [
    pytest.param(HISTORY, {}, [0, 1, 2, 4, 6], id="pair-in-the-middle"),
    pytest.param([message("a"), output("lost")], {}, [0], id="orphan-output-only"),
    pytest.param([output("c"), call("c")], {}, [], id="output-before-call-takes-the-call"),
    pytest.param([call("c"), output("c"), output("c")], {}, [], id="duplicate-outputs"),
    pytest.param([call("c"), call("c"), output("c")], {}, [], id="duplicate-calls"),
    pytest.param(
        [call("a"), call("b", GLOBAL), output("a"), output("b")],
        {},
        [0, 2],
        id="parallel-calls",
    ),
    pytest.param(
        [call("a", GLOBAL), call("b", GLOBAL), output("a"), output("b"), message("m")],
        {},
        [4],
        id="parallel-calls-both-fail",
    ),
    pytest.param(
        [call("a"), output("a"), {"role": "tool", "tool_call_id": "a", "content": "x"}],
        {},
        [0, 1],
        id="envelope-item-only",
    ),
    pytest.param(
        [call("a"), output("a") | {"tool_call_id": "a"}, message("m")],
        {},
        [2],
        id="envelope-output-takes-its-call",
    ),
    pytest.param(
        [call("a", GLOBAL), output("a"), call("b", status="in_progress"), output("b")],
        {"actions": {"status": "log"}},
        [2, 3],
        id="logged-pair-stays",
    ),
    pytest.param(
        [ref("fc_a"), output("a"), message("m")],
        {},
        [2],
        id="reference-removed-with-output",
    ),
    pytest.param(
        [call("a"), output("a"), call("a", GLOBAL), output("a")],
        {},
        [],
        id="reused-call-id",
    ),
]


@pytest.mark.parametrize(("input_items", "settings", "forwarded"), STRIPS)
def test_strip_keeps_history_valid(
    input_items: list[Any], settings: dict[str, Any], forwarded: list[int]
) -> None:
    ledger = Ledger(stored={"fc_a": call("a", GLOBAL)})
    verdict = inspect(request(*input_items), Policy(action="strip", **settings), ledger)
    assert verdict.outcome == "strip"
    assert verdict.input is not None
    assert [id(item) for item in verdict.input] == [id(input_items[i]) for i in forwarded]
    assert history_errors(verdict.input) == []
    again = inspect(request(*verdict.input), Policy(action="strip", **settings), ledger)
    assert again.outcome == "forward"
    assert [f.action for f in again.findings] == [
        f.action for f in verdict.findings if f.action == "log"
    ]


@pytest.mark.parametrize(
    ("input_items", "ledger"),
    [
        pytest.param(
            [output("c")], Ledger(chain=[call("c", GLOBAL)]), id="call-in-previous-response"
        ),
        pytest.param(
            [call("c"), output("c")],
            Ledger(chain=[call("c", GLOBAL)]),
            id="duplicate-one-upstream",
        ),
    ],
)
def test_strip_escalates_when_the_call_lives_upstream(
    input_items: list[Any], ledger: Ledger
) -> None:
    body = request(*input_items, previous_response_id="resp_1")
    verdict = inspect(body, Policy(action="strip"), ledger)
    assert verdict.outcome == "block"
    assert [f.action for f in verdict.findings] == ["block"]
    assert verdict.input is None


def test_strip_escalation_blocks_the_whole_request() -> None:
    body = request(call("a", GLOBAL), output("a"), output("up"), previous_response_id="resp_1")
    verdict = inspect(body, Policy(action="strip"), Ledger(chain=[call("up", GLOBAL)]))
    assert verdict.outcome == "block"
    assert [(f.index, f.action) for f in verdict.findings] == [(1, "strip"), (2, "block")]


def told(output_item: Any) -> dict[str, Any]:
    """The failure record a rewritten output carries, read back."""
    record: dict[str, Any] = json.loads(output_item["output"])
    return record


SALES_FAILED = {
    "success": False,
    "execute": False,
    "check": "get_latest_sales_report",
    "reason": "arguments_schema",
    "pass": [],
    "fail": [{"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}],
    "error": "region failed schema: expected one of apac, emea, amer",
}


# (input, settings, ledger, outcome, header, the rewritten indexes and their records, and the
# indexes of the items forwarded as they came)
REWRITES = [
    pytest.param(
        HISTORY,
        {"action": "rewrite"},
        Ledger(),
        "rewrite",
        "rewritten=1",
        {5: SALES_FAILED},
        [0, 1, 2, 3, 4, 6],
        id="inline-pair-stays",
    ),
    pytest.param(
        HISTORY,
        {"actions": {"arguments_schema": "rewrite"}},
        Ledger(),
        "rewrite",
        "rewritten=1",
        {5: SALES_FAILED},
        [0, 1, 2, 3, 4, 6],
        id="override-rewrite",
    ),
    pytest.param(
        [output("up"), message("m")],
        {"action": "rewrite"},
        Ledger(chain=[call("up", GLOBAL)]),
        "rewrite",
        "rewritten=1",
        {0: SALES_FAILED},
        [1],
        id="call-upstream-never-escalates",
    ),
    pytest.param(
        [ref("fc_a"), output("a")],
        {"action": "rewrite"},
        Ledger(stored={"fc_a": call("a", GLOBAL)}),
        "rewrite",
        "rewritten=1",
        {1: SALES_FAILED},
        [0],
        id="call-by-reference",
    ),
    pytest.param(
        [call("c", status="in_progress"), output("c")],
        {"action": "rewrite"},
        Ledger(),
        "rewrite",
        "rewritten=1",
        {
            1: SALES_FAILED
            | {
                "reason": "status",
                "pass": [],
                "fail": [],
                "error": "status is in_progress: a replayed function_call must be completed",
            }
        },
        [0],
        id="status-told-too",
    ),
    pytest.param(
        [call("a", GLOBAL), output("a"), call("b", "{"), output("b")],
        {"action": "rewrite", "actions": {"arguments_parse": "strip"}},
        Ledger(),
        "strip",
        "stripped=1, rewritten=1",
        {1: SALES_FAILED},
        [0],
        id="strip-and-rewrite",
    ),
    pytest.param(
        [call("a", GLOBAL), output("a"), call("b", status="incomplete"), output("b")],
        {"action": "rewrite", "actions": {"status": "log"}},
        Ledger(),
        "rewrite",
        "rewritten=1, logged=1",
        {1: SALES_FAILED},
        [0, 2, 3],
        id="rewrite-and-log",
    ),
]


@pytest.mark.parametrize(
    ("input_items", "settings", "ledger", "outcome", "header", "rewritten", "unchanged"), REWRITES
)
def test_rewrite_replaces_only_the_output(
    input_items: list[Any],
    settings: dict[str, Any],
    ledger: Ledger,
    outcome: str,
    header: str,
    rewritten: dict[int, dict[str, Any]],
    unchanged: list[int],
) -> None:
    body = request(*input_items, previous_response_id="resp_1")
    verdict = inspect(body, Policy(**settings), ledger)
    assert verdict.outcome == outcome
    assert verdict.header() == header
    assert verdict.input is not None
    forwarded = {id(item): item for item in verdict.input}
    for index, record in rewritten.items():
        [new] = [
            item
            for item in verdict.input
            if item.get("call_id") == input_items[index]["call_id"] and items.is_output(item)
        ]
        # A copy: the client's body is not changed, only what goes upstream.
        assert new is not input_items[index]
        assert new == input_items[index] | {"output": new["output"]}
        assert told(new) == record
    kept = [i for i, item in enumerate(input_items) if id(item) in forwarded]
    assert kept == unchanged
    if not ledger.chain and not ledger.stored:
        assert history_errors(verdict.input) == []


@pytest.mark.parametrize(
    ("input_items", "reason"),
    [
        pytest.param([output("lost")], "orphan", id="orphan"),
        pytest.param([call("c"), call("c"), output("c")], "duplicate_call_id", id="duplicate"),
        pytest.param([ref("fc_none")], "unknown_reference", id="unknown-reference"),
        pytest.param(
            [{"role": "tool", "tool_call_id": "x", "content": "y"}], "envelope", id="envelope"
        ),
    ],
)
def test_rewrite_by_default_blocks_what_it_cannot_rewrite(
    input_items: list[Any], reason: str
) -> None:
    verdict = inspect(request(*input_items), Policy(action="rewrite"))
    assert verdict.outcome == "block"
    assert [(f.reason, f.action) for f in verdict.findings] == [(reason, "block")]
