"""A scripted, model-free Chat Completions upstream for real clients' tool loops, as strict about
tool messages as tests/servers/strict_chat.py (a tool message whose call it never saw is refused).

Its model is the recoverable one of tests/servers/second_try.py, in Chat terms, for a request
that declares tools:

* no tool message since the last other message -> one `lookup_order` call: valid arguments
  (`{"order_id":"A-1042"}`) when the last user text names order `A-1042`, else arguments that
  break the tool's schema (`{"order_id":"1042","refund":true}`);
* tool messages at the end, one of them a failure record (JSON with `"execute": false`) -> the
  call again, with valid arguments;
* tool messages at the end, none a failure record -> `done: <their contents, joined by "; ">`.

Without tools it answers `echo: <the last user text>`. With `stream: true` the same answer comes
as SSE chunks (content in pieces, a call's `arguments` in fragments under its `index`, a usage
chunk when `stream_options.include_usage`, then `data: [DONE]`). Every body is kept (`requests`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.servers.second_try import BAD_ARGUMENTS, FINAL_TEXT, GOOD_ARGUMENTS, TOOL, told_why
from tests.servers.strict_chat import refused_answer, serving_chat

ORDER = "A-1042"
# What the model answers once the valid call's result comes back.
VALID_ANSWER = f"{FINAL_TEXT}order {ORDER}: shipped"
# The tool's schema, as each client declares it.
ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"order_id": {"type": "string", "pattern": r"^[A-Z]-\d{4}$"}},
    "required": ["order_id"],
    "additionalProperties": False,
}

Message = dict[str, Any]


def text_of(content: Any) -> str:
    """A message's text: its string content, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _pieces(text: str, size: int = 7) -> Iterator[str]:
    """`text` in a few pieces, so that a client assembles what it is streamed."""
    yield from (text[i : i + size] for i in range(0, len(text), size))


@dataclass
class ScriptedChat:
    """The upstream's state: every body it was sent, and the ids of the calls it made."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def tool_messages(self) -> list[str]:
        """Every distinct tool message content it was sent, in order (a client resends the
        whole history every turn)."""
        seen: list[str] = []
        for body in self.requests:
            for message in body.get("messages") or []:
                content = text_of(message.get("content"))
                if message.get("role") == "tool" and content not in seen:
                    seen.append(content)
        return seen

    def answer(self, body: dict[str, Any]) -> Message:
        """The model's next assistant message for these messages."""
        messages = body["messages"]
        if not body.get("tools"):
            users = [m for m in messages if m.get("role") == "user"]
            return {"role": "assistant", "content": f"echo: {text_of(users[-1]['content'])}"}
        trailing: list[str] = []
        for message in reversed(messages):
            if message.get("role") != "tool":
                break
            trailing.insert(0, text_of(message.get("content")))
        if not trailing:
            users = [text_of(m.get("content")) for m in messages if m.get("role") == "user"]
            return self.call(GOOD_ARGUMENTS if users and ORDER in users[-1] else BAD_ARGUMENTS)
        if any(told_why(content) for content in trailing):
            return self.call(GOOD_ARGUMENTS)
        return {"role": "assistant", "content": FINAL_TEXT + "; ".join(trailing)}

    def call(self, arguments: str) -> Message:
        entry = {
            "id": f"call_{next(self._ids)}",
            "type": "function",
            "function": {"name": TOOL, "arguments": arguments},
        }
        return {"role": "assistant", "content": None, "tool_calls": [entry]}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if (refused := refused_answer(body)) is not None:
            return refused
        message = self.answer(body)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        if body.get("stream"):
            return await self.stream(request, body, message, finish)
        choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        return web.json_response(
            _envelope(body, "chat.completion", choices=[choice], usage=_usage(body, message))
        )

    async def stream(
        self, request: web.Request, body: dict[str, Any], message: Message, finish: str
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def send(chunk: dict[str, Any]) -> None:
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")

        def delta(part: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": part, "finish_reason": finish_reason, "logprobs": None}
            return _envelope(body, "chat.completion.chunk", choices=[choice])

        await send(delta({"role": "assistant", "content": ""}))
        for index, entry in enumerate(message.get("tool_calls") or []):
            function = {"name": entry["function"]["name"], "arguments": ""}
            head = {"index": index, "id": entry["id"], "type": "function", "function": function}
            await send(delta({"tool_calls": [head]}))
            for fragment in _pieces(entry["function"]["arguments"]):
                part = {"index": index, "function": {"arguments": fragment}}
                await send(delta({"tool_calls": [part]}))
        for piece in _pieces(message.get("content") or ""):
            await send(delta({"content": piece}))
        await send(delta({}, finish))
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            await send(
                _envelope(body, "chat.completion.chunk", choices=[], usage=_usage(body, message))
            )
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _envelope(body: dict[str, Any], kind: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted",
        "object": kind,
        "created": 0,
        "model": body.get("model"),
    } | fields


def _usage(body: dict[str, Any], message: Message) -> dict[str, int]:
    """Word counts for tokens: enough for a client that reads usage."""
    asked = sum(len(text_of(m.get("content")).split()) for m in body["messages"])
    said = len(json.dumps(message).split())
    return {"prompt_tokens": asked, "completion_tokens": said, "total_tokens": asked + said}


@contextlib.asynccontextmanager
async def serve() -> AsyncIterator[ScriptedChat]:
    """The upstream on a free loopback port, in the running event loop."""
    upstream = ScriptedChat()
    async with serving_chat(upstream.handle) as upstream.url:
        yield upstream
