"""The examples of the original articles, through `inspect`, exactly as they must behave."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.gate.policy import Policy
from proxy.gate.verdict import inspect
from tests.builders import ARTICLE_TOOLS as TOOLS
from tests.builders import WEB_SEARCH, article_output


def call(call_id: str, arguments: Any, name: str = "get_latest_sales_report", **extra: Any) -> Any:
    item = {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "name": name,
        "call_id": call_id,
        "status": "completed",
        "arguments": arguments,
    }
    return item | extra


def lookup(arguments: dict[str, Any]) -> Any:
    return call("call_200", json.dumps(arguments), "lookup_order")


EXAMPLES = [
    pytest.param(call("call_123", '{"region":"apac"}'), "call_123", None, [], id="sales-ok"),
    pytest.param(
        call("call_129", '{"region":"global"}'),
        "call_129",
        "arguments_schema",
        [{"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}],
        id="sales-enum",
    ),
    pytest.param(WEB_SEARCH, "ws_001", "namespaced", [], id="web-search-namespaced"),
    pytest.param(call("c", {"region": "apac"}), "c", "arguments_type", [], id="arguments-object"),
    pytest.param(
        call("c", '{"region":"apac"}', status="in_progress"), "c", "status", [], id="in-progress"
    ),
    pytest.param(
        call("c", '{"region":"apac"}', status="incomplete"), "c", "status", [], id="incomplete"
    ),
    pytest.param(
        lookup({"order_id": "1042", "include_lines": True, "refund": True}),
        "call_200",
        "arguments_schema",
        [
            {"path": "/order_id", "reason": "pattern", "expected": "^[A-Z]-\\d{4}$"},
            {"path": "/refund", "reason": "additionalProperties", "expected": False},
        ],
        id="lookup-pattern-and-extra",
    ),
    pytest.param(
        lookup({"order_id": "A-1042", "include_lines": True}), "call_200", None, [], id="lookup-ok"
    ),
    pytest.param(
        lookup({"order_id": "A-1042"}),
        "call_200",
        "arguments_schema",
        [
            {
                "path": "/include_lines",
                "reason": "required",
                "expected": ["order_id", "include_lines"],
            }
        ],
        id="lookup-required",
    ),
]


@pytest.mark.parametrize(("paired", "call_id", "reason", "fail"), EXAMPLES)
def test_article_examples(
    paired: dict[str, Any], call_id: str, reason: str | None, fail: list[dict[str, str]]
) -> None:
    verdict = inspect({"input": [paired, article_output(call_id)], "tools": TOOLS}, Policy())
    if reason is None:
        assert verdict.outcome == "forward"
        assert verdict.findings == ()
        return
    assert verdict.outcome == "block"
    [finding] = verdict.findings
    assert finding.as_dict(include_arguments=False)["reason"] == reason
    assert finding.index == 1
    assert finding.paired_index == 0
    assert finding.call_id == call_id
    if reason == "arguments_schema":
        assert sorted(finding.as_dict()["fail"], key=str) == sorted(fail, key=str)
