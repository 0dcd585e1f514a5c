"""The reference hop: a bare aiohttp pass-through (one shared session, chunk streaming, no parsing).

`python bench/passthrough.py --upstream URL --port P [--uvloop]`. What any aiohttp proxy pays
before it does anything with a request: the floor replay-proxy's forwarding is compared with.
Its client session is the one replay-proxy makes for its upstream (`proxy.server.upstream.Upstream`,
default settings), so that the two differ only in what the proxy does with a request.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from proxy.server.headers import HOP_BY_HOP as RELAYED_NEVER
from proxy.server.upstream import Upstream
from proxy.settings import UpstreamSettings

SESSION = web.AppKey("session", aiohttp.ClientSession)
BASE = web.AppKey("base", str)
# What a server that reads the whole body (the floor) accepts: more than any benchmark body.
MAX_BODY = 64 * 1024 * 1024

# RFC 9110 §7.6.1's hop-by-hop headers, and the Host the client session sets itself.
HOP_BY_HOP = RELAYED_NEVER | {"host"}


def end_to_end(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP)


async def forward(request: web.Request) -> web.StreamResponse:
    return await relay(request, request.content if request.body_exists else None)


async def relay(request: web.Request, data: object) -> web.StreamResponse:
    """Send `request` upstream with `data` as its body and stream the answer back as it comes."""
    session = request.app[SESSION]
    async with session.request(
        request.method,
        URL(request.app[BASE] + request.raw_path, encoded=True),
        headers=end_to_end(request.headers),
        data=data,
        allow_redirects=False,
    ) as upstream:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        response.headers.update(end_to_end(upstream.headers))
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(upstream: str, handler: Handler = forward) -> web.Application:
    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        hop = Upstream(UpstreamSettings(url=upstream))
        await hop.start()
        app[SESSION] = hop.session
        yield
        await hop.close()

    app = web.Application(handler_args={"auto_decompress": False}, client_max_size=MAX_BODY)
    app[BASE] = upstream.rstrip("/")
    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", handler)
    return app


def main() -> int:
    return serve(__doc__, forward)


def serve(doc: str | None, handler: Handler) -> int:
    """The command of a reference server: `--upstream URL --port P [--uvloop]`."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--upstream", required=True, help="base URL of the upstream")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--uvloop", action="store_true", help="serve on uvloop's event loop")
    args = parser.parse_args()
    loop = None
    if args.uvloop:
        import uvloop

        loop = uvloop.new_event_loop()
    web.run_app(
        make_app(args.upstream, handler),
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        print=None,
        loop=loop,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
