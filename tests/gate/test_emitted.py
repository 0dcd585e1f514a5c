"""Door 2: each function_call of a response's output judged as it would be replayed."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.gate.caches import GateCaches
from proxy.gate.emitted import ToolSchemas, emitted_calls, iter_emitted
from proxy.gate.items import tool_schemas
from proxy.gate.policy import Policy
from proxy.gate.verdict import inspect
from tests.builders import APAC, GLOBAL, SALES_SCHEMA, TOOLS, message, output, tool, without
from tests.builders import call as replayed_call

ENUM_FAIL = [{"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}]
LOOSE = tool({"type": "object"})
PINNED = Policy(tools={"get_latest_sales_report": SALES_SCHEMA})


def emitted(arguments: Any = APAC, name: Any = "get_latest_sales_report", **extra: Any) -> Any:
    """A call as a model emits it in a response's output (no `status` needed)."""
    return without(replayed_call("call_1", arguments, name), "status") | extra


@pytest.mark.parametrize(
    ("item", "tools", "policy", "verdict", "fail"),
    [
        pytest.param(emitted(), TOOLS, Policy(), "ok", None, id="passes"),
        pytest.param(emitted(GLOBAL), TOOLS, Policy(), "arguments_schema", ENUM_FAIL, id="enum"),
        pytest.param(
            emitted('{"region":"apac","refund":1}'),
            TOOLS,
            Policy(),
            "arguments_schema",
            [{"path": "/refund", "reason": "additionalProperties", "expected": False}],
            id="extra-property",
        ),
        pytest.param(
            emitted("{}"),
            TOOLS,
            Policy(),
            "arguments_schema",
            [{"path": "/region", "reason": "required", "expected": ["region"]}],
            id="required",
        ),
        pytest.param(
            emitted({"region": "apac"}),
            TOOLS,
            Policy(),
            "arguments_type",
            None,
            id="arguments-not-a-string",
        ),
        pytest.param(emitted(None), TOOLS, Policy(), "arguments_type", None, id="no-arguments"),
        pytest.param(
            emitted('{"region":"apac","region":"emea"}'),
            TOOLS,
            Policy(),
            "arguments_parse",
            None,
            id="duplicate-key",
        ),
        pytest.param(
            emitted('{"region":"apac"} x'),
            TOOLS,
            Policy(),
            "arguments_parse",
            None,
            id="trailing-data",
        ),
        pytest.param(emitted('{"n":NaN}'), TOOLS, Policy(), "arguments_parse", None, id="nan"),
        pytest.param(
            emitted(name="send_refund"),
            TOOLS,
            Policy(),
            "unknown_tool",
            None,
            id="tool-not-offered",
        ),
        pytest.param(emitted(), [], Policy(), "unknown_tool", None, id="no-tools-no-pin"),
        pytest.param(emitted(name=None), TOOLS, Policy(), "unknown_tool", None, id="no-name"),
        pytest.param(
            emitted(name=["x"]), TOOLS, Policy(), "unknown_tool", None, id="name-not-a-string"
        ),
        pytest.param(emitted(GLOBAL), [], PINNED, "arguments_schema", ENUM_FAIL, id="pinned-only"),
        pytest.param(
            emitted(GLOBAL),
            [LOOSE],
            PINNED,
            "arguments_schema",
            ENUM_FAIL,
            id="pinned-wins-over-looser-tool",
        ),
        pytest.param(emitted(GLOBAL), [LOOSE], Policy(), "ok", None, id="request-tool-loose"),
        pytest.param(
            emitted(status="in_progress"), TOOLS, Policy(), "ok", None, id="status-not-judged"
        ),
        pytest.param(
            emitted(GLOBAL),
            [tool(SALES_SCHEMA), LOOSE],
            Policy(),
            "arguments_schema",
            ENUM_FAIL,
            id="every-tool-of-the-name",
        ),
    ],
)
def test_an_emitted_call_gets_the_gates_verdict(
    item: dict[str, Any],
    tools: list[Any],
    policy: Policy,
    verdict: str,
    fail: list[dict[str, Any]] | None,
) -> None:
    caches = GateCaches.for_policy(policy)
    offered = tool_schemas(tools)
    [found] = iter_emitted(
        emitted_calls([message("hi"), item]), ToolSchemas(offered, policy, caches)
    )

    assert found.index == 1
    assert found.verdict == verdict
    if verdict == "ok":
        assert found.finding is None
        return
    assert found.finding is not None
    record = found.finding.as_dict()
    assert record["index"] == 1
    assert record["paired_index"] is None
    assert record["reason"] == verdict
    assert record["call_id"] == "call_1"
    assert found.finding.action == "log"
    if fail is not None:
        assert record["fail"] == fail


@pytest.mark.parametrize(
    ("item", "tools", "policy"),
    [
        pytest.param(emitted(GLOBAL), TOOLS, Policy(), id="enum"),
        pytest.param(emitted('{"region":"apac","region":"emea"}'), TOOLS, Policy(), id="parse"),
        pytest.param(emitted(name="send_refund"), TOOLS, Policy(), id="unknown-tool"),
        pytest.param(emitted(GLOBAL), [LOOSE], PINNED, id="pinned"),
        pytest.param(emitted(), TOOLS, Policy(), id="ok"),
    ],
)
def test_the_verdict_is_the_one_its_replay_gets(
    item: dict[str, Any], tools: list[Any], policy: Policy
) -> None:
    caches = GateCaches.for_policy(policy)
    [found] = iter_emitted(emitted_calls([item]), ToolSchemas(tool_schemas(tools), policy, caches))
    cached = len(caches.verdicts)

    replay = {"tools": tools, "input": [item | {"status": "completed"}, output("call_1")]}
    verdict = inspect(replay, policy, caches=caches)

    reasons: list[str] = [f.reason for f in verdict.findings] or ["ok"]
    assert reasons == [found.verdict]
    if found.finding is not None:
        assert verdict.findings[0].fail == found.finding.fail
    # The replay found the verdict the emitted call left in the shared cache.
    assert len(caches.verdicts) == cached


@pytest.mark.parametrize(
    ("output_value", "indices"),
    [
        pytest.param([emitted(), message("x"), emitted(GLOBAL)], [0, 2], id="calls-among-others"),
        pytest.param([message("x")], [], id="no-calls"),
        pytest.param("not a list", [], id="output-not-a-list"),
        pytest.param(None, [], id="no-output"),
        pytest.param([1, "x", None, ["function_call"]], [], id="not-objects"),
        pytest.param([{"type": "acme:function_call"}], [], id="vendor-type"),
        pytest.param([{"type": "function_call"}], [0], id="bare-call"),
        pytest.param(
            [{"type": "function_call", "name": {"a": 1}, "arguments": []}], [0], id="odd-fields"
        ),
    ],
)
def test_the_calls_of_an_output(output_value: Any, indices: list[int]) -> None:
    calls = emitted_calls(output_value)
    assert [i for i, _ in calls] == indices
    # Whatever they hold, judging them never raises.
    schemas = ToolSchemas(tool_schemas(TOOLS), Policy(), GateCaches())
    schemas.pending(calls)
    list(iter_emitted(calls, schemas))


def test_only_uncompiled_request_schemas_of_called_tools_are_pending() -> None:
    caches = GateCaches()
    other = tool({"type": "object", "required": ["x"]}, name="other")
    offered = tool_schemas([*TOOLS, other])
    calls = emitted_calls([emitted()])

    schemas = ToolSchemas(offered, Policy(), caches)

    assert schemas.pending(calls) == [SALES_SCHEMA]
    assert ToolSchemas(offered, PINNED, caches).pending(calls) == []
    list(iter_emitted(calls, schemas))
    assert schemas.pending(calls) == []
    # Compiled once, found again by a lookup of the same tools.
    assert ToolSchemas(offered, Policy(), caches).pending(calls) == []
