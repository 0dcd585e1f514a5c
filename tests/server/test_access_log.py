"""The access log: one line per request at INFO, naming what it did, with its request id on
every log line written while it was handled."""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.running.workers import free_port
from tests.builders import (
    CLEAN,
    FAILING,
    JSON_HEADERS,
    SALES_TOOL,
    USER,
    at,
    sales_call,
    sales_output,
)
from tests.fixture_types import ProxyFactory
from tests.server.checks import eventually
from tests.server.logs import Captured, captured_log
from tests.servers.recording import Received, RecordingUpstream

KEY = "sk-listed-client"
LISTED = [{"name": "alice", "key_sha256": hashlib.sha256(KEY.encode()).hexdigest()}]
# A stripped request: its failing pair goes, a clean pair stays.
MIXED = json.dumps(
    {
        "model": "m",
        "tools": [SALES_TOOL],
        "input": [
            USER,
            sales_call("c1"),
            sales_output("c1"),
            sales_call("c2", "mars"),
            sales_output("c2"),
        ],
    }
).encode()


@dataclass(frozen=True)
class Case:
    """One request, and the fields its access line must have (and those it must not)."""

    method: str
    target: str
    expected: dict[str, Any]
    data: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    sections: dict[str, Any] = field(default_factory=dict)
    absent: tuple[str, ...] = ()
    unreachable: bool = False


CASES = [
    pytest.param(
        Case(
            "POST",
            "/v1/responses",
            {
                "route": "responses",
                "outcome": "forward",
                "status": 200,
                "findings": 0,
                "body_bytes": len(CLEAN),
            },
            CLEAN,
            JSON_HEADERS,
            absent=("code",),
        ),
        id="gated-forward",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/responses",
            {
                "route": "responses",
                "outcome": "block",
                "code": "replay_rejected",
                "status": 400,
                "findings": 1,
                "findings_block": 1,
            },
            FAILING,
            JSON_HEADERS,
            absent=("upstream_ms",),
        ),
        id="blocked",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/responses",
            {"outcome": "strip", "status": 200, "findings": 1, "findings_strip": 1},
            MIXED,
            JSON_HEADERS,
            sections={"gate": {"action": "strip"}},
        ),
        id="stripped",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/responses",
            {"outcome": "forward", "status": 200, "findings": 1, "findings_log": 1},
            FAILING,
            JSON_HEADERS,
            sections={"gate": {"action": "log"}},
        ),
        id="logged",
    ),
    pytest.param(
        Case(
            "GET",
            "/v1/models?after=m1",
            {"route": "passthrough", "outcome": "forward", "status": 200, "path": "/v1/models"},
            absent=("gate_ms", "body_bytes"),
        ),
        id="pass-through-without-its-query",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/responses",
            {"route": "responses", "outcome": "error", "code": "invalid_json", "status": 400},
            b"{not json",
            JSON_HEADERS,
            absent=("upstream_ms",),
        ),
        id="unreadable-body",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/responses",
            {"outcome": "error", "code": "upstream_unreachable", "status": 502},
            CLEAN,
            JSON_HEADERS,
            absent=("upstream_ms",),
            unreachable=True,
        ),
        id="upstream-unreachable",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/responses",
            {"outcome": "error", "code": "invalid_api_key", "status": 401},
            CLEAN,
            JSON_HEADERS | {"Authorization": "Bearer sk-not-listed"},
            sections={"clients": LISTED},
            absent=("tenant", "upstream_ms"),
        ),
        id="unauthorized",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/responses",
            {"outcome": "forward", "status": 200, "tenant": "alice"},
            CLEAN,
            JSON_HEADERS | {"Authorization": f"Bearer {KEY}"},
            sections={"clients": LISTED},
        ),
        id="listed-client-is-its-tenant",
    ),
    pytest.param(
        Case(
            "GET",
            "/-/healthy",
            {"route": "admin", "outcome": "admin", "status": 200},
            absent=("upstream", "upstream_ms", "gate_ms"),
        ),
        id="admin",
    ),
    pytest.param(
        Case(
            "GET",
            "/-/nothing",
            {"outcome": "error", "code": "not_found", "status": 404},
            absent=("upstream", "upstream_ms"),
        ),
        id="no-such-admin-endpoint",
    ),
]


async def line_of(log: Captured, request_id: str) -> dict[str, Any]:
    """The access line of one request, once written (it may follow the answer's last byte)."""

    def lines() -> list[dict[str, Any]]:
        return [line for line in log.access() if line.get("request_id") == request_id]

    await eventually(lambda: bool(lines()))
    [line] = lines()
    return line


@pytest.mark.parametrize("case", CASES)
async def test_one_access_line_per_request(
    case: Case,
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
) -> None:
    upstream = recording_upstream.url
    if case.unreachable:
        upstream = f"http://127.0.0.1:{free_port('127.0.0.1')}"  # nobody listens there
    base = await start_proxy(upstream, **case.sections)
    with captured_log() as log:
        async with client.request(
            case.method, at(base, case.target), data=case.data, headers=case.headers
        ) as response:
            answer = await response.read()
            request_id = response.headers["x-request-id"]
            status = response.status
        line = await line_of(log, request_id)

    assert {name: line.get(name) for name in case.expected} == case.expected
    assert line["status"] == status
    assert line["level"] == "INFO"
    assert line["method"] == case.method
    assert line["bytes"] == len(answer)
    for name in case.absent:
        assert name not in line, name
    if "upstream_ms" not in case.absent:
        assert line["upstream"] == "default"  # the single `upstream:` form names it so
        assert line["upstream_ms"] >= 0
    if line.get("route") == "responses" and "body_bytes" not in case.absent:
        assert line["gate_ms"] >= 0
        assert line["body_bytes"] == len(case.data or b"")


async def test_every_line_of_a_request_names_it(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """The upstream hop's warning is written deep in the request: it carries the id too, in
    the JSON field and (text) as the first word of the message."""
    base = await start_proxy(f"http://127.0.0.1:{free_port('127.0.0.1')}")
    with captured_log() as log:
        async with client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS) as r:
            assert r.status == 502
            request_id = r.headers["x-request-id"]
        await line_of(log, request_id)
    written = [line for line in log.lines() if line["logger"] != "aiohttp.access"]
    warnings = [line for line in written if line["level"] == "WARNING"]
    assert warnings, written
    assert {line.get("request_id") for line in written} == {request_id}


async def test_text_lines_begin_with_the_request_id(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    base = await start_proxy(f"http://127.0.0.1:{free_port('127.0.0.1')}")
    with captured_log("text") as log:
        async with client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS) as r:
            request_id = r.headers["x-request-id"]
        await eventually(lambda: " outcome=error " in log.text())
    ours = [line for line in log.text().splitlines() if "replay_proxy" in line.split(": ")[0]]
    assert len(ours) == 2, ours  # the hop's warning, then the access line
    for line in ours:
        assert line.split(": ", 1)[1].startswith(request_id + " "), line
    assert "code=upstream_unreachable status=502" in ours[-1]


async def test_websocket_connection_has_one_access_line(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
) -> None:
    """A gated WebSocket is one line when it ends: its frames, their findings, the upgrade's
    time upstream."""
    base = await start_proxy(recording_upstream.url)
    clean = {"type": "response.create", **json.loads(CLEAN)}
    failing = {"type": "response.create", **json.loads(FAILING)}
    with captured_log() as log:
        async with client.ws_connect(f"{base}/v1/responses") as ws:
            request_id = ws._response.headers["x-request-id"]
            await ws.send_json(clean)
            assert (await ws.receive_json())["type"] == "response.completed"
            await ws.send_json(failing)
            assert (await ws.receive_json())["type"] == "error"
        line = await line_of(log, request_id)

    assert line["route"] == "websocket"
    assert line["status"] == 101
    assert line["outcome"] == "forward"
    assert line["frames"] == 2
    assert line["findings"] == 1
    assert line["findings_block"] == 1
    assert line["upstream_ms"] >= 0


async def test_a_client_that_hangs_up_mid_answer_is_logged_as_gone(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
) -> None:
    """The handler is cancelled when its client goes: its line is still written, with the status
    it had sent and what it had relayed."""
    release = asyncio.Event()

    async def first_event_then_wait(request: web.Request, received: Received) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: one\n\n")
        await release.wait()
        return response

    recording_upstream.handler = first_event_then_wait
    base = await start_proxy(recording_upstream.url)
    try:
        with captured_log() as log:
            response = await client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS)
            request_id = response.headers["x-request-id"]
            assert await response.content.readline() == b"data: one\n"
            response.close()  # hangs up
            line = await line_of(log, request_id)
    finally:
        release.set()
    assert line["outcome"] == "client_gone"
    assert line["status"] == 200
    assert line["bytes"] == len(b"data: one\n\n")


async def test_an_upstream_that_fails_mid_answer_is_logged_as_cut(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
) -> None:
    async def first_event_then_reset(
        request: web.Request, received: Received
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: one\n\n")
        assert request.transport is not None
        request.transport.abort()  # a chunked answer that never ends
        return response

    recording_upstream.handler = first_event_then_reset
    base = await start_proxy(recording_upstream.url)
    with captured_log() as log:
        async with client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS) as r:
            request_id = r.headers["x-request-id"]
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()
        line = await line_of(log, request_id)
    assert line["outcome"] == "upstream_cut"
    assert line["status"] == 200
    assert line["bytes"] == len(b"data: one\n\n")
    [warning] = [entry for entry in log.lines() if entry["level"] == "WARNING"]
    assert warning["request_id"] == request_id
    assert "upstream failed mid-answer" in warning["message"]
