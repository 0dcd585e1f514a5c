"""LiteLLM's `completion()` with a manual tool loop, the loopback upstream given as an
OpenAI-compatible `api_base`, direct and through the proxy (the matrix is
tests/server/chat_loops.py). `completion()` blocks: it runs in a thread, since the proxy under
test serves on the test's event loop."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

# LiteLLM fetches its model price list from the network when imported, unless told not to.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import litellm
import pytest
from litellm.exceptions import BadRequestError
from openai import OpenAI

from tests.server.chat_loops import (
    KEY,
    MAX_TURNS,
    MODEL,
    TOOLS,
    ChatClientLoops,
    LoopNotEnded,
    lookup_order,
)

# LiteLLM imports a provider module of its own on the first completion, and pydantic warns of it.
pytestmark = pytest.mark.filterwarnings("ignore:Items? .* `ReadOnly` qualifier:UserWarning")


def tool_loop(base: str, prompt: str) -> str:
    # LiteLLM would keep a client of its own per base URL in a process-wide cache, its
    # connections open until the interpreter exits: this one is closed when the loop ends.
    with OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0) as client:
        return loop_with(client, base, prompt)


def loop_with(client: OpenAI, base: str, prompt: str) -> str:
    messages: list[Any] = [{"role": "user", "content": prompt}]
    for _ in range(MAX_TURNS):
        response = litellm.completion(
            model=f"openai/{MODEL}",
            api_base=base + "/v1",
            api_key=KEY,
            messages=messages,
            tools=TOOLS,
            max_retries=0,
            client=client,
        )
        message = response.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            return str(message.content)
        for call in message.tool_calls:
            result = lookup_order(json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    raise LoopNotEnded(messages)


class TestLiteLLM(ChatClientLoops):
    refused = BadRequestError

    async def run(self, base: str, prompt: str) -> str:
        return await asyncio.to_thread(tool_loop, base, prompt)
