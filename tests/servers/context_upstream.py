"""A scripted upstream that keeps the spec's context: previous input + output + this input.

It stores every response it makes (its input, references and compaction items resolved, and its
output), resolves `item_reference`s, answers `background: true` with `queued` and the finished
response on `GET /v1/responses/{id}` (JSON or `stream=true` SSE), compacts on
`/v1/responses/compact`, and speaks the same over a WebSocket. It is strict as a real server is:
a `function_call_output` that answers no call in its context is a 400, so a follow-up that pairs
here direct is one the proxy must pair too.

The model: after a `function_call_output` it says `tool said: <output>`; after a user message,
with a function tool offered, it calls the first one (arguments from `metadata.arguments`, else
`{"region":"apac"}`); otherwise it says `hello`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

Item = dict[str, Any]


@dataclass
class ContextUpstream:
    url: str = ""
    # response id -> (its context: input and output, the response object)
    responses: dict[str, tuple[list[Item], dict[str, Any]]] = field(default_factory=dict)
    items: dict[str, Item] = field(default_factory=dict)
    compactions: dict[str, list[Item]] = field(default_factory=dict)
    counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    # every request body it received, in order
    received: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/responses", self.create)
        app.router.add_post("/v1/responses/compact", self.compact)
        app.router.add_get("/v1/responses/{response_id}", self.read)
        return app

    def context_of(self, body: dict[str, Any]) -> list[Item] | str:
        """The items this request's model sees, or why the request is invalid."""
        context: list[Item] = []
        previous = body.get("previous_response_id")
        if previous is not None:
            if previous not in self.responses:
                return f"previous response {previous} not found"
            context += self.responses[previous][0]
        raw = body.get("input") or []
        given = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
        for item in given:
            if item.get("type") == "item_reference":
                if item["id"] not in self.items:
                    return f"item {item['id']} not found"
                context.append(self.items[item["id"]])
            elif item.get("type") == "compaction":
                context += self.compactions.get(item.get("id", ""), [])
            else:
                context.append(item)
            if item.get("type") == "function_call_output":
                calls = [i for i in context if i.get("type") == "function_call"]
                if not any(c.get("call_id") == item.get("call_id") for c in calls):
                    return f"no function_call in context for call_id {item.get('call_id')}"
        return context

    def model(self, body: dict[str, Any], context: list[Item]) -> list[Item]:
        n = next(self.counter)
        last = context[-1] if context else {}
        tools = [t for t in body.get("tools") or [] if t.get("type") == "function"]
        if last.get("type") == "function_call_output":
            text = f"tool said: {last.get('output')}"
        elif tools and last.get("role") == "user":
            arguments = (body.get("metadata") or {}).get("arguments", '{"region":"apac"}')
            call = {
                "type": "function_call",
                "id": f"fc_{n}",
                "call_id": f"call_{n}",
                "name": tools[0]["name"],
                "arguments": arguments,
                "status": "completed",
            }
            return [call]
        else:
            text = "hello"
        content = [{"type": "output_text", "text": text, "annotations": []}]
        message = {"type": "message", "id": f"msg_{n}", "role": "assistant"}
        return [message | {"status": "completed", "content": content}]

    def respond(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(status, the response or an error body) for one `response.create`."""
        self.received.append(body)
        context = self.context_of(body)
        if isinstance(context, str):
            error = {"type": "invalid_request_error", "code": "invalid", "message": context}
            return 400, {"error": error | {"param": "input"}}
        output = self.model(body, context)
        response_id = f"resp_{next(self.counter)}"
        response = {
            "id": response_id,
            "object": "response",
            "created_at": 0,
            "status": "completed",
            "model": body.get("model", "m"),
            "previous_response_id": body.get("previous_response_id"),
            "output": output,
            "tools": body.get("tools") or [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
        }
        self.responses[response_id] = (context + output, response)
        for item in context + output:
            if isinstance(item.get("id"), str):
                self.items[item["id"]] = item
        if body.get("background"):
            return 200, response | {"status": "queued", "output": [], "background": True}
        return 200, response

    async def create(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        status, answer = self.respond(body)
        if status == 200 and body.get("stream"):
            return await self.stream(request, answer)
        return web.json_response(answer, status=status)

    async def read(self, request: web.Request) -> web.StreamResponse:
        found = self.responses.get(request.match_info["response_id"])
        if found is None:
            error = {"type": "invalid_request_error", "code": "not_found", "message": "no"}
            return web.json_response({"error": error}, status=404)
        if request.query.get("stream") == "true":
            return await self.stream(request, found[1])
        return web.json_response(found[1])

    async def compact(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body)
        context = self.context_of(body)
        if isinstance(context, str):
            error = {"type": "invalid_request_error", "code": "invalid", "message": context}
            return web.json_response({"error": error}, status=400)
        compaction_id = f"cmp_{next(self.counter)}"
        self.compactions[compaction_id] = context
        compaction = {"id": compaction_id, "type": "compaction", "encrypted_content": "opaque"}
        usage = {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}
        return web.json_response(
            {
                "id": f"resp_{next(self.counter)}",
                "object": "response.compaction",
                "created_at": 0,
                "output": [compaction],
                "usage": usage,
            }
        )

    async def stream(self, request: web.Request, response: dict[str, Any]) -> web.StreamResponse:
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await answer.prepare(request)
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": response | {"output": []}}
        ]
        events += [
            {"type": "response.output_item.done", "output_index": i, "item": item}
            for i, item in enumerate(response["output"])
        ]
        events.append({"type": "response.completed", "response": response})
        for n, event in enumerate(events):
            data = json.dumps(event | {"sequence_number": n})
            await answer.write(f"event: {event['type']}\ndata: {data}\n\n".encode())
        await answer.write(b"data: [DONE]\n\n")
        await answer.write_eof()
        return answer


async def serve_context_upstream() -> AsyncIterator[ContextUpstream]:
    upstream = ContextUpstream()
    app = upstream.app()
    app.router.add_get("/v1/responses", websocket_for(upstream))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    upstream.url = str(server.make_url("")).rstrip("/")
    yield upstream
    await server.close()


def websocket_for(upstream: ContextUpstream) -> Any:
    async def websocket(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            body = json.loads(message.data)
            body.pop("type", None)
            status, answer = upstream.respond(body)
            if status != 200:
                await ws.send_json({"type": "error", "status": status, **answer})
            else:
                await ws.send_json({"type": "response.completed", "response": answer})
        return ws

    return websocket
