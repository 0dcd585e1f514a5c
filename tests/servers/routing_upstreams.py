"""Upstreams that route a request target the way real servers do, and record where it went.

`strict` is aiohttp's own router, the way an aiohttp server is usually written. `lax` routes the
way many frameworks and path-normalising front ends do: it decodes every escape (`%2F` too)
before routing, reads `\\` as `/`, drops `;params`, folds case, merges slashes, resolves dot
segments and ignores a trailing slash. Both record every request and answer with the route it
reached: 200 and `{"routed": "/v1/responses"}` on a gated route, 404 and `{"routed": null}`
elsewhere. WebSocket upgrades are recorded the same way, then accepted.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from tests.servers.loopback import serving

GATED_ROUTES = ("/v1/responses", "/v1/responses/compact", "/responses", "/responses/compact")


@dataclass(frozen=True)
class Served:
    """One request as the upstream routed it."""

    method: str
    target: str
    routed: str | None
    body: bytes


@dataclass
class RoutingUpstream:
    kind: str
    served: list[Served] = field(default_factory=list)
    url: str = ""

    async def answer(self, request: web.Request, routed: str | None) -> web.StreamResponse:
        self.served.append(Served(request.method, request.raw_path, routed, await request.read()))
        if request.headers.get("Upgrade", "").lower() == "websocket":
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            async for _ in ws:
                pass
            return ws
        answer: dict[str, Any] = {"object": "response", "id": "resp_1", "routed": routed}
        return web.json_response(answer, status=200 if routed else 404)


def lax_route(raw_target: str) -> str:
    """The path a lax server routes this raw target to."""
    target = raw_target.partition("#")[0].partition("?")[0]
    if "://" in target:
        target = "/" + target.partition("://")[2].partition("/")[2]
    path = re.sub(r";[^/]*", "", unquote(target).replace("\\", "/")).lower()
    out: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if out:
                out.pop()
        elif segment not in ("", "."):
            out.append(segment)
    return "/" + "/".join(out)


def _strict_app(upstream: RoutingUpstream) -> web.Application:
    def answer_as(routed: str | None) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await upstream.answer(request, routed)

        return handle

    app = web.Application(handler_args={"auto_decompress": False})
    for route in GATED_ROUTES:
        app.router.add_route("*", route, answer_as(route))
    app.router.add_route("*", "/{tail:.*}", answer_as(None))
    return app


def _lax_app(upstream: RoutingUpstream) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        routed = lax_route(request.raw_path)
        return await upstream.answer(request, routed if routed in GATED_ROUTES else None)

    app = web.Application(handler_args={"auto_decompress": False})
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


@asynccontextmanager
async def serve_routing_upstream(kind: str) -> AsyncIterator[RoutingUpstream]:
    """A `strict` or `lax` upstream on a free loopback port."""
    upstream = RoutingUpstream(kind)
    app = _strict_app(upstream) if kind == "strict" else _lax_app(upstream)
    async with serving(app) as upstream.url:
        yield upstream
