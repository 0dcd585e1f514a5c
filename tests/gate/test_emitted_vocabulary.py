"""Door 2 speaks the vocabulary: the model's own `mcp_call`s judged against the lists in view,
and every call outside a request's `allowed_tools` counted as `tool_not_allowed`."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.gate.caches import GateCaches
from proxy.gate.emitted import ToolSchemas, emitted_calls, iter_emitted, listed_tools
from proxy.gate.findings import message
from proxy.gate.items import allowed_tools, tool_schemas
from proxy.gate.policy import Policy
from tests.builders import APAC, GLOBAL, TOOLS

SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
LISTED = {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "wiki",
          "tools": [{"name": "ask", "input_schema": SCHEMA}]}  # fmt: skip
SALES = "get_latest_sales_report"


def mcp(arguments: str = '{"q": "x"}', name: str = "ask", label: str = "wiki") -> Any:
    return {"type": "mcp_call", "id": "mcp_1", "server_label": label, "name": name,
            "arguments": arguments, "output": "42"}  # fmt: skip


def function(arguments: str = APAC, name: str = SALES) -> Any:
    return {"type": "function_call", "call_id": "c1", "name": name, "arguments": arguments}


def verdicts(
    *output: Any,
    vendor: str | None = "openai",
    tool_choice: Any = None,
    inputs: Any = (),
    **policy: Any,
) -> list[tuple[int, str]]:
    settings = Policy(vendor=vendor, **policy)
    schemas = ToolSchemas(tool_schemas(TOOLS), settings, GateCaches())
    listed = listed_tools(list(inputs), list(output))
    judged = iter_emitted(
        emitted_calls(list(output)), schemas, listed=listed, allowed=allowed_tools(tool_choice)
    )
    return [(e.index, e.verdict) for e in judged]


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        pytest.param([LISTED, mcp()], [(1, "ok")], id="listed-and-valid"),
        pytest.param([LISTED, mcp('{"q": 1}')], [(1, "arguments_schema")], id="schema"),
        pytest.param([LISTED, mcp('{"q": "x",}')], [(1, "arguments_parse")], id="parse"),
        pytest.param([LISTED, mcp(name="other")], [(1, "unknown_tool")], id="unlisted-tool"),
        # The list of another server is further up the chain: not judged here.
        pytest.param([LISTED, mcp(label="crm")], [], id="server-out-of-view"),
    ],
)
def test_an_emitted_mcp_call_is_judged_by_its_list(output: list[Any], expected: Any) -> None:
    assert verdicts(*output) == expected


def test_a_list_in_the_request_counts() -> None:
    assert verdicts(mcp('{"q": 1}'), inputs=[LISTED]) == [(0, "arguments_schema")]


def test_without_a_vendor_mcp_calls_are_not_judged() -> None:
    assert verdicts(LISTED, mcp('{"q": 1}'), vendor=None) == []


def test_a_pin_wins_over_the_list() -> None:
    pinned = {"wiki/ask": {"type": "object", "properties": {"q": {"type": "integer"}}}}
    assert verdicts(LISTED, mcp('{"q": 1}'), tools=pinned) == [(1, "ok")]


@pytest.mark.parametrize(
    ("tool_choice", "expected"),
    [
        pytest.param(None, [(0, "ok"), (2, "ok")], id="no-restriction"),
        pytest.param("required", [(0, "ok"), (2, "ok")], id="not-allowed-tools"),
        pytest.param(
            {
                "type": "allowed_tools",
                "mode": "auto",
                "tools": [
                    {"type": "function", "name": SALES},
                    {"type": "mcp", "server_label": "wiki"},
                ],
            },
            [(0, "ok"), (2, "ok")],
            id="both-allowed",
        ),
        pytest.param(
            {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "mcp", "server_label": "wiki"}],
            },
            [(0, "tool_not_allowed"), (2, "ok")],
            id="function-outside",
        ),
        pytest.param(
            {
                "type": "allowed_tools",
                "allowed_tools": {
                    "mode": "auto",
                    "tools": [{"type": "function", "function": {"name": SALES}}],
                },
            },
            [(0, "ok"), (2, "tool_not_allowed")],
            id="chat-shape-mcp-outside",
        ),
    ],
)
def test_a_call_outside_allowed_tools(tool_choice: Any, expected: Any) -> None:
    assert verdicts(function(), LISTED, mcp(), tool_choice=tool_choice) == expected


def test_not_allowed_wins_over_the_arguments_and_is_said() -> None:
    choice = {"type": "allowed_tools", "tools": [{"type": "function", "name": "pick"}]}
    settings = Policy(vendor="openai")
    schemas = ToolSchemas(tool_schemas(TOOLS), settings, GateCaches())
    [judged] = iter_emitted(
        emitted_calls([function(GLOBAL)]), schemas, allowed=allowed_tools(choice)
    )
    assert judged.verdict == "tool_not_allowed"
    assert judged.finding is not None
    assert message(judged.finding) == (
        f"the model called {SALES}, outside the tools the request's tool_choice allowed "
        "(allowed_tools)"
    )
