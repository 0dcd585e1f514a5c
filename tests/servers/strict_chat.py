"""A strict, model-free Chat Completions upstream (aiohttp), as strict about tool messages as a
real provider: a `role: "tool"` message must answer a `tool_calls` entry of an earlier assistant
message in the same request, every such entry must be answered before the next non-tool message,
and `tool_calls` may not be empty. Otherwise it answers one assistant message: `tool said:
<the last tool message's content>`, or `echo: <the last user text>` (streamed when asked).

Everything it was sent is kept (`requests`) for tests to assert on.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.servers.loopback import serving
from tests.servers.recording import Handler, Received


def refusal(messages: list[Any]) -> str | None:
    """Why a strict server refuses these messages, or None."""
    seen: set[Any] = set()
    waiting: set[Any] = set()
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in seen:
                return f"messages[{i}]: tool message answers no earlier tool call ({call_id!r})"
            waiting.discard(call_id)
            continue
        if waiting:
            return f"messages[{i}]: tool calls {sorted(waiting)} are not answered"
        if role not in ("system", "developer", "user", "assistant"):
            return f"messages[{i}]: not a Chat Completions message"
        calls = message.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list) or not calls:
                return f"messages[{i}].tool_calls: must be a non-empty array"
            ids = {c.get("id") for c in calls if isinstance(c, dict)}
            seen |= ids
            waiting |= ids
    return None


def refused_answer(body: dict[str, Any]) -> web.Response | None:
    """The 400 a strict server answers a body with, or None when it takes it."""
    messages = body.get("messages")
    why = refusal(messages) if isinstance(messages, list) else "messages: required"
    if why is None:
        return None
    error = {"type": "invalid_request_error", "code": None, "message": why, "param": None}
    return web.json_response({"error": error}, status=400)


def completion(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
    }


@dataclass
class StrictChat:
    """The upstream's state: every body it was sent."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if (refused := refused_answer(body)) is not None:
            return refused
        messages = body["messages"]
        tools = [m for m in messages if m.get("role") == "tool"]
        users = [m for m in messages if m.get("role") == "user"]
        if tools:
            text = f"tool said: {tools[-1].get('content')}"
        else:
            text = f"echo: {users[-1].get('content') if users else ''}"
        if not body.get("stream"):
            return web.json_response(completion(text))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(stream_of(completion(text)))
        await response.write_eof()
        return response


@contextlib.asynccontextmanager
async def serving_chat(
    handle: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[str]:
    """`handle` answering `POST /v1/chat/completions` on a free loopback port: its base URL."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    async with serving(app) as url:
        yield url


@contextlib.asynccontextmanager
async def serve() -> AsyncIterator[StrictChat]:
    upstream = StrictChat()
    async with serving_chat(upstream.handle) as upstream.url:
        yield upstream


def tool_completion(
    *calls: dict[str, Any], finish_reason: str = "tool_calls", completion_id: str = "chatcmpl-2"
) -> dict[str, Any]:
    """A completion whose one choice makes these `tool_calls` and ends with `finish_reason`."""
    message = {"role": "assistant", "content": None, "tool_calls": list(calls)}
    return {
        **completion(""),
        "id": completion_id,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }


def stream_of(answer: dict[str, Any]) -> bytes:
    """The SSE stream of a completion as OpenAI sends it: a role chunk, then each call's
    fragments by `index` (its id, type and name first, its arguments in two pieces), then the
    choice's end, then `data: [DONE]`."""

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        data = {
            "id": answer["id"],
            "object": "chat.completion.chunk",
            "created": 0,
            "model": answer["model"],
            "choices": [choice],
        }
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

    [choice] = answer["choices"]
    parts = [chunk({"role": "assistant", "content": None})]
    if choice["message"].get("content"):
        parts.append(chunk({"content": choice["message"]["content"]}))
    for i, call in enumerate(choice["message"].get("tool_calls") or ()):
        function = call["function"]
        head = {"name": function["name"], "arguments": ""}
        parts.append(
            chunk(
                {
                    "tool_calls": [
                        {"index": i, "id": call["id"], "type": call["type"], "function": head}
                    ]
                }
            )
        )
        arguments = function["arguments"]
        half = len(arguments) // 2
        for piece in (arguments[:half], arguments[half:]):
            parts.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
    parts.append(chunk({}, choice["finish_reason"]))
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def answering(answer: dict[str, Any]) -> Handler:
    """A recording upstream's handler: `answer` as JSON, or as its stream when asked for one."""

    async def handle(request: web.Request, received: Received) -> web.StreamResponse:
        if not received.json().get("stream"):
            return web.json_response(answer)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(stream_of(answer))
        await response.write_eof()
        return response

    return handle
