"""The reference hop: a bare aiohttp pass-through (one shared session, chunk streaming, no parsing).

`python bench/passthrough.py --upstream URL --port P`. What any aiohttp proxy pays before it
does anything with a request: the floor replay-proxy's forwarding is compared with.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

SESSION = web.AppKey("session", aiohttp.ClientSession)
BASE = web.AppKey("base", str)

# RFC 9110 §7.6.1
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-authenticate",
        "proxy-authorization",
        "host",
    }
)


def end_to_end(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP)


async def forward(request: web.Request) -> web.StreamResponse:
    session = request.app[SESSION]
    async with session.request(
        request.method,
        URL(request.app[BASE] + request.raw_path, encoded=True),
        headers=end_to_end(request.headers),
        data=request.content if request.body_exists else None,
        allow_redirects=False,
    ) as upstream:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        response.headers.update(end_to_end(upstream.headers))
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


def make_app(upstream: str) -> web.Application:
    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        app[SESSION] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            auto_decompress=False,
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600),
        )
        yield
        await app[SESSION].close()

    app = web.Application(handler_args={"auto_decompress": False})
    app[BASE] = upstream.rstrip("/")
    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream", required=True, help="base URL of the upstream")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(
        make_app(args.upstream), host="127.0.0.1", port=args.port, access_log=None, print=None
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
