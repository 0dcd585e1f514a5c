"""Where a call's schema is declared: namespaces, deferred tools, tools added by input items;
and pins, which still win (a namespaced tool pinned by its bare name too)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.gate import items
from proxy.gate.arguments import pending_schemas
from proxy.gate.caches import GateCaches
from proxy.gate.emitted import ToolSchemas, iter_emitted
from proxy.gate.policy import Policy
from proxy.gate.verdict import inspect
from tests.builders import SALES_SCHEMA, SALES_TOOL, USER, request, sales_call, sales_output

OPEN = {"type": "object"}
NAMESPACE = {"type": "namespace", "name": "crm", "description": "", "tools": [SALES_TOOL]}
LOOSE_TOP = SALES_TOOL | {"parameters": OPEN}


def namespaced(region: str, namespace: Any = "crm") -> dict[str, Any]:
    return sales_call("c1", region) | {"namespace": namespace}


# (the request's tools, the call, policy settings, the reason or None)
FOUND = [
    pytest.param([NAMESPACE], namespaced("apac"), {}, None, id="in-namespace"),
    pytest.param([NAMESPACE], namespaced("mars"), {}, "arguments_schema", id="broken"),
    # The namespace is part of the name: a top-level tool of the same name is another tool.
    pytest.param([LOOSE_TOP, NAMESPACE], namespaced("mars"), {}, "arguments_schema", id="ns-wins"),
    pytest.param([NAMESPACE], sales_call("c1"), {}, "unknown_tool", id="call-without-namespace"),
    pytest.param([LOOSE_TOP], namespaced("apac", "erp"), {}, "unknown_tool", id="other-namespace"),
    pytest.param([LOOSE_TOP], namespaced("mars", ""), {}, None, id="empty-namespace-is-none"),
    pytest.param([LOOSE_TOP], namespaced("mars", 5), {}, None, id="namespace-not-a-string"),
    # A pin still wins, by its namespaced name or by the bare one.
    pytest.param(
        [NAMESPACE | {"tools": [LOOSE_TOP]}],
        namespaced("mars"),
        {"tools": {"get_latest_sales_report": SALES_SCHEMA}},
        "arguments_schema",
        id="bare-pin",
    ),
    pytest.param(
        [NAMESPACE | {"tools": [LOOSE_TOP]}],
        namespaced("mars"),
        {"tools": {"crm/get_latest_sales_report": SALES_SCHEMA}},
        "arguments_schema",
        id="namespaced-pin",
    ),
    pytest.param(
        [NAMESPACE],
        namespaced("mars"),
        {"tools": {"crm/get_latest_sales_report": OPEN}},
        None,
        id="namespaced-pin-first",
    ),
]


@pytest.mark.parametrize(("tools", "call", "settings", "reason"), FOUND)
def test_where_the_schema_is_found(
    tools: list[Any], call: dict[str, Any], settings: dict[str, Any], reason: str | None
) -> None:
    body = request(USER, call, sales_output("c1"), tools=tools)
    verdict = inspect(body, Policy(**settings))
    assert [f.reason for f in verdict.findings] == ([reason] if reason else [])


def test_tools_added_by_items_are_declared() -> None:
    added = {"type": "additional_tools", "role": "developer", "tools": [NAMESPACE]}
    searched = {"type": "tool_search_output", "call_id": "t", "tools": [LOOSE_TOP]}
    body = request(USER, added, searched, {"type": "message", "tools": [SALES_TOOL]}, tools=[])
    assert items.declared_tools(body) == [
        ("crm/get_latest_sales_report", SALES_SCHEMA),
        ("get_latest_sales_report", OPEN),
    ]


def test_namespaced_schemas_are_compiled_off_the_loop() -> None:
    body = request(USER, namespaced("apac"), sales_output("c1"), tools=[NAMESPACE])
    assert pending_schemas(body, Policy(), GateCaches.for_policy(Policy())) == [SALES_SCHEMA]


def test_door_two_judges_a_namespaced_call_by_its_namespace() -> None:
    policy = Policy()
    schemas = ToolSchemas(items.tool_schemas([NAMESPACE]), policy, GateCaches.for_policy(policy))
    calls = [(0, namespaced("mars")), (1, namespaced("apac"))]
    assert [e.verdict for e in iter_emitted(calls, schemas)] == ["arguments_schema", "ok"]
