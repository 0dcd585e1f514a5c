"""A recording upstream on aiohttp's server: every request kept exactly as it arrived."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDict


@dataclass
class Received:
    """One request exactly as the upstream saw it."""

    method: str
    target: str
    headers: CIMultiDict[str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Handler = Callable[[web.Request, Received], Awaitable[web.StreamResponse]]


# The response every request is answered with, unless a test gives another handler.
ANSWER = {"object": "response", "id": "resp_1", "output": []}


async def _ok(request: web.Request, received: Received) -> web.StreamResponse:
    return web.json_response(ANSWER)


def _turn_completed(request: web.Request, turn: int) -> list[str]:
    response = {"id": f"resp_ws_{turn}", "object": "response", "output": []}
    return [json.dumps({"type": "response.completed", "response": response})]


def held_stream(release: asyncio.Event, tail: bytes = b"") -> Handler:
    """A handler that streams one event (`data: one`), holds the answer open until `release`
    is set, then sends `tail` and ends it: a stream in flight, for as long as a test needs."""

    async def stream(request: web.Request, received: Received) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: one\n\n")
        await release.wait()
        if tail:
            await response.write(tail)
        await response.write_eof()
        return response

    return stream


@dataclass
class RecordingUpstream:
    """A tiny upstream that records every request and answers with `handler`."""

    received: list[Received] = field(default_factory=list)
    handler: Handler = _ok
    url: str = ""
    frames: list[str] = field(default_factory=list)
    # WebSocket upgrades asked of it.
    upgrades: int = 0
    # The frames that answer the `turn`th frame of a WebSocket opened by this upgrade request.
    answer_frame: Callable[[web.Request, int], list[str]] = _turn_completed

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self.websocket(request)
        received = Received(
            request.method, request.raw_path, CIMultiDict(request.headers), await request.read()
        )
        self.received.append(received)
        return await self.handler(request, received)

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        """Records every text frame; answers each with `answer_frame`'s frames (by default a
        completed response naming its turn)."""
        self.upgrades += 1
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            self.frames.append(message.data)
            for frame in self.answer_frame(request, len(self.frames)):
                await ws.send_str(frame)
        return ws
