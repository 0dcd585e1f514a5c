"""Every finding's readable sentence: each reason explains itself, with what its item shows."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.gate.findings import Finding, message
from proxy.gate.policy import Policy
from proxy.gate.reasons import ALL_REASONS, EMITTED_REASONS, Reason
from proxy.gate.records import failure_record
from proxy.gate.verdict import inspect
from tests.builders import GLOBAL, WEB_SEARCH, call, output, ref, request, without
from tests.builders import message as user
from tests.gate.ledger_double import Ledger

SILENT = "the call failed the replay gate"


@pytest.mark.parametrize("reason", [*ALL_REASONS, *EMITTED_REASONS])
def test_every_reason_has_a_message(reason: Reason) -> None:
    said = message(Finding(1, reason, "block", "call_1", 0, "get_latest_sales_report"))
    assert not said.startswith(SILENT), f"{reason} has no message of its own"


# (input items, the policy's settings, the ledger, the reason, its message)
MESSAGES = [
    pytest.param(
        [user("hi"), output("call_9")],
        {},
        Ledger(),
        "orphan",
        "no function_call with call_id call_9 precedes this output: not inline, not behind an "
        "item_reference, not in the previous_response_id chain the proxy recorded",
        id="orphan",
    ),
    # An output without a call_id answers nothing: it says so, not "no call with no call_id".
    pytest.param(
        [user("hi"), {"type": "function_call_output", "output": "x"}],
        {},
        Ledger(),
        "orphan",
        "this output has no call_id (or one that is not a string): it answers no call, so no "
        "call can be found for it",
        id="orphan-without-call-id",
    ),
    pytest.param(
        [call("c"), call("c"), output("c")],
        {},
        Ledger(),
        "duplicate_call_id",
        "more than one function_call, or more than one output, has call_id c: which one was "
        "answered is ambiguous",
        id="duplicate-call-id",
    ),
    pytest.param(
        [call("c"), output("c")],
        {"require_provenance": True},
        Ledger(),
        "provenance",
        "no upstream response the proxy relayed to this client emitted this call (its call_id, "
        "name and arguments)",
        id="provenance",
    ),
    pytest.param(
        [WEB_SEARCH, output("ws_001")],
        {},
        Ledger(),
        "namespaced",
        "the paired item is a vendor extension, not a portable function_call "
        "(its type is openai:web_search_call)",
        id="namespaced",
    ),
    pytest.param(
        [call("c", type="custom_tool_call"), output("c")],
        {},
        Ledger(),
        "not_function_call",
        "the paired item is not a function_call (its type is custom_tool_call)",
        id="not-function-call",
    ),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {},
        Ledger(),
        "status",
        "status is missing: a replayed function_call must be completed",
        id="status-missing",
    ),
    pytest.param(
        [call("c", status=None), output("c")],
        {},
        Ledger(),
        "status",
        "status is null: a replayed function_call must be completed",
        id="status-null",
    ),
    pytest.param(
        [call("c", status="in_progress"), output("c")],
        {},
        Ledger(),
        "status",
        "status is in_progress: a replayed function_call must be completed",
        id="status-in-progress",
    ),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {},
        Ledger(emitted=[call("c", status="incomplete")]),
        "status",
        "status is missing, and the proxy relayed this call as incomplete: a replayed "
        "function_call must be completed",
        id="status-missing-relayed-incomplete",
    ),
    pytest.param(
        [call("c", {"region": "apac"}), output("c")],
        {},
        Ledger(),
        "arguments_type",
        "arguments must be a string of JSON but an object",
        id="arguments-object",
    ),
    pytest.param(
        [without(call("c"), "arguments"), output("c")],
        {},
        Ledger(),
        "arguments_type",
        "arguments is missing: a function_call carries its arguments as a string of JSON",
        id="arguments-missing",
    ),
    pytest.param(
        [call("c", '{"region": "apac", "region": "global"}'), output("c")],
        {},
        Ledger(),
        "arguments_parse",
        "arguments are not one strict JSON value: duplicate key 'region' in the object at line 1 "
        "column 1",
        id="arguments-duplicate-key",
    ),
    pytest.param(
        [call("c", '{"a": {"b": 1, "b": 2}}'), output("c")],
        {},
        Ledger(),
        "arguments_parse",
        "arguments are not one strict JSON value: duplicate key 'b' in the object at line 1 "
        "column 7",
        id="arguments-nested-duplicate-key",
    ),
    pytest.param(
        [call("c", '{"region": "apac"} x'), output("c")],
        {},
        Ledger(),
        "arguments_parse",
        "arguments are not one strict JSON value: trailing data after the JSON value at line 1 "
        "column 20",
        id="arguments-trailing-data",
    ),
    pytest.param(
        [call("c", "{}", "mystery"), output("c")],
        {},
        Ledger(),
        "unknown_tool",
        "no schema for tool mystery: pin one under tools: or send it in the request's tools",
        id="unknown-tool",
    ),
    pytest.param(
        [call("c", GLOBAL), output("c")],
        {},
        Ledger(),
        "arguments_schema",
        "region failed schema: expected one of apac, emea, amer",
        id="arguments-schema",
    ),
    pytest.param(
        [{"role": "tool", "tool_call_id": "c", "content": "x"}],
        {},
        Ledger(),
        "envelope",
        "a Chat Completions message (role: tool, tool_calls or tool_call_id) inside input: "
        "Open Responses carries function_call and function_call_output items instead",
        id="envelope",
    ),
    pytest.param(
        [call("c"), {"call_id": "c", "output": "x", "role": "user"}],
        {},
        Ledger(),
        "ambiguous_item",
        "an item without a type that the spec's defaults read as more than one kind: "
        "give it a type",
        id="ambiguous-item",
    ),
    pytest.param(
        [ref("fc_gone"), output("c")],
        {},
        Ledger(),
        "unknown_reference",
        "item_reference fc_gone names no item the proxy relayed",
        id="unknown-reference",
    ),
]


@pytest.mark.parametrize(("input_items", "settings", "ledger", "reason", "said"), MESSAGES)
def test_message(
    input_items: list[Any], settings: dict[str, Any], ledger: Ledger, reason: str, said: str
) -> None:
    verdict = inspect(request(*input_items), Policy(**settings), ledger)
    [finding] = [f for f in verdict.findings if f.reason == reason]
    assert message(finding) == said


@pytest.mark.parametrize(
    ("input_items", "said"),
    [
        pytest.param(
            [call("c", status="incomplete"), output("c")],
            "status is incomplete: a replayed function_call must be completed",
            id="status",
        ),
        pytest.param(
            [call("c", '{"region": "apac", "region": "apac"}'), output("c")],
            "arguments are not one strict JSON value: duplicate key 'region' in the object at "
            "line 1 column 1",
            id="duplicate-key",
        ),
    ],
)
def test_the_rewrite_says_the_same_sentence(input_items: list[Any], said: str) -> None:
    verdict = inspect(request(*input_items), Policy(action="rewrite"))
    assert verdict.input is not None
    [finding] = verdict.findings
    assert (
        json.loads(verdict.input[1]["output"])["error"] == said == failure_record(finding)["error"]
    )
