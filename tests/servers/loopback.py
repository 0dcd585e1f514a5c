"""One app served on a free loopback port, in the running event loop, for as long as needed."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.test_utils import TestServer


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """`app` served on 127.0.0.1, a free port: its base URL, without a trailing slash."""
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()
