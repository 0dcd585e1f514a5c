"""The MCP sessions' tool lists in a Redis ledger: two proxies sharing one real redis-server (as
the workers of `serve --workers 2` do) see the same session's list, whichever relayed its
`tools/list`; a store that cannot be read is the proxy's fault, answered 503 with a JSON-RPC
error."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
import pytest

from tests.fixture_types import ProxyFactory
from tests.mcp.test_mcp_door import session_at
from tests.mcp.test_mcp_wire import Wire, call
from tests.server.checks import metric
from tests.servers.mcp_tools import Ran, reports_server, serve_mcp
from tests.servers.redis_server import RedisServer


async def two_proxies(start_proxy: ProxyFactory, redis: RedisServer, url: str) -> list[str]:
    """Two proxies on one Redis ledger, each serving the MCP server at `url`."""
    ledger = {"backend": "redis", "url": redis.url, "timeout_s": 1}
    servers = {"servers": {"reports": {"url": url}}}
    return [
        f"{await start_proxy('http://127.0.0.1:9', ledger=ledger, mcp=servers)}/mcp/reports"
        for _ in range(2)
    ]


@dataclass
class Pair:
    """A session opened (initialized, its tools listed) through the first proxy."""

    wire: Wire
    second: str
    ran: Ran

    def through_second(self, key: str | None = None) -> Wire:
        """The same session through the second proxy (presenting `key`, else its own)."""
        other = Wire(self.wire.http, self.second, key or self.wire.key)
        other.session = self.wire.session
        return other


@pytest.fixture
async def pair(
    reports: tuple[str, Ran],
    start_proxy: ProxyFactory,
    redis_server: RedisServer,
    http: aiohttp.ClientSession,
) -> Pair:
    url, ran = reports
    first, second = await two_proxies(start_proxy, redis_server, url)
    wire = Wire(http, first, "sk-a")
    await wire.open()
    return Pair(wire, second, ran)


async def test_a_session_listed_through_one_proxy_is_gated_through_the_other(pair: Pair) -> None:
    other = pair.through_second()
    status, valid = await other.post(call(2, {"region": "eu"}))
    assert status == 200
    assert valid["result"]["structuredContent"] == {"region": "eu", "total": 42}
    status, failing = await other.post(call(3, {"region": "mars"}))
    assert status == 200
    rewritten = failing["result"]
    assert rewritten["isError"] is True
    record = rewritten["_meta"]["replay-proxy/failure"]
    assert record["reason"] == "arguments_schema"
    assert record["fail"][0]["path"] == "/region"
    assert pair.ran.calls == [("get_report", {"region": "eu", "include_lines": False})]
    # Another tenant naming the same session finds no list, in the shared store too.
    _, unknown = await pair.through_second("sk-b").post(call(4, {"region": "eu"}))
    assert unknown["result"]["structuredContent"]["reason"] == "unknown_tool"
    assert len(pair.ran.calls) == 1


async def test_a_session_ended_through_one_proxy_has_no_list_on_the_other(
    pair: Pair, http: aiohttp.ClientSession
) -> None:
    async with http.delete(pair.second, headers=pair.wire.headers()) as ended:
        assert ended.status == 200
    status, answer = await pair.wire.post(call(2, {"region": "eu"}))
    assert status == 200
    assert answer["result"]["structuredContent"]["reason"] == "unknown_tool"
    assert pair.ran.calls == []


async def test_a_store_that_cannot_be_read_is_a_503_in_json_rpc_terms(
    pair: Pair, redis_server: RedisServer, http: aiohttp.ClientSession
) -> None:
    redis_server.stop()
    status, answer = await pair.wire.post(call(2, {"region": "eu"}))
    assert status == 503
    assert answer["jsonrpc"] == "2.0"
    assert answer["id"] is None
    assert answer["error"]["code"] == -32603
    assert answer["error"]["data"] == {"type": "server_error", "code": "ledger_unavailable"}
    assert pair.ran.calls == []  # never forwarded unjudged
    # A message that calls no tool needs no list: it goes as before.
    status, _ = await pair.wire.post({"jsonrpc": "2.0", "id": 3, "method": "ping"})
    assert status == 200
    async with http.get(pair.wire.url.replace("/mcp/reports", "/-/metrics")) as page:
        text = await page.text()
    labels = {"route": "mcp", "outcome": "ledger_unavailable", "dialect": "mcp"}
    assert metric(text, "replay_proxy_requests_total", upstream="mcp:reports", **labels) == 1
    assert metric(text, "replay_proxy_ledger_faults_total", operation="read") == 1


async def test_the_python_sdk_raises_the_ledger_fault_as_its_error(
    start_proxy: ProxyFactory, redis_server: RedisServer
) -> None:
    from mcp.shared.exceptions import MCPError

    ran = Ran()
    with serve_mcp(reports_server(ran)) as url:
        first, _ = await two_proxies(start_proxy, redis_server, url)
        async with session_at(first) as session:
            await session.list_tools()
            redis_server.stop()
            with pytest.raises(MCPError) as raised:
                await session.call_tool("get_report", {"region": "eu"})
    assert raised.value.error.code == -32603
    assert "could not read its record" in raised.value.error.message
    assert ran.calls == []
