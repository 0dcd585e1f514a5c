"""Fixtures of the hostile tests: tight deadlines, a client that pools nothing, raw upstreams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from tests.builders import BUDGET_S, DEADLINE_S
from tests.fixture_types import ProxyFactory
from tests.servers.wire import Behaviour, RawUpstream


@pytest.fixture
def tight_proxy(start_proxy: ProxyFactory) -> ProxyFactory:
    """Like `start_proxy`, with read deadlines of DEADLINE_S and a validation budget of BUDGET_S."""
    tight = {
        "gate": {"validation_timeout_s": BUDGET_S},
        "listen": {"header_timeout_s": DEADLINE_S},
        "limits": {"body_timeout_s": DEADLINE_S},
    }

    async def start(upstream: str, /, **sections: Any) -> str:
        for name, settings in tight.items():
            sections[name] = settings | sections.get(name, {})
        return await start_proxy(upstream, **sections)

    return start


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    # A connection per request: nothing pooled on the client's side skews the count of open
    # descriptors, and no request lands on a connection a short deadline has just closed.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        yield session


@pytest.fixture
async def raw_upstream() -> AsyncIterator[Callable[[Behaviour], Awaitable[RawUpstream]]]:
    servers: list[asyncio.Server] = []

    async def start(first: Behaviour) -> RawUpstream:
        upstream = RawUpstream(first)
        server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        upstream.url = f"http://127.0.0.1:{port}"
        return upstream

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()
