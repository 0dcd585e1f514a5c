"""LangChain's `ChatOpenAI` in Chat Completions mode, the tool bound with `bind_tools`, a
manual tool loop, direct and through the proxy (the matrix is tests/server/chat_loops.py)."""

from __future__ import annotations

from typing import Any

import openai
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI

from tests.server.chat_loops import (
    DESCRIPTION,
    KEY,
    MAX_TURNS,
    MODEL,
    ChatClientLoops,
    LoopNotEnded,
    lookup_order,
)
from tests.servers.scripted_chat import ORDER_SCHEMA
from tests.servers.second_try import TOOL

# The tool as a JSON Schema with a title and a description: bind_tools' own dict form.
ORDER_TOOL: dict[str, Any] = {"title": TOOL, "description": DESCRIPTION} | ORDER_SCHEMA


class TestLangChain(ChatClientLoops):
    refused = openai.BadRequestError

    async def run(self, base: str, prompt: str) -> str:
        llm = ChatOpenAI(
            model=MODEL,
            base_url=base + "/v1",
            api_key=KEY,  # type: ignore[arg-type]
            max_retries=0,
            use_responses_api=False,
        ).bind_tools([ORDER_TOOL])
        messages: list[BaseMessage] = [HumanMessage(prompt)]
        for _ in range(MAX_TURNS):
            answer = await llm.ainvoke(messages)
            assert isinstance(answer, AIMessage)
            messages.append(answer)
            if not answer.tool_calls:
                return answer.text
            for call in answer.tool_calls:
                messages.append(ToolMessage(lookup_order(call["args"]), tool_call_id=call["id"]))
        raise LoopNotEnded(messages)
