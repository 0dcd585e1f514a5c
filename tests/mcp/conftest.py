"""Fixtures of the MCP door's tests: a server answering in JSON, and an HTTP client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from tests.servers.mcp_tools import Ran, reports_server, serve_mcp


@pytest.fixture
def reports() -> Iterator[tuple[str, Ran]]:
    """The reports server answering in JSON, and what it ran."""
    ran = Ran()
    with serve_mcp(reports_server(ran), json_response=True) as url:
        yield url, ran


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
