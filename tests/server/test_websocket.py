"""WebSocket: each response.create frame is gated; events flow back and feed the ledger."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.builders import SALES_TOOL, audit_records, sales_call, sales_output
from tests.fixture_types import ProxyFactory
from tests.servers.recording import RecordingUpstream
from tests.servers.redis_server import RedisServer


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def turn(ws: aiohttp.ClientWebSocketResponse, **request: Any) -> list[dict[str, Any]]:
    """Send one response.create and read events up to its end (completed or error)."""
    return await turn_of(ws, json.dumps({"type": "response.create", **request}))


async def turn_of(ws: aiohttp.ClientWebSocketResponse, frame: str) -> list[dict[str, Any]]:
    """Send one frame, exactly this text, and read events up to its end (completed or error)."""
    await ws.send_str(frame)
    events = []
    while True:
        event = json.loads(await ws.receive_str(timeout=30))
        events.append(event)
        if event["type"] in ("response.completed", "response.failed", "error"):
            return events


async def test_a_tool_turn_and_its_follow_up_pass(
    scripted_upstream: str, start_proxy: ProxyFactory, session: aiohttp.ClientSession
) -> None:
    base = await start_proxy(scripted_upstream)
    headers = {"Authorization": "Bearer sk-ws"}
    async with session.ws_connect(base + "/v1/responses", headers=headers) as ws:
        events = await turn(ws, model="scripted", input="sales?", tools=[SALES_TOOL])
        response = events[-1]["response"]
        [call] = [item for item in response["output"] if item["type"] == "function_call"]

        events = await turn(
            ws,
            model="scripted",
            previous_response_id=response["id"],
            input=[sales_output(call["call_id"], "apac: 7")],
            tools=[SALES_TOOL],
        )

    assert events[-1]["type"] == "response.completed"
    [message] = events[-1]["response"]["output"]
    assert message["content"][0]["text"] == "tool said: apac: 7"


async def test_a_ledger_fault_is_a_503_event_and_the_turn_may_be_retried(
    scripted_upstream: str,
    start_proxy: ProxyFactory,
    session: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    """Redis not answering is the proxy's fault: an error event with status 503 and
    `ledger_unavailable`, and the turn is not evicted: once Redis answers, it goes through."""
    ledger = {"backend": "redis", "url": redis_server.url, "timeout_s": 0.5}
    base = await start_proxy(scripted_upstream, ledger=ledger)
    async with session.ws_connect(base + "/v1/responses") as ws:
        events = await turn(ws, model="scripted", input="sales?", tools=[SALES_TOOL])
        response = events[-1]["response"]
        [call] = [item for item in response["output"] if item["type"] == "function_call"]
        follow_up = {
            "model": "scripted",
            "previous_response_id": response["id"],
            "input": [sales_output(call["call_id"], "apac: 7")],
            "tools": [SALES_TOOL],
        }

        redis_server.pause()
        try:
            [error] = await turn(ws, **follow_up)
        finally:
            redis_server.resume()
        events = await turn(ws, **follow_up)

    assert error["type"] == "error"
    assert error["status"] == 503
    assert (error["error"]["type"], error["error"]["code"]) == (
        "server_error",
        "ledger_unavailable",
    )
    assert events[-1]["type"] == "response.completed"
    [message] = events[-1]["response"]["output"]
    assert message["content"][0]["text"] == "tool said: apac: 7"


async def test_a_failing_frame_gets_an_error_event_and_the_connection_carries_on(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    session: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    base = await start_proxy(recording_upstream.url)
    failing = [sales_call("call_1", "global"), sales_output("call_1")]
    clean = [sales_call("call_2"), sales_output("call_2")]
    async with session.ws_connect(base + "/v1/responses") as ws:
        [error] = await turn(ws, model="m", input=failing, tools=[SALES_TOOL])
        assert recording_upstream.frames == []
        [completed] = await turn(ws, model="m", input=clean, tools=[SALES_TOOL])

    assert error["type"] == "error"
    assert error["status"] == 400
    assert error["error"]["code"] == "replay_rejected"
    assert error["error"]["findings"][0]["reason"] == "arguments_schema"
    assert completed["response"]["id"] == "resp_ws_1"
    [frame] = recording_upstream.frames
    assert json.loads(frame)["input"] == clean
    [record] = audit_records(tmp_path)
    assert record["transport"] == "websocket"
    assert record["action"] == "block"


async def test_a_stripped_frame_goes_up_clean(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, session: aiohttp.ClientSession
) -> None:
    base = await start_proxy(recording_upstream.url, gate={"action": "strip"})
    good, bad = (
        [sales_call("c1"), sales_output("c1")],
        [sales_call("c2", "mars"), sales_output("c2")],
    )
    async with session.ws_connect(base + "/v1/responses") as ws:
        await turn(ws, model="m", input=[*good, *bad], tools=[SALES_TOOL])

    [frame] = recording_upstream.frames
    assert json.loads(frame)["input"] == good


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        pytest.param("{not json", "invalid_json", id="not-json"),
        pytest.param(
            '{"type":"response.create","input":[],"input":[]}', "invalid_json", id="dup-key"
        ),
        pytest.param('["response.create"]', "invalid_body", id="not-object"),
        pytest.param('{"type":"response.create","input":42}', "invalid_input", id="input-number"),
    ],
)
async def test_an_unreadable_frame_is_answered_and_never_forwarded(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    session: aiohttp.ClientSession,
    frame: str,
    code: str,
) -> None:
    base = await start_proxy(recording_upstream.url)
    async with session.ws_connect(base + "/v1/responses") as ws:
        await ws.send_str(frame)
        error = json.loads(await ws.receive_str(timeout=30))
        await ws.send_bytes(b'{"type":"response.create","input":[]}')
        binary = json.loads(await ws.receive_str(timeout=30))

    assert (error["type"], error["status"], error["error"]["code"]) == ("error", 400, code)
    assert binary["error"]["code"] == "invalid_frame"
    assert recording_upstream.frames == []


KEY = base64.b64encode(os.urandom(16)).decode()
UPGRADE = {
    "Upgrade": "websocket",
    "Connection": "Upgrade",
    "Sec-WebSocket-Key": KEY,
    "Sec-WebSocket-Version": "13",
}


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param({"Sec-WebSocket-Version": "12"}, id="version-12"),
        pytest.param({"Sec-WebSocket-Key": None}, id="no-key"),
        pytest.param({"Sec-WebSocket-Key": base64.b64encode(b"8 bytes!").decode()}, id="short-key"),
        pytest.param({"Sec-WebSocket-Key": "not base64!"}, id="key-not-base64"),
        pytest.param({"Connection": "keep-alive"}, id="connection-not-upgrade"),
    ],
)
# Gated, and relayed ungated: both refuse it before the upstream is asked.
@pytest.mark.parametrize("path", ["/v1/responses", "/v1/realtime"])
async def test_an_invalid_handshake_is_refused_before_the_upstream_is_asked(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    session: aiohttp.ClientSession,
    changed: dict[str, str | None],
    path: str,
) -> None:
    headers = {name: value for name, value in (UPGRADE | changed).items() if value is not None}
    base = await start_proxy(recording_upstream.url)
    async with session.get(base + path, headers=headers) as resp:
        status, content_type = resp.status, resp.content_type
        request_id = resp.headers.get("x-request-id")
        error = json.loads(await resp.read())["error"]

    assert (status, content_type) == (400, "application/json")
    assert (error["type"], error["code"]) == (
        "invalid_request_error",
        "invalid_websocket_handshake",
    )
    assert request_id is not None
    assert recording_upstream.upgrades == 0
    assert recording_upstream.received == []


async def test_a_valid_handshake_reaches_the_upstream(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, session: aiohttp.ClientSession
) -> None:
    # The same headers as the table above, unchanged: the refusals are the changes' doing.
    base = await start_proxy(recording_upstream.url)
    async with session.get(base + "/v1/responses", headers=UPGRADE) as resp:
        assert resp.status == 101

    assert recording_upstream.upgrades == 1
