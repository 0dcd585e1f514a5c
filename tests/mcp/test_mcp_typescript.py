"""The MCP TypeScript SDK's client (Node), unchanged, direct and through the MCP door: one valid
call, and one that breaks the schema (a tool error from the proxy, the server never reached)."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixture_types import ProxyFactory
from tests.servers.mcp_tools import Ran, reports_server, serve_mcp

PROJECT = Path(__file__).resolve().parents[1] / "clients" / "mcp"
INSTALL = "npm ci --prefix tests/clients/mcp"


async def calls(url: str) -> dict[str, Any]:
    """What the TypeScript client got at `url` (see tests/clients/mcp/calls.mjs)."""
    node = shutil.which("node")
    if node is None:
        pytest.fail(f"node is not installed (it runs the MCP TypeScript client; then: {INSTALL})")
    if not (PROJECT / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        pytest.fail(f"the MCP TypeScript client is not installed: run `{INSTALL}`")
    # Run without blocking the event loop: the proxy under test serves on this same loop.
    process = await asyncio.create_subprocess_exec(
        node,
        str(PROJECT / "calls.mjs"),
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode(errors="replace")
    found: dict[str, Any] = json.loads(out)
    return found


@pytest.fixture
def reports() -> Iterator[tuple[str, Ran]]:
    ran = Ran()
    with serve_mcp(reports_server(ran)) as url:
        yield url, ran


async def test_the_typescript_client_direct_and_through_the_proxy(
    reports: tuple[str, Ran], start_proxy: ProxyFactory
) -> None:
    url, ran = reports
    direct = await calls(url)
    assert len(ran.calls) == 1  # the server itself refused the failing call without running it
    base = await start_proxy("http://127.0.0.1:9", mcp={"servers": {"reports": {"url": url}}})
    through = await calls(f"{base}/mcp/reports")
    assert through["tools"] == direct["tools"] == ["get_report"]
    assert through["valid"] == direct["valid"]
    assert through["valid"]["structuredContent"] == {"region": "eu", "total": 42}
    failing = through["failing"]
    assert failing["isError"] is True
    # The tool declares an outputSchema, which this SDK holds any structuredContent to: the
    # record is in `_meta`.
    assert "structuredContent" not in failing
    record = failing["_meta"]["replay-proxy/failure"]
    assert record["reason"] == "arguments_schema"
    assert record["fail"][0]["path"] == "/region"
    assert failing["content"] == [{"type": "text", "text": record["error"]}]
    assert len(ran.calls) == 2  # only the valid call reached the server
