"""The Agents SDK through the proxy: a model's recoverable mistake (a call that breaks the
tool's schema) stays recoverable with `rewrite`, over HTTP and WebSocket, and the tool's result
for the bad call never reaches the upstream; with `block` the run fails as it always did."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

import pytest
from agents import (
    Agent,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
    responses_websocket_session,
    set_tracing_disabled,
)
from agents.models.openai_responses import ResponsesWebSocketError
from openai import AsyncOpenAI, BadRequestError
from pydantic import Field

from tests.fixture_types import ProxyFactory
from tests.servers import second_try
from tests.servers.second_try import FINAL_TEXT, SecondTryUpstream

KEY = "sk-agents"


@pytest.fixture(autouse=True)
def _no_tracing() -> Iterator[None]:
    """The SDK would export its traces to a hosted service: never, here."""
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


@pytest.fixture
async def upstream() -> AsyncIterator[SecondTryUpstream]:
    async with second_try.serve() as serving:
        yield serving


def agent_with_tool(ran: list[str], model: Any) -> Agent[Any]:
    @function_tool
    def lookup_order(order_id: Annotated[str, Field(pattern=r"^[A-Z]-\d{4}$")]) -> str:
        """Look up an order by its id."""
        ran.append(order_id)
        return f"order {order_id}: shipped"

    return Agent(name="orders", instructions="Look orders up.", tools=[lookup_order], model=model)


async def run_over_http(base: str, ran: list[str]) -> str:
    client = AsyncOpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
    try:
        model = OpenAIResponsesModel(model="m", openai_client=client)
        result = await Runner.run(
            agent_with_tool(ran, model),
            "Where is order 1042?",
            max_turns=5,
            run_config=RunConfig(tracing_disabled=True),
        )
    finally:
        await client.close()
    return str(result.final_output)


async def run_over_websocket(base: str, ran: list[str]) -> str:
    async with responses_websocket_session(api_key=KEY, base_url=base + "/v1") as session:
        result = await session.run(agent_with_tool(ran, "m"), "Where is order 1042?", max_turns=5)
    return str(result.final_output)


RUNS = {"http": run_over_http, "websocket": run_over_websocket}


def tool_outputs(upstream: SecondTryUpstream, transport: str) -> list[Any]:
    """Every tool output the upstream was sent, in order."""
    sent = upstream.requests if transport == "http" else upstream.frames
    seen: list[Any] = []
    for body in sent:
        for item in body.get("input") or []:
            is_output = isinstance(item, dict) and item.get("type") == "function_call_output"
            if is_output and item not in seen:
                seen.append(item)
    return [item["output"] for item in seen]


@pytest.mark.parametrize("transport", list(RUNS))
async def test_rewrite_lets_the_agent_recover(
    upstream: SecondTryUpstream, start_proxy: ProxyFactory, transport: str
) -> None:
    base = await start_proxy(upstream.url, gate={"action": "rewrite"})
    ran: list[str] = []

    final = await RUNS[transport](base, ran)

    assert final == FINAL_TEXT + "order A-1042: shipped"
    assert ran == ["A-1042"]
    told, result = tool_outputs(upstream, transport)
    # The bad call's output reached the upstream only as the gate's failure record.
    record = json.loads(told)
    assert (record["execute"], record["check"], record["reason"]) == (
        False,
        "lookup_order",
        "arguments_schema",
    )
    assert record["fail"] == [
        {"path": "/order_id", "reason": "pattern", "expected": "^[A-Z]-\\d{4}$"},
        {"path": "/refund", "reason": "additionalProperties", "expected": False},
    ]
    assert result == "order A-1042: shipped"


@pytest.mark.parametrize(
    ("transport", "error"),
    [
        pytest.param("http", BadRequestError, id="http"),
        pytest.param("websocket", ResponsesWebSocketError, id="websocket"),
    ],
)
async def test_block_ends_the_run(
    upstream: SecondTryUpstream,
    start_proxy: ProxyFactory,
    transport: str,
    error: type[Exception],
) -> None:
    base = await start_proxy(upstream.url, gate={"action": "block"})
    ran: list[str] = []

    with pytest.raises(error, match="failed the replay gate"):
        await RUNS[transport](base, ran)

    assert ran == []
    assert tool_outputs(upstream, transport) == []
