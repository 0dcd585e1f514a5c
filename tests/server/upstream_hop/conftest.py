"""Fixtures of the upstream hop's tests: scripted bare-socket upstreams, a forward proxy."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.server.upstream_hop.exchanges import Wire
from tests.servers.wire import (
    GUARD_S,
    ForwardProxy,
    ScriptedWire,
    Step,
)


@pytest.fixture
async def wire() -> AsyncIterator[Wire]:
    """Start a scripted upstream; `tls` (a server context) makes it an https one."""
    servers: list[tuple[asyncio.Server, ScriptedWire]] = []

    async def start(script: list[Step], tls: ssl.SSLContext | None = None) -> ScriptedWire:
        upstream = ScriptedWire(script)
        server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0, ssl=tls)
        servers.append((server, upstream))
        scheme = "https" if tls else "http"
        upstream.url = f"{scheme}://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return upstream

    yield start
    for server, upstream in servers:
        server.close()
        await upstream.stop()
        await server.wait_closed()


@pytest.fixture
async def forward_proxy() -> AsyncIterator[ForwardProxy]:
    proxy = ForwardProxy()
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    proxy.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    yield proxy
    server.close()
    await proxy.stop()
    await server.wait_closed()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=GUARD_S)) as session:
        yield session
