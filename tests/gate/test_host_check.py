"""The host's check of one call, without a proxy: the gate's verdict and its failure record."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.gate.host import check_call
from tests.builders import SALES_SCHEMA, SALES_TOOL


def sales(arguments: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": "function_call",
        "call_id": "call_129",
        "name": "get_latest_sales_report",
        "arguments": arguments,
        **fields,
    }


@pytest.mark.parametrize(
    ("call", "tools", "reason", "passed", "fail"),
    [
        pytest.param(sales('{"region":"apac"}'), None, "ok", ["region"], [], id="passes"),
        pytest.param(
            sales('{"region":"global"}'),
            None,
            "arguments_schema",
            [],
            [{"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}],
            id="enum",
        ),
        pytest.param(
            sales('{"region":"apac"}', status="completed"),
            [SALES_TOOL],
            "ok",
            ["region"],
            [],
            id="schema-from-tools",
        ),
        pytest.param(
            sales('{"region":"apac"}', status="in_progress"), None, "status", [], [], id="status"
        ),
        pytest.param(
            sales('{"region":"apac","region":"emea"}'),
            None,
            "arguments_parse",
            [],
            [],
            id="duplicate-key",
        ),
        pytest.param(sales('{"region":"apac"}'), [], "unknown_tool", [], [], id="no-schema"),
        pytest.param(
            sales('{"region":"apac"}', type="acme:call"), None, "namespaced", [], [], id="vendor"
        ),
    ],
)
def test_check_call(
    call: dict[str, Any],
    tools: list[Any] | None,
    reason: str,
    passed: list[str],
    fail: list[dict[str, Any]],
) -> None:
    record = check_call(call, SALES_SCHEMA if tools is None else None, tools=tools)
    ok = reason == "ok"
    assert (record["success"], record["execute"], record["reason"]) == (ok, ok, reason)
    assert (record["check"], record["pass"], record["fail"]) == (call["name"], passed, fail)
    assert (record["error"] is None) == ok
    json.dumps(record)  # the record is what a host sends back as the call's output


def test_a_missing_status_can_be_required() -> None:
    call = sales('{"region":"apac"}')
    assert check_call(call, SALES_SCHEMA)["execute"] is True
    refused = check_call(call, SALES_SCHEMA, allow_missing_status=False)
    assert (refused["execute"], refused["reason"]) == (False, "status")


def test_the_sentence_names_every_violation() -> None:
    record = check_call(sales('{"region":"global","refund":true}'), SALES_SCHEMA)
    assert record["error"] == (
        "refund is not allowed (additionalProperties: false); "
        "region failed schema: expected one of apac, emea, amer"
    )
