"""A strict, model-free Open Responses upstream (aiohttp): HTTP JSON, SSE and WebSocket, enough
for the official compliance suite, and as strict about pairing as a real provider.

- A turn whose `function_call_output` answers no call in its context (the `previous_response_id`
  chain's input and output, then this input, compaction items included) fails: HTTP 400, or a
  WebSocket error event.
- `store: false` responses live only in the WebSocket connection that made them; a failed
  continuation evicts its `previous_response_id` from that connection, as the spec says, and a
  later turn naming it gets `previous_response_not_found`.
- The model: with function tools offered and no tool output in the newest input, one
  `function_call` of the first tool (arguments `{}` unless the tool is the sales report's);
  otherwise one assistant message, `tool said: <output>` or `echo: <last user text>`.
- `/v1/responses/compact` returns one `compaction` item that carries the compacted items in
  its (here not encrypted) `encrypted_content`, so a later turn pairs against them.

Everything it was sent is kept (`requests`, `frames`, `closes`) for tests to assert on.

Run it for the compliance suite::

    python -m tests.servers.strict_upstream --port 8124
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import itertools
import json
import re
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.servers.loopback import serving

Item = dict[str, Any]
Event = dict[str, Any]


class TurnFailed(Exception):
    """A turn the upstream refuses: an API error with its status."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param

    def error(self) -> dict[str, Any]:
        return {
            "type": "invalid_request_error",
            "code": self.code,
            "message": self.message,
            "param": self.param,
        }


@dataclass
class Stored:
    """A response as a later turn continues it: its whole context (input + output so far)."""

    context: list[Item]


@dataclass
class StrictUpstream:
    """The upstream's state: stored responses, and what it was sent."""

    url: str = ""
    stored: dict[str, Stored] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)  # HTTP bodies, parsed
    frames: list[dict[str, Any]] = field(default_factory=list)  # WebSocket frames, parsed
    closes: list[tuple[int | None, str]] = field(default_factory=list)  # clients' close frames
    _ids: Iterator[int] = field(default_factory=itertools.count)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_strict_{next(self._ids)}"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 26)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/responses", self.websocket)
        app.router.add_post("/v1/responses", self.create)
        app.router.add_post("/v1/responses/compact", self.compact)
        return app

    async def health(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "ok"})

    # -- HTTP --------------------------------------------------------------------------------

    async def create(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _json_body(request)
            self.requests.append(body)
            response, events = self.turn(body, {})
        except TurnFailed as failed:
            return web.json_response({"error": failed.error()}, status=failed.status)
        if not body.get("stream"):
            return web.json_response(response)
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await answer.prepare(request)
        for event in events:
            data = json.dumps(event, separators=(",", ":"))
            await answer.write(f"event: {event['type']}\ndata: {data}\n\n".encode())
        await answer.write(b"data: [DONE]\n\n")
        await answer.write_eof()
        return answer

    async def compact(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _json_body(request)
            self.requests.append(body)
            _model(body)
            context = self.context(body, {})
        except TurnFailed as failed:
            return web.json_response({"error": failed.error()}, status=failed.status)
        packed = base64.b64encode(json.dumps(context).encode()).decode()
        item = {"type": "compaction", "id": self.new_id("cmp"), "encrypted_content": packed}
        return web.json_response(
            {
                "id": self.new_id("resp"),
                "object": "response.compaction",
                "output": [item],
                "created_at": int(time.time()),
                "usage": _usage(),
            }
        )

    # -- WebSocket ---------------------------------------------------------------------------

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        # This connection's cache: its `store: false` responses.
        cache: dict[str, Stored] = {}
        while True:
            message = await ws.receive()
            if message.type == web.WSMsgType.CLOSE:
                self.closes.append((message.data, message.extra or ""))
                break
            if message.type != web.WSMsgType.TEXT:
                break
            body: Any = None
            try:
                body = json.loads(message.data)
                if not isinstance(body, dict):
                    raise TurnFailed(400, "invalid_json", "a frame must be a JSON object")
                self.frames.append(body)
                _, events = self.turn(body, cache)
            except (TurnFailed, ValueError) as exc:
                failed = exc if isinstance(exc, TurnFailed) else _unreadable()
                named = body.get("previous_response_id") if isinstance(body, dict) else None
                if isinstance(named, str):
                    cache.pop(named, None)
                event = {"type": "error", "status": failed.status, "error": failed.error()}
                await ws.send_json(event)
                continue
            for event in events:
                await ws.send_json(event)
        return ws

    # -- the model ---------------------------------------------------------------------------

    def context(self, body: dict[str, Any], cache: dict[str, Stored]) -> list[Item]:
        """The turn's whole context, every tool output checked against the calls before it."""
        named = body.get("previous_response_id")
        context: list[Item] = []
        if named is not None:
            found = cache.get(named) or self.stored.get(named)
            if found is None:
                raise TurnFailed(
                    400,
                    "previous_response_not_found",
                    f"Previous response with id '{named}' not found.",
                    "previous_response_id",
                )
            context = list(found.context)
        for index, item in enumerate(_input_items(body.get("input"))):
            context.extend(self.expand(item, index))
        calls: set[str] = set()
        for index, item in enumerate(context):
            if item.get("type") == "function_call":
                calls.add(str(item.get("call_id")))
            elif item.get("type") == "function_call_output" and item.get("call_id") not in calls:
                raise TurnFailed(
                    400,
                    "invalid_request_error",
                    f"No tool call found for function call output with call_id "
                    f"{item.get('call_id')!r} (context item {index}).",
                    "input",
                )
        return context

    def expand(self, item: Item, index: int) -> list[Item]:
        """An input item as the items it stands for (a compaction item: what it compacted)."""
        if item.get("type") == "compaction":
            try:
                packed = base64.b64decode(str(item.get("encrypted_content")), validate=True)
                compacted = json.loads(packed)
            except ValueError:
                raise TurnFailed(400, "invalid_compaction", "unreadable compaction item") from None
            return list(compacted)
        if item.get("type") == "item_reference":
            for stored in self.stored.values():
                for known in stored.context:
                    if known.get("id") == item.get("id"):
                        return [known]
            raise TurnFailed(400, "item_not_found", f"Item {item.get('id')!r} not found.")
        return [item]

    def turn(self, body: dict[str, Any], cache: dict[str, Stored]) -> tuple[Event, list[Event]]:
        """The response to a create body and the streaming events that make it."""
        model = _model(body)
        context = self.context(body, cache)
        tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
        output = [self.answer(body, context, tools)]
        response = _resource(self.new_id("resp"), model, body, tools)
        stored = Stored([*context, *output])
        if body.get("store", True) is False:
            cache[response["id"]] = stored
        else:
            self.stored[response["id"]] = stored
        return _finished(response, output), list(_events(response, output))

    def answer(self, body: dict[str, Any], context: list[Item], tools: list[Item]) -> Item:
        newest = _input_items(body.get("input"))
        outputs = [i for i in newest if i.get("type") == "function_call_output"]
        functions = [t for t in tools if t.get("type") == "function"]
        if functions and not outputs and body.get("tool_choice") != "none":
            name = str(functions[0].get("name"))
            arguments = '{"region":"apac"}' if name == "get_latest_sales_report" else "{}"
            return {
                "type": "function_call",
                "id": self.new_id("fc"),
                "call_id": self.new_id("call"),
                "name": name,
                "arguments": arguments,
                "status": "completed",
            }
        if outputs:
            text = "\n".join(f"tool said: {_text(o.get('output'))}" for o in outputs)
        else:
            text = f"echo: {_last_user_text(context)}"
        return {
            "type": "message",
            "id": self.new_id("msg"),
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.read())
    except ValueError:
        raise _unreadable() from None
    if not isinstance(body, dict):
        raise _unreadable()
    return body


def _unreadable() -> TurnFailed:
    return TurnFailed(400, "invalid_json", "the body is not a JSON object")


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise TurnFailed(400, "missing_required_parameter", "Missing required parameter: 'model'.")
    return model


def _input_items(value: Any) -> list[Item]:
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, dict)]


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(str(p.get("text", "")) for p in value if isinstance(p, dict))
    return json.dumps(value)


def _last_user_text(context: list[Item]) -> str:
    for item in reversed(context):
        if item.get("role") == "user":
            return _text(item.get("content"))
    return ""


def _usage() -> dict[str, Any]:
    return {
        "input_tokens": 1,
        "output_tokens": 1,
        "total_tokens": 2,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


def _resource(id_: str, model: str, body: dict[str, Any], tools: list[Item]) -> Event:
    """A response resource in progress, every field the spec requires."""
    return {
        "id": id_,
        "object": "response",
        "created_at": int(time.time()),
        "completed_at": None,
        "status": "in_progress",
        "incomplete_details": None,
        "model": model,
        "previous_response_id": body.get("previous_response_id"),
        "instructions": body.get("instructions"),
        "output": [],
        "error": None,
        "tools": [
            {
                "type": "function",
                "name": t.get("name"),
                "description": t.get("description"),
                "parameters": t.get("parameters"),
                "strict": t.get("strict"),
            }
            for t in tools
            if t.get("type") == "function"
        ],
        "tool_choice": "auto",
        "truncation": "disabled",
        "parallel_tool_calls": True,
        "text": {"format": {"type": "text"}},
        "top_p": 1,
        "presence_penalty": 0,
        "frequency_penalty": 0,
        "top_logprobs": 0,
        "temperature": 1,
        "reasoning": None,
        "usage": None,
        "max_output_tokens": None,
        "max_tool_calls": None,
        "store": body.get("store", True) is not False,
        "background": False,
        "service_tier": "default",
        "metadata": {},
        "safety_identifier": None,
        "prompt_cache_key": body.get("prompt_cache_key"),
    }


def _finished(response: Event, output: list[Item]) -> Event:
    return response | {
        "status": "completed",
        "completed_at": int(time.time()),
        "output": output,
        "usage": _usage(),
    }


def _events(response: Event, output: list[Item]) -> Iterator[Event]:
    """The streaming events of a response, numbered."""
    sequence = itertools.count()

    def event(type_: str, **fields: Any) -> Event:
        return {"type": type_, "sequence_number": next(sequence), **fields}

    yield event("response.created", response=response)
    yield event("response.in_progress", response=response)
    for index, item in enumerate(output):
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            yield event(
                "response.output_item.added",
                output_index=index,
                item=item | {"status": "in_progress", "arguments": ""},
            )
            yield event("response.function_call_arguments.delta", **where, delta=item["arguments"])
            yield event(
                "response.function_call_arguments.done", **where, arguments=item["arguments"]
            )
        else:
            text = item["content"][0]["text"]
            yield event(
                "response.output_item.added",
                output_index=index,
                item=item | {"status": "in_progress", "content": []},
            )
            empty = {"type": "output_text", "text": "", "annotations": []}
            yield event("response.content_part.added", **where, content_index=0, part=empty)
            for chunk in re.findall(r"\S+\s*|\s+", text):
                yield event("response.output_text.delta", **where, content_index=0, delta=chunk)
            yield event("response.output_text.done", **where, content_index=0, text=text)
            yield event(
                "response.content_part.done", **where, content_index=0, part=item["content"][0]
            )
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=_finished(response, output))


@contextlib.asynccontextmanager
async def serve() -> AsyncIterator[StrictUpstream]:
    """A strict upstream on a free loopback port, in the running event loop."""
    upstream = StrictUpstream()
    async with serving(upstream.app()) as upstream.url:
        yield upstream


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8124)
    args = parser.parse_args(argv)
    web.run_app(StrictUpstream().app(), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
