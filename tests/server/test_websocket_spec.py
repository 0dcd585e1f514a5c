"""The WebSocket relay keeps the spec's promises: a continuation the proxy fails evicts what it
continued on that connection, and close codes and reasons reach the other side."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.server.websocket import sendable
from tests.builders import SALES_TOOL, sales_output
from tests.fixture_types import ProxyFactory
from tests.servers import strict_upstream
from tests.servers.strict_upstream import StrictUpstream

# Any bound on waiting, never an assertion on time.
WAIT_S = 30


@pytest.fixture
async def strict() -> AsyncIterator[StrictUpstream]:
    async with strict_upstream.serve() as upstream:
        yield upstream


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def turn(ws: aiohttp.ClientWebSocketResponse, **request: Any) -> dict[str, Any]:
    """Send one response.create; the event that ends it (completed, failed or error)."""
    await ws.send_str(json.dumps({"type": "response.create", **request}))
    while True:
        event: dict[str, Any] = json.loads(await ws.receive_str(timeout=WAIT_S))
        if event["type"] in ("response.completed", "response.failed", "error"):
            return event


async def test_a_continuation_the_proxy_fails_evicts_its_previous_response(
    strict: StrictUpstream, start_proxy: ProxyFactory, session: aiohttp.ClientSession
) -> None:
    base = await start_proxy(strict.url)
    async with session.ws_connect(base + "/v1/responses") as ws:
        first = await turn(ws, model="m", store=False, input="sales?", tools=[SALES_TOOL])
        response = first["response"]
        [call] = response["output"]
        # Answers no call: the proxy fails the turn, and the upstream never sees it.
        failed = await turn(
            ws,
            model="m",
            store=False,
            previous_response_id=response["id"],
            input=[sales_output("call_missing")],
            tools=[SALES_TOOL],
        )
        # The upstream still holds the response in this connection's cache: the proxy refuses.
        retried = await turn(
            ws,
            model="m",
            store=False,
            previous_response_id=response["id"],
            input=[sales_output(call["call_id"], "apac: 7")],
            tools=[SALES_TOOL],
        )
        # Another chain on the same connection carries on.
        other = await turn(ws, model="m", store=False, input="hello")
        continued = await turn(
            ws, model="m", store=False, previous_response_id=other["response"]["id"], input="more"
        )

    assert call["type"] == "function_call"
    assert (failed["type"], failed["error"]["code"]) == ("error", "replay_rejected")
    assert retried == {
        "type": "error",
        "status": 400,
        "error": {
            "type": "invalid_request_error",
            "code": "previous_response_not_found",
            "param": "previous_response_id",
            "message": f"Previous response with id '{response['id']}' not found.",
        },
    }
    assert continued["type"] == "response.completed"
    assert [frame["input"] for frame in strict.frames] == ["sales?", "hello", "more"]


async def test_a_continuation_the_upstream_fails_is_its_own_to_evict(
    strict: StrictUpstream, start_proxy: ProxyFactory, session: aiohttp.ClientSession
) -> None:
    # The proxy lets an upstream failure through as it came and evicts nothing itself: the
    # retry reaches the upstream, which answers it from its own (evicted) cache.
    base = await start_proxy(strict.url)
    async with session.ws_connect(base + "/v1/responses") as ws:
        first = await turn(ws, model="m", store=False, input="hi")
        named = first["response"]["id"]
        failed = await turn(ws, store=False, previous_response_id=named, input="no model")
        retried = await turn(ws, model="m", store=False, previous_response_id=named, input="x")

    assert failed["error"]["code"] == "missing_required_parameter"
    assert retried["error"]["code"] == "previous_response_not_found"
    assert len(strict.frames) == 3


@dataclass
class ClosingUpstream:
    """A WebSocket upstream that closes when told to (`input: "close CODE REASON"`) and
    records the close frame a client sent it."""

    url: str = ""
    closes: list[tuple[int, str]] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        while True:
            message = await ws.receive()
            if message.type == aiohttp.WSMsgType.TEXT:
                said = json.loads(message.data).get("input", "")
                if said == "drop":
                    # The connection goes without a close frame.
                    assert request.transport is not None
                    request.transport.abort()
                    return ws
                if said.startswith("close "):
                    _, code, reason = said.split(" ", 2)
                    await ws.close(code=int(code), message=reason.encode())
                    return ws
                await ws.send_json({"type": "response.completed", "response": {"id": "r"}})
            else:
                if message.type == aiohttp.WSMsgType.CLOSE:
                    self.closes.append((message.data, message.extra or ""))
                self.closed.set()
                return ws


@pytest.fixture
async def closing_upstream() -> AsyncIterator[ClosingUpstream]:
    upstream = ClosingUpstream()
    app = web.Application()
    app.router.add_get("/{tail:.*}", upstream.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    upstream.url = str(server.make_url("")).rstrip("/")
    yield upstream
    await server.close()


# The gated relay and the relay of any other path share how a close is passed on.
PATHS = [
    pytest.param("/v1/responses", id="gated"),
    pytest.param("/v1/realtime", id="ungated"),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("code", "reason"),
    [
        pytest.param(1012, "service restart", id="1012-restart"),
        pytest.param(1013, "try again later", id="1013-try-later"),
        pytest.param(1001, "going away", id="1001-going-away"),
        pytest.param(4009, "session expired", id="4009-application"),
        pytest.param(1000, "", id="1000-no-reason"),
    ],
)
async def test_the_upstreams_close_code_and_reason_reach_the_client(
    closing_upstream: ClosingUpstream,
    start_proxy: ProxyFactory,
    session: aiohttp.ClientSession,
    path: str,
    code: int,
    reason: str,
) -> None:
    base = await start_proxy(closing_upstream.url)
    async with session.ws_connect(base + path) as ws:
        await ws.send_str(
            json.dumps({"type": "response.create", "input": f"close {code} {reason}"})
        )
        message = await ws.receive(timeout=WAIT_S)

    assert (message.type, message.data, message.extra) == (aiohttp.WSMsgType.CLOSE, code, reason)
    assert ws.close_code == code


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("code", "reason"),
    [
        pytest.param(1001, "tab closed", id="1001-going-away"),
        pytest.param(4000, "agent done", id="4000-application"),
        pytest.param(1000, "", id="1000-no-reason"),
    ],
)
async def test_the_clients_close_code_and_reason_reach_the_upstream(
    closing_upstream: ClosingUpstream,
    start_proxy: ProxyFactory,
    session: aiohttp.ClientSession,
    path: str,
    code: int,
    reason: str,
) -> None:
    base = await start_proxy(closing_upstream.url)
    async with session.ws_connect(base + path) as ws:
        await ws.send_str(json.dumps({"type": "response.create", "input": "hi"}))
        await ws.receive_str(timeout=WAIT_S)
        await ws.close(code=code, message=reason.encode())
    await asyncio.wait_for(closing_upstream.closed.wait(), WAIT_S)

    assert closing_upstream.closes == [(code, reason)]


@pytest.mark.parametrize(
    ("received", "passed_on"),
    [
        pytest.param(1012, 1012, id="service-restart-as-is"),
        pytest.param(4009, 4009, id="application-as-is"),
        pytest.param(None, 1000, id="no-close-frame"),
        pytest.param(0, 1000, id="close-frame-without-code"),
        pytest.param(1005, 1000, id="1005-no-status"),
        pytest.param(1006, 1011, id="1006-abnormal"),
        pytest.param(1015, 1011, id="1015-tls"),
    ],
)
def test_a_close_code_no_endpoint_may_send_goes_on_as_one_that_means_the_same(
    received: int | None, passed_on: int
) -> None:
    assert sendable(received) == passed_on


@pytest.mark.parametrize("path", PATHS)
async def test_an_upstream_gone_without_a_close_frame_reaches_the_client_as_an_error(
    closing_upstream: ClosingUpstream,
    start_proxy: ProxyFactory,
    session: aiohttp.ClientSession,
    path: str,
) -> None:
    base = await start_proxy(closing_upstream.url)
    async with session.ws_connect(base + path) as ws:
        await ws.send_str(json.dumps({"type": "response.create", "input": "drop"}))
        message = await ws.receive(timeout=WAIT_S)

    # 1006 (abnormal closure) may not be sent: 1011 says the same, never a clean 1000.
    assert (message.type, message.data) == (aiohttp.WSMsgType.CLOSE, 1011)
