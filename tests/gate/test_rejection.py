"""What a block says: the header and the rejection body."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.gate.policy import Policy
from proxy.gate.verdict import inspect, rejection
from tests.builders import GLOBAL, call, message, output, request


@pytest.mark.parametrize(
    ("settings", "header"),
    [
        pytest.param({"action": "block"}, None, id="clean"),
        pytest.param({"action": "log"}, "logged=2", id="logged"),
        pytest.param({"action": "strip"}, "stripped=2", id="stripped"),
        pytest.param(
            {"action": "strip", "actions": {"status": "log"}}, "stripped=1, logged=1", id="both"
        ),
    ],
)
def test_header(settings: dict[str, Any], header: str | None) -> None:
    failing = [call("a", GLOBAL), output("a"), call("b", status="incomplete"), output("b")]
    clean = [call("a"), output("a")]
    input_items = clean if header is None else failing
    verdict = inspect(request(*input_items), Policy(**settings))
    assert verdict.outcome != "block"
    assert verdict.header() == header


def test_rejection_matches_the_design_example() -> None:
    body = request(
        message("latest global sales?"),
        call("call_123"),
        output("call_123"),
        call("call_129", GLOBAL, id="fc_009"),
        output("call_129"),
    )
    assert rejection(inspect(body, Policy())) == {
        "error": {
            "type": "invalid_request_error",
            "code": "replay_rejected",
            "param": "input[4]",
            "message": (
                "input[4] (call_id call_129): paired function_call failed the replay gate: "
                "arguments_schema at /region (enum)"
            ),
            "findings": [
                {
                    "index": 4,
                    "call_id": "call_129",
                    "paired_index": 3,
                    "name": "get_latest_sales_report",
                    "reason": "arguments_schema",
                    "pass": [],
                    "fail": [
                        {"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}
                    ],
                    # Beyond DESIGN's example: every finding says itself in one sentence.
                    "message": "region failed schema: expected one of apac, emea, amer",
                }
            ],
        }
    }


@pytest.mark.parametrize(
    ("input_items", "actions", "param", "message"),
    [
        pytest.param(
            [output("lost"), call("c", status="in_progress"), output("c")],
            {"orphan": "log"},
            "input[2]",
            "input[2] (call_id c): paired function_call failed the replay gate: status"
            " (and 1 more finding)",
            id="first-blocking-finding-named",
        ),
        pytest.param(
            [output("a"), output("b"), output("c")],
            {},
            "input[0]",
            "input[0] (call_id a): no function_call with this call_id precedes it: orphan"
            " (and 2 more findings)",
            id="orphans",
        ),
        pytest.param(
            [{"type": "function_call_output", "call_id": 7, "output": "x"}],
            {},
            "input[0]",
            "input[0]: the output has no string call_id: orphan",
            id="orphan-without-call-id",
        ),
        pytest.param(
            [{"role": "tool", "tool_call_id": "x", "content": "y"}],
            {},
            "input[0]",
            "input[0] (call_id x): a Chat Completions message inside input: envelope",
            id="envelope",
        ),
    ],
)
def test_rejection_names_the_first_blocking_finding(
    input_items: list[Any], actions: dict[str, Any], param: str, message: str
) -> None:
    verdict = inspect(request(*input_items), Policy(actions=actions))
    assert verdict.outcome == "block"
    error = rejection(verdict)["error"]
    assert error["param"] == param
    assert error["message"] == message
    assert len(error["findings"]) == len(verdict.findings)
    assert "arguments" not in json.dumps(error["findings"])
