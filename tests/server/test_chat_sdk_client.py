"""The official openai SDK's `chat.completions` with a manual tool loop, plain and streamed,
direct and through the proxy (the matrix is tests/server/chat_loops.py)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from tests.server.chat_loops import (
    KEY,
    MAX_TURNS,
    MODEL,
    TOOLS,
    VALID,
    ChatClientLoops,
    LoopNotEnded,
    lookup_order,
)
from tests.servers import scripted_chat


async def plain_turn(client: AsyncOpenAI, messages: list[Any]) -> dict[str, Any]:
    completion = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    return completion.choices[0].message.model_dump(exclude_none=True)


async def streamed_turn(client: AsyncOpenAI, messages: list[Any]) -> dict[str, Any]:
    """The assistant message assembled from its chunks: content in order, each call's fragments
    under its `index`."""
    stream = await client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, stream=True
    )
    content = ""
    calls: dict[int, dict[str, Any]] = {}
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for part in choice.delta.tool_calls or []:
                call = calls.setdefault(
                    part.index,
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = part.id or call["id"]
                if part.function is not None:
                    call["function"]["name"] += part.function.name or ""
                    call["function"]["arguments"] += part.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


async def manual_loop(base: str, prompt: str, *, stream: bool) -> str:
    client = AsyncOpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": prompt}]
    try:
        for _ in range(MAX_TURNS):
            message = await (streamed_turn if stream else plain_turn)(client, messages)
            messages.append(message)
            if not message.get("tool_calls"):
                return str(message["content"])
            for call in message["tool_calls"]:
                result = lookup_order(json.loads(call["function"]["arguments"]))
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    finally:
        await client.close()
    raise LoopNotEnded(messages)


class TestPlain(ChatClientLoops):
    refused = openai.BadRequestError

    async def run(self, base: str, prompt: str) -> str:
        return await manual_loop(base, prompt, stream=False)


class TestStreamed(ChatClientLoops):
    refused = openai.BadRequestError

    async def run(self, base: str, prompt: str) -> str:
        return await manual_loop(base, prompt, stream=True)


async def test_the_scripted_upstream_refuses_a_tool_message_it_never_saw_called() -> None:
    """The upstream is as strict as a provider: a loop that lost a call is refused."""
    async with scripted_chat.serve() as upstream:
        client = AsyncOpenAI(base_url=upstream.url + "/v1", api_key=KEY, max_retries=0)
        orphan: Any = {"role": "tool", "tool_call_id": "call_9", "content": "order A-1042: shipped"}
        try:
            with pytest.raises(openai.BadRequestError, match="answers no earlier tool call"):
                await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": VALID}, orphan], tools=TOOLS
                )
        finally:
            await client.close()
