"""Every answer names its request: `x-request-id` is the proxy's id, the one in the audit
record and the log; the proxy's own 5xx say who failed and keep the details in the log."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.running.workers import free_port
from tests.builders import (
    HANG_GUARD_S,
    JSON_HEADERS,
    SALES_TOOL,
    USER,
    audit_records,
    sales_call,
    sales_output,
)
from tests.fixture_types import Clients, ProxyFactory
from tests.servers.recording import Received, RecordingUpstream

ID = re.compile(r"req_[0-9a-f]{32}")
UPSTREAM_ID = "req_from_the_upstream"
LISTED = [{"name": "alice", "key_sha256": hashlib.sha256(b"sk-listed-client").hexdigest()}]


def body(*items: Any) -> dict[str, Any]:
    return {"model": "m", "tools": [SALES_TOOL], "input": [USER, *items]}


CLEAN = body(sales_call("call_1"), sales_output("call_1"))
FAILING = body(sales_call("call_1", "mars"), sales_output("call_1"))


async def answer_with_an_id(request: web.Request, received: Received) -> web.StreamResponse:
    return web.json_response(
        {"object": "response", "id": "resp_1", "output": []}, headers={"x-request-id": UPSTREAM_ID}
    )


@dataclass(frozen=True)
class Case:
    """One request, and what the proxy must answer it with."""

    method: str
    target: str
    status: int
    data: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    sections: dict[str, Any] = field(default_factory=dict)
    relayed: bool = False  # the upstream answered it (its own id then moves aside)
    audited: bool = False
    unreachable: bool = False


CASES = [
    pytest.param(Case("GET", "/v1/models", 200, relayed=True), id="pass-through"),
    pytest.param(
        Case("POST", "/v1/responses", 200, json.dumps(CLEAN).encode(), JSON_HEADERS, relayed=True),
        id="gated-forward",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/responses",
            200,
            json.dumps(FAILING).encode(),
            JSON_HEADERS,
            {"gate": {"action": "log"}},
            relayed=True,
            audited=True,
        ),
        id="logged-forward",
    ),
    pytest.param(
        Case(
            "POST", "/v1/responses", 400, json.dumps(FAILING).encode(), JSON_HEADERS, audited=True
        ),
        id="blocked",
    ),
    pytest.param(Case("POST", "/v1/responses", 415, b"{}"), id="own-4xx"),
    pytest.param(
        Case(
            "POST",
            "/v1/responses",
            413,
            b'{"input": "' + b"a" * 100 + b'"}',
            JSON_HEADERS,
            {"limits": {"max_body_bytes": 64}},
        ),
        id="too-large",
    ),
    pytest.param(
        Case("GET", "/v1/models", 401, sections={"clients": LISTED}),
        id="unauthorized",
    ),
    pytest.param(
        Case("POST", "/v1/other", 400, b"x", {"Connection": "content-type"}),
        id="connection-names-a-body-header",
    ),
    pytest.param(Case("GET", "/v1/models", 502, unreachable=True), id="unreachable"),
    pytest.param(Case("GET", "/v1/models%zz", 400), id="invalid-target"),
    pytest.param(Case("GET", "/-/ready-or-not", 404), id="own-namespace"),
    pytest.param(Case("GET", "/-/healthy", 200), id="healthy"),
    pytest.param(Case("GET", "/-/metrics", 200), id="metrics"),
    # aiohttp answers an expectation it does not know before any handler runs.
    pytest.param(
        Case("POST", "/v1/other", 417, b"x", {"Expect": "the-unexpected"}), id="expectation-failed"
    ),
]


@pytest.mark.parametrize("case", CASES)
async def test_every_answer_carries_the_proxys_request_id(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    case: Case,
) -> None:
    recording_upstream.handler = answer_with_an_id
    upstream = (
        f"http://127.0.0.1:{free_port('127.0.0.1')}" if case.unreachable else recording_upstream.url
    )
    base = await start_proxy(upstream, **case.sections)
    seen = []
    async with aiohttp.ClientSession() as client:
        for _ in range(2):
            async with client.request(
                case.method,
                URL(base + case.target, encoded=True),
                data=case.data,
                headers=case.headers,
                skip_auto_headers={"Content-Type"},
            ) as resp:
                assert resp.status == case.status
                payload = await resp.read()
                seen.append((resp.headers.copy(), payload))

    (headers, payload), (again, _) = seen
    request_id = headers["x-request-id"]
    assert ID.fullmatch(request_id)
    assert again["x-request-id"] != request_id  # one id per request
    assert headers.getall("x-request-id") == [request_id]
    if case.relayed:
        assert headers.getall("x-upstream-request-id") == [UPSTREAM_ID]
    else:
        assert "x-upstream-request-id" not in headers
    records = audit_records(tmp_path)
    if case.audited:
        assert [r["request_id"] for r in records] == [request_id, again["x-request-id"]]
    else:
        assert records == []
    if case.status == 400 and case.audited:
        assert json.loads(payload)["error"]["request_id"] == request_id


async def test_the_sdk_matches_a_blocked_request_to_its_audit_record(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client_for: Clients,
    tmp_path: Path,
) -> None:
    client = client_for(await start_proxy(recording_upstream.url))

    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(**FAILING)

    error = raised.value
    [record] = audit_records(tmp_path)
    assert error.response.headers["x-request-id"] == record["request_id"]
    assert error.request_id == record["request_id"]
    assert isinstance(error.body, dict)
    assert error.body["request_id"] == record["request_id"]
    assert recording_upstream.received == []


async def test_the_sdk_sees_the_proxys_id_and_the_upstreams_aside(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client_for: Clients,
    tmp_path: Path,
) -> None:
    async def models(request: web.Request, received: Received) -> web.StreamResponse:
        return web.json_response(
            {"object": "list", "data": []}, headers={"x-request-id": UPSTREAM_ID}
        )

    recording_upstream.handler = models
    client = client_for(await start_proxy(recording_upstream.url, gate={"action": "log"}))

    listed = await client.models.with_raw_response.list()
    recording_upstream.handler = answer_with_an_id
    created = await client.responses.with_raw_response.create(**FAILING)

    assert ID.fullmatch(listed.headers["x-request-id"])
    assert listed.headers["x-upstream-request-id"] == UPSTREAM_ID
    [record] = audit_records(tmp_path)
    assert created.headers["x-request-id"] == record["request_id"]
    assert created.headers["x-upstream-request-id"] == UPSTREAM_ID
    assert created.parse()._request_id == record["request_id"]


async def upgrade(base: str, target: str) -> bytes:
    """The head of the answer to a WebSocket upgrade, sent by hand."""
    url = URL(base)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    key = base64.b64encode(os.urandom(16)).decode()
    try:
        writer.write(
            (
                f"GET {target} HTTP/1.1\r\nHost: {url.raw_authority}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HANG_GUARD_S)
    finally:
        writer.close()
        await writer.wait_closed()


def header(head: bytes, name: str) -> str | None:
    found = re.search(rb"(?im)^" + re.escape(name.encode()) + rb":[ \t]*(.*?)[ \t]*\r$", head)
    return found[1].decode() if found else None


async def test_a_websocket_names_its_connection_and_each_blocked_frame(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    base = await start_proxy(recording_upstream.url)

    head = await upgrade(base, "/v1/responses")
    assert head.startswith(b"HTTP/1.1 101 ")
    connection_id = header(head, "x-request-id")
    assert connection_id is not None
    assert ID.fullmatch(connection_id)

    frame = json.dumps({"type": "response.create", **FAILING})
    async with aiohttp.ClientSession() as session, session.ws_connect(base + "/v1/responses") as ws:
        errors = []
        for _ in range(2):
            await ws.send_str(frame)
            errors.append(json.loads(await ws.receive_str(timeout=HANG_GUARD_S)))

    ids = [event["error"]["request_id"] for event in errors]
    assert [r["request_id"] for r in audit_records(tmp_path)] == ids
    assert all(ID.fullmatch(i) for i in ids)
    assert len(set(ids)) == 2  # an id per frame
    assert recording_upstream.frames == []


async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"SSH-2.0-OpenSSH_9.6\r\nthis is not HTTP\r\n\r\n")
    await writer.drain()
    writer.close()


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    # Reads the request and never answers; the proxy's read timeout ends the wait.
    await reader.read()
    writer.close()


@pytest.fixture
async def socket_upstream() -> AsyncIterator[dict[str, str]]:
    """Bare-socket upstreams that answer garbage or nothing, by name."""
    servers = {
        "garbage": await asyncio.start_server(garbage, "127.0.0.1", 0),
        "silent": await asyncio.start_server(silent, "127.0.0.1", 0),
    }
    urls = {
        name: f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        for name, server in servers.items()
    }
    urls["unreachable"] = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    yield urls
    for server in servers.values():
        server.close()
    for server in servers.values():
        await server.wait_closed()


FAILURES = [
    pytest.param(
        "unreachable", "POST", "/v1/responses", 502, "upstream_unreachable", id="gated-unreachable"
    ),
    pytest.param(
        "unreachable",
        "GET",
        "/v1/models",
        502,
        "upstream_unreachable",
        id="pass-through-unreachable",
    ),
    pytest.param(
        "unreachable",
        "WS",
        "/v1/responses",
        502,
        "upstream_unreachable",
        id="websocket-unreachable",
    ),
    pytest.param("garbage", "POST", "/v1/responses", 502, "upstream_bad_response", id="garbage"),
    pytest.param("silent", "POST", "/v1/responses", 504, "upstream_timeout", id="gated-timeout"),
    pytest.param("silent", "GET", "/v1/models", 504, "upstream_timeout", id="pass-through-timeout"),
]


@pytest.mark.parametrize(("upstream", "method", "target", "status", "code"), FAILURES)
async def test_the_proxys_own_5xx_say_who_failed_and_log_the_rest(
    socket_upstream: dict[str, str],
    start_proxy: ProxyFactory,
    caplog: pytest.LogCaptureFixture,
    upstream: str,
    method: str,
    target: str,
    status: int,
    code: str,
) -> None:
    url = socket_upstream[upstream]
    base = await start_proxy(url, upstream={"read_timeout_s": 0.2})
    headers = JSON_HEADERS
    if method == "WS":
        method = "GET"
        key = base64.b64encode(os.urandom(16)).decode()
        headers = {
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": key,
            "Sec-WebSocket-Version": "13",
        }
    data = json.dumps(CLEAN).encode() if method == "POST" else None
    with caplog.at_level(logging.WARNING, logger="replay_proxy"):
        async with (
            aiohttp.ClientSession() as client,
            client.request(method, base + target, data=data, headers=headers) as resp,
        ):
            assert resp.status == status
            request_id = resp.headers["x-request-id"]
            text = await resp.text()

    error = json.loads(text)["error"]
    assert (error["type"], error["code"]) == ("server_error", code)
    assert code in error["message"]
    port = str(URL(url).port)
    for internal in ("127.0.0.1", port, "Errno", "SSH", "refused"):
        assert internal not in text
    [logged] = [r for r in caplog.records if request_id in r.getMessage()]
    assert logged.levelno == logging.WARNING
    assert code in logged.getMessage()
    if upstream == "unreachable":
        assert port in logged.getMessage()  # the detail is the operator's, in the log


async def test_the_taps_log_line_names_the_request(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def unreadable(request: web.Request, received: Received) -> web.StreamResponse:
        # A coding the tap cannot undo: the answer goes by unrecorded, and the log says so.
        headers = {"Content-Type": "application/json", "Content-Encoding": "zstd"}
        return web.Response(body=b"\x28\xb5\x2f\xfd not really zstd", headers=headers)

    recording_upstream.handler = unreadable
    base = await start_proxy(recording_upstream.url)
    with caplog.at_level(logging.WARNING, logger="replay_proxy"):
        async with (
            aiohttp.ClientSession(auto_decompress=False) as client,
            client.post(base + "/v1/responses", json=CLEAN) as resp,
        ):
            assert resp.status == 200
            request_id = resp.headers["x-request-id"]
            await resp.read()

    [logged] = [r for r in caplog.records if "unrecorded" in r.getMessage()]
    assert logged.getMessage().startswith(request_id + " ")


@pytest.mark.parametrize(
    ("upstream_status", "status", "type_", "code"),
    [
        pytest.param(200, 502, "server_error", "upstream_bad_response", id="no-upgrade-200"),
        pytest.param(403, 403, "invalid_request_error", "upstream_refused", id="refused-403"),
        pytest.param(503, 503, "server_error", "upstream_refused", id="refused-503"),
    ],
)
async def test_a_websocket_upgrade_the_upstream_does_not_take(
    start_proxy: ProxyFactory,
    upstream_status: int,
    status: int,
    type_: str,
    code: str,
) -> None:
    """An upstream that answers an upgrade with a refusal has it relayed in the API's error
    shape; one that answers anything else (a 200) answered garbage: 502, never that 200."""

    async def no_upgrade(request: web.Request) -> web.Response:
        return web.json_response({"detail": "no websockets here"}, status=upstream_status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", no_upgrade)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        base = await start_proxy(str(server.make_url("")).rstrip("/"))
        async with (
            aiohttp.ClientSession() as client,
            client.get(
                base + "/v1/responses",
                headers={
                    "Upgrade": "websocket",
                    "Connection": "Upgrade",
                    "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
                    "Sec-WebSocket-Version": "13",
                },
            ) as resp,
        ):
            assert resp.status == status
            assert ID.fullmatch(resp.headers["x-request-id"])
            error = (await resp.json())["error"]
    finally:
        await server.close()
    assert (error["type"], error["code"]) == (type_, code)
    assert str(server.port) not in error["message"]
