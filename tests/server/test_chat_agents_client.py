"""The Agents SDK on Chat Completions (`OpenAIChatCompletionsModel`), direct and through the
proxy (the matrix is tests/server/chat_loops.py). The SDK checks a call's arguments against its
tool before running it: a breaking call is not run, and its result is the SDK's error text."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

import openai
import pytest
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from pydantic import Field

from tests.server.chat_loops import (
    DESCRIPTION,
    KEY,
    MAX_TURNS,
    MODEL,
    ChatClientLoops,
    lookup_order,
)
from tests.servers.second_try import TOOL


@pytest.fixture(autouse=True)
def _no_tracing() -> Iterator[None]:
    """The SDK would export its traces to a hosted service: never, here."""
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


@function_tool(name_override=TOOL, description_override=DESCRIPTION)
def lookup_order_tool(order_id: Annotated[str, Field(pattern=r"^[A-Z]-\d{4}$")]) -> str:
    return lookup_order({"order_id": order_id})


class TestAgentsSDK(ChatClientLoops):
    refused = openai.BadRequestError

    async def run(self, base: str, prompt: str) -> str:
        client = AsyncOpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
        try:
            agent: Agent[Any] = Agent(
                name="orders",
                instructions="Look orders up.",
                tools=[lookup_order_tool],
                model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
            )
            result = await Runner.run(
                agent, prompt, max_turns=MAX_TURNS, run_config=RunConfig(tracing_disabled=True)
            )
        finally:
            await client.close()
        return str(result.final_output)
