"""The MCP door with the official Python SDK: its servers on Streamable HTTP, its ClientSession,
direct and through the proxy at /mcp/<name>."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from tests.builders import audit_records
from tests.fixture_types import ProxyFactory
from tests.servers.mcp_tools import Ran, catalog_server, reports_server, serve_mcp


@asynccontextmanager
async def session_at(url: str, key: str = "sk-a") -> AsyncIterator[ClientSession]:
    """The SDK's client session on Streamable HTTP, initialized, presenting `key`."""
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
    async with (
        http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@pytest.fixture(params=[False, True], ids=["sse", "json"])
def reports(request: pytest.FixtureRequest) -> Iterator[tuple[str, Ran]]:
    ran = Ran()
    with serve_mcp(reports_server(ran), json_response=request.param) as url:
        yield url, ran


@pytest.fixture
def catalog() -> Iterator[tuple[str, Ran]]:
    ran = Ran()
    with serve_mcp(catalog_server(ran)) as url:
        yield url, ran


async def proxied(
    start_proxy: ProxyFactory, server: str, ledger: dict[str, Any] | None = None, **mcp: Any
) -> str:
    # The Responses upstream is unused here: only the MCP server is reached.
    base = await start_proxy(
        "http://127.0.0.1:9",
        mcp={"servers": {"reports": {"url": server}}, **mcp},
        ledger=ledger or {},
    )
    return f"{base}/mcp/reports"


@pytest.fixture(params=["memory", "redis"])
def ledger(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The ledger the tool lists are kept in: this process's memory, or a real redis-server."""
    if request.param == "memory":
        return {}
    redis = request.getfixturevalue("redis_server")
    return {"backend": "redis", "url": redis.url, "timeout_s": 1}


def seen(result: Any) -> Any:
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


async def test_a_valid_call_through_the_proxy_is_what_a_direct_client_gets(
    reports: tuple[str, Ran], start_proxy: ProxyFactory
) -> None:
    url, ran = reports
    through = await proxied(start_proxy, url)
    got = []
    for at in (url, through):
        async with session_at(at) as session:
            listed = await session.list_tools()
            called = await session.call_tool("get_report", {"region": "eu"})
            got.append((seen(listed), seen(called)))
    assert got[0] == got[1]
    assert got[1][1]["structuredContent"] == {"region": "eu", "total": 42}
    assert ran.calls == [("get_report", {"region": "eu", "include_lines": False})] * 2


async def test_rewrite_answers_a_call_that_breaks_the_schema_as_a_tool_error(
    reports: tuple[str, Ran], start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    url, ran = reports
    async with session_at(await proxied(start_proxy, url)) as session:
        await session.list_tools()
        result = await session.call_tool("get_report", {"region": "mars", "include_lines": 1})
    assert ran.calls == []  # the server never ran it
    assert result.is_error
    # The tool declares an outputSchema: the record is in `_meta`, not in structuredContent.
    assert result.structured_content is None
    assert result.meta is not None
    record = result.meta["replay-proxy/failure"]
    assert record["success"] is False
    assert record["execute"] is False
    assert record["check"] == "get_report"
    assert record["reason"] == "arguments_schema"
    assert {(f["path"], f["reason"]) for f in record["fail"]} == {
        ("/region", "enum"),
        ("/include_lines", "type"),
    }
    assert [seen(c) for c in result.content] == [{"type": "text", "text": record["error"]}]
    [entry] = audit_records(tmp_path)
    assert entry["transport"] == "mcp"
    assert entry["server"] == "reports"
    assert entry["session"]
    assert entry["action"] == "rewrite"
    assert entry["findings"][0]["reason"] == "arguments_schema"


async def test_block_answers_a_protocol_error_with_the_findings(
    reports: tuple[str, Ran], start_proxy: ProxyFactory
) -> None:
    url, ran = reports
    async with session_at(await proxied(start_proxy, url, action="block")) as session:
        await session.list_tools()
        with pytest.raises(MCPError) as raised:
            await session.call_tool("get_report", {"region": "mars"})
    assert ran.calls == []
    error = raised.value.error
    assert error.code == -32602
    [finding] = error.data["findings"]
    assert finding["reason"] == "arguments_schema"
    assert finding["fail"] == [{"path": "/region", "reason": "enum", "expected": ["us", "eu"]}]


async def test_log_forwards_the_call_and_records_it(
    catalog: tuple[str, Ran], start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    url, ran = catalog
    async with session_at(await proxied(start_proxy, url, action="log")) as session:
        await _list_all(session)
        result = await session.call_tool("get_report", {"region": "mars"})
    # This server checks nothing itself: it ran the call, and the proxy recorded why it fails.
    assert ran.calls == [("get_report", {"region": "mars"})]
    assert not result.is_error
    [entry] = audit_records(tmp_path)
    assert entry["action"] == "log"


async def test_a_tool_never_listed_and_arguments_not_an_object(
    catalog: tuple[str, Ran], start_proxy: ProxyFactory
) -> None:
    url, ran = catalog
    async with session_at(await proxied(start_proxy, url)) as session:
        unlisted = await session.call_tool("get_report", {"region": "us"})
        assert unlisted.is_error
        assert unlisted.structured_content["reason"] == "unknown_tool"
    assert ran.calls == []


async def test_every_page_of_a_paginated_list_is_recorded(
    catalog: tuple[str, Ran], start_proxy: ProxyFactory, ledger: dict[str, Any]
) -> None:
    url, ran = catalog
    async with session_at(await proxied(start_proxy, url, ledger)) as session:
        cursor = None
        names = []
        while True:
            page = await session.list_tools(params=_page(cursor))
            names += [t.name for t in page.tools]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert names == ["get_report", "totals", "swap"]
        # `totals` is only on the second page.
        bad = await session.call_tool("totals", {"bad": "yes"})
        assert bad.is_error
        assert bad.meta is not None
        assert bad.meta["replay-proxy/failure"]["fail"][0]["path"] == "/bad"
    assert ran.calls == []


def _page(cursor: str | None) -> Any:
    import mcp.types as types

    return types.PaginatedRequestParams(cursor=cursor) if cursor is not None else None


async def _list_all(session: ClientSession) -> None:
    cursor = None
    while True:
        page = await session.list_tools(params=_page(cursor))
        cursor = page.next_cursor
        if cursor is None:
            return


async def test_a_changed_list_is_the_one_applied_next(
    catalog: tuple[str, Ran], start_proxy: ProxyFactory, ledger: dict[str, Any]
) -> None:
    url, ran = catalog
    async with session_at(await proxied(start_proxy, url, ledger)) as session:
        await _list_all(session)
        before = await session.call_tool("get_report", {"region": "apac"})
        assert before.structured_content["reason"] == "arguments_schema"
        await session.call_tool("swap", {})  # announces list_changed on the call's own stream
        stale = await session.call_tool("get_report", {"region": "apac"})
        assert stale.structured_content["reason"] == "unknown_tool"
        await _list_all(session)
        after = await session.call_tool("get_report", {"region": "apac"})
        assert not after.is_error
    assert ran.calls == [("swap", {}), ("get_report", {"region": "apac"})]


async def test_two_tenants_never_see_each_others_lists(
    catalog: tuple[str, Ran], start_proxy: ProxyFactory, ledger: dict[str, Any]
) -> None:
    url, ran = catalog
    through = await proxied(start_proxy, url, ledger)
    async with session_at(through, "sk-a") as a, session_at(through, "sk-b") as b:
        await _list_all(a)
        await _list_all(b)
        a_eu = await a.call_tool("get_report", {"region": "eu"})
        b_eu = await b.call_tool("get_report", {"region": "eu"})
        b_us = await b.call_tool("get_report", {"region": "us"})
    assert a_eu.is_error
    assert not b_eu.is_error
    assert b_us.is_error
    assert ran.calls == [("get_report", {"region": "eu"})]


async def test_a_result_that_breaks_its_output_schema_is_audit_records(
    catalog: tuple[str, Ran], start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    url, ran = catalog
    async with session_at(await proxied(start_proxy, url)) as session:
        await _list_all(session)
        with pytest.raises(RuntimeError, match="Invalid structured content"):
            await session.call_tool("totals", {"bad": True})
    assert ran.calls == [("totals", {"bad": True})]
    [entry] = audit_records(tmp_path)
    assert entry["event"] == "emitted_result_rejected"
    assert entry["transport"] == "mcp"
    assert entry["server"] == "reports"
    assert entry["findings"][0]["fail"][0]["path"] == "/total"
