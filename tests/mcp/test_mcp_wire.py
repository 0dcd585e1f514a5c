"""The MCP door on the wire: JSON-RPC bodies an SDK would not send (arguments that are no
object, batches), a session id presented by another tenant, and the session's end."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.builders import HANG_GUARD_S, POLL_S, audit_records
from tests.fixture_types import ProxyFactory
from tests.servers.mcp_tools import DOTTED, Ran, files_server, serve_mcp, slow_schema_server
from tests.servers.recording import RecordingUpstream

_ACCEPT = "application/json, text/event-stream"


class Wire:
    """A JSON-RPC session opened by hand at `url` with the key `key`."""

    def __init__(self, http: aiohttp.ClientSession, url: str, key: str) -> None:
        self.http, self.url, self.key = http, url, key
        self.session: str | None = None

    def headers(self) -> dict[str, str]:
        given = {"Authorization": f"Bearer {self.key}", "Accept": _ACCEPT}
        if self.session is not None:
            given["Mcp-Session-Id"] = self.session
            given["MCP-Protocol-Version"] = "2025-11-25"
        return given

    async def post(self, message: Any) -> tuple[int, Any]:
        async with self.http.post(self.url, json=message, headers=self.headers()) as answer:
            self.session = answer.headers.get("Mcp-Session-Id", self.session)
            json = answer.content_type == "application/json"
            body = await answer.json() if json else await answer.text()
            return answer.status, body

    async def open(self) -> None:
        await self.post(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "wire", "version": "0"},
                },
            }
        )
        await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        await self.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})


def call(ident: int, arguments: Any) -> dict[str, Any]:
    params = {"name": "get_report", "arguments": arguments}
    return {"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": params}


async def opened(
    start_proxy: ProxyFactory, http: aiohttp.ClientSession, url: str, key: str = "sk-a"
) -> Wire:
    base = await start_proxy("http://127.0.0.1:9", mcp={"servers": {"reports": {"url": url}}})
    wire = Wire(http, f"{base}/mcp/reports", key)
    await wire.open()
    return wire


@pytest.mark.parametrize("arguments", ["{}", ["us"], 3], ids=["string", "array", "number"])
async def test_arguments_that_are_no_object_are_arguments_type(
    reports: tuple[str, Ran], start_proxy: ProxyFactory, http: aiohttp.ClientSession, arguments: Any
) -> None:
    url, ran = reports
    wire = await opened(start_proxy, http, url)
    status, answer = await wire.post(call(7, arguments))
    assert status == 200
    assert answer["id"] == 7
    assert answer["result"]["isError"] is True
    assert answer["result"]["_meta"]["replay-proxy/failure"]["reason"] == "arguments_type"
    [said] = answer["result"]["content"]
    assert "params.arguments must be an object" in said["text"]
    assert ran.calls == []


async def test_a_batch_with_a_refused_call_is_refused_whole(
    reports: tuple[str, Ran], start_proxy: ProxyFactory, http: aiohttp.ClientSession
) -> None:
    url, ran = reports
    wire = await opened(start_proxy, http, url)
    status, answer = await wire.post([call(8, {"region": "us"}), call(9, {"region": "mars"})])
    assert status == 200
    assert answer["id"] is None
    assert answer["error"]["code"] == -32600
    assert [f["param"] for f in answer["error"]["data"]["findings"]] == ["[1].params"]
    assert ran.calls == []


async def test_a_batch_with_an_element_that_is_no_message_is_refused(
    reports: tuple[str, Ran], start_proxy: ProxyFactory, http: aiohttp.ClientSession
) -> None:
    url, ran = reports
    wire = await opened(start_proxy, http, url)
    status, answer = await wire.post([call(8, {"region": "us"}), 5])
    assert status == 200
    assert answer["error"]["code"] == -32600
    assert "batch element 1" in answer["error"]["message"]
    assert ran.calls == []


async def test_another_tenant_with_the_same_session_id_finds_no_list(
    reports: tuple[str, Ran], start_proxy: ProxyFactory, http: aiohttp.ClientSession
) -> None:
    url, ran = reports
    wire = await opened(start_proxy, http, url, "sk-a")
    other = Wire(http, wire.url, "sk-b")
    other.session = wire.session
    _, answer = await other.post(call(3, {"region": "us"}))
    # A tool this tenant never listed: no outputSchema known, the record is structuredContent.
    assert answer["result"]["structuredContent"]["reason"] == "unknown_tool"
    assert (
        "the session's tools/list names no tool get_report"
        in (answer["result"]["structuredContent"]["error"])
    )
    _, mine = await wire.post(call(4, {"region": "us"}))
    assert "isError" not in mine["result"] or mine["result"]["isError"] is False
    assert ran.calls == [("get_report", {"region": "us", "include_lines": False})]


async def test_the_session_ends_with_delete_and_its_list_is_forgotten(
    reports: tuple[str, Ran], start_proxy: ProxyFactory, http: aiohttp.ClientSession
) -> None:
    url, ran = reports
    wire = await opened(start_proxy, http, url)
    async with http.delete(wire.url, headers=wire.headers()) as ended:
        assert ended.status == 200
        assert ended.headers["x-request-id"]
    status, _ = await wire.post({"jsonrpc": "2.0", "id": 5, "method": "tools/list"})
    assert status == 404  # the server's own answer for a session it ended, relayed
    # A call the list named before: the list went with the session, so the call is unknown.
    status, answer = await wire.post(call(6, {"region": "us"}))
    assert status == 200
    assert answer["result"]["structuredContent"]["reason"] == "unknown_tool"
    assert ran.calls == []


async def test_mcp_requests_are_counted_under_their_own_dialect(
    reports: tuple[str, Ran], start_proxy: ProxyFactory, http: aiohttp.ClientSession
) -> None:
    url, _ = reports
    wire = await opened(start_proxy, http, url)
    await wire.post(call(7, {"region": "mars"}))
    async with http.get(wire.url.replace("/mcp/reports", "/-/metrics")) as page:
        text = await page.text()
    counted = [
        line
        for line in text.splitlines()
        if line.startswith("replay_proxy_requests_total{") and 'dialect="mcp"' in line
    ]
    assert any('outcome="rewrite"' in line and 'route="mcp"' in line for line in counted), counted
    assert any('outcome="forward"' in line for line in counted), counted


def tool_call(ident: int, name: str, arguments: Any) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": params}


async def test_a_tool_named_by_mcps_own_rule_is_not_refused_for_its_name(
    start_proxy: ProxyFactory, http: aiohttp.ClientSession
) -> None:
    ran = Ran()
    with serve_mcp(files_server(ran), json_response=True) as url:
        base = await start_proxy("http://127.0.0.1:9", mcp={"servers": {"files": {"url": url}}})
        wire = Wire(http, f"{base}/mcp/files", "sk-a")
        await wire.open()
        _, answer = await wire.post(tool_call(5, DOTTED, {"path": "a.txt"}))
        _, broken = await wire.post(tool_call(6, DOTTED, {}))
    assert answer["result"].get("isError") is not True, answer
    assert ran.calls == [(DOTTED, {"path": "a.txt"})]
    # (MCPServer gives a tool returning str an outputSchema: the record is in `_meta`.)
    assert broken["result"]["_meta"]["replay-proxy/failure"]["reason"] == "arguments_schema"


async def test_a_result_is_held_to_its_output_schema_within_the_validation_time(
    start_proxy: ProxyFactory, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    ran = Ran()
    with serve_mcp(slow_schema_server(ran), json_response=True) as url:
        base = await start_proxy(
            "http://127.0.0.1:9",
            gate={"validation_timeout_s": 0.05},
            mcp={"servers": {"slow": {"url": url}}},
        )
        wire = Wire(http, f"{base}/mcp/slow", "sk-a")
        await wire.open()
        _, answer = await wire.post(tool_call(5, "grep", {}))
        assert answer["result"]["structuredContent"] == {"line": "a" * 40 + "b"}
        # Door 2 runs once the answer has gone out: its record, when it is there.
        for _ in range(int(HANG_GUARD_S / POLL_S)):
            records = audit_records(tmp_path)
            if records:
                break
            await asyncio.sleep(POLL_S)
    assert ran.calls == [("grep", {})]
    [record] = records
    assert record["event"] == "emitted_result_rejected"
    [finding] = record["findings"]
    assert finding["fail"][0]["reason"] == "pattern_timeout"


@pytest.mark.parametrize(
    ("data", "code"),
    [
        pytest.param(b'{"jsonrpc":', "invalid_json", id="cut-short"),
        pytest.param(b'{"jsonrpc":"2.0","jsonrpc":"2.0"}', "invalid_json", id="duplicate-key"),
        pytest.param(b"[]", "invalid_body", id="empty-batch"),
        pytest.param(b"5", "invalid_body", id="no-message"),
    ],
)
async def test_a_body_that_is_no_json_rpc_is_refused_and_never_forwarded(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    http: aiohttp.ClientSession,
    data: bytes,
    code: str,
) -> None:
    server = {"url": f"{recording_upstream.url}/mcp"}
    base = await start_proxy(recording_upstream.url, mcp={"servers": {"tools": server}})
    headers = {"Content-Type": "application/json", "Accept": _ACCEPT}
    async with http.post(f"{base}/mcp/tools", data=data, headers=headers) as answer:
        assert answer.status == 400
        assert (await answer.json())["error"]["code"] == code
    assert recording_upstream.received == []


@pytest.mark.parametrize("path", ["/mcp/report", "/mcp/reports/x", "/mcp/"])
async def test_a_path_under_mcp_that_names_no_server_is_404_and_never_forwarded(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    http: aiohttp.ClientSession,
    path: str,
) -> None:
    # A misspelled server would otherwise reach the model's upstream, its calls unchecked.
    server = {"url": f"{recording_upstream.url}/mcp"}
    base = await start_proxy(recording_upstream.url, mcp={"servers": {"reports": server}})
    headers = {"Authorization": "Bearer sk-a", "Accept": _ACCEPT}
    async with http.post(f"{base}{path}", json=call(1, {}), headers=headers) as answer:
        assert answer.status == 404
        error = (await answer.json())["error"]
    assert error["code"] == "not_found"
    assert path in error["message"]
    assert recording_upstream.received == []


async def test_a_stranger_is_told_401_under_mcp_not_which_servers_exist(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, http: aiohttp.ClientSession
) -> None:
    listed = [{"name": "alice", "key_sha256": hashlib.sha256(b"sk-listed").hexdigest()}]
    server = {"url": f"{recording_upstream.url}/mcp"}
    base = await start_proxy(
        recording_upstream.url, mcp={"servers": {"reports": server}}, clients=listed
    )
    for path in ("/mcp/reports", "/mcp/report"):
        async with http.post(f"{base}{path}", json=call(1, {})) as answer:
            assert answer.status == 401, path
    headers = {"Authorization": "Bearer sk-listed"}
    async with http.post(f"{base}/mcp/report", json=call(1, {}), headers=headers) as answer:
        assert answer.status == 404
    assert recording_upstream.received == []


async def test_with_no_mcp_server_a_path_under_mcp_is_the_upstreams(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, http: aiohttp.ClientSession
) -> None:
    base = await start_proxy(recording_upstream.url)
    async with http.post(f"{base}/mcp/reports", json=call(1, {})) as answer:
        assert answer.status == 200
    [received] = recording_upstream.received
    assert received.target == "/mcp/reports"
