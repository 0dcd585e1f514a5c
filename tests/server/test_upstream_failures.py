"""Upstream failures and a client that hangs up: the documented answers."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.running.workers import free_port
from tests.builders import HANG_GUARD_S, at, clean_body
from tests.fixture_types import ProxyFactory
from tests.server.checks import metric, scrape
from tests.servers.recording import Received, RecordingUpstream


@pytest.mark.parametrize(
    ("method", "target", "body"),
    [
        pytest.param("POST", "/v1/responses", clean_body(), id="gated"),
        pytest.param("GET", "/v1/models", None, id="pass-through"),
    ],
)
async def test_unreachable_upstream_is_502(
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    method: str,
    target: str,
    body: dict[str, Any] | None,
) -> None:
    port = free_port("127.0.0.1")
    base = await start_proxy(f"http://127.0.0.1:{port}")

    async with client.request(method, at(base, target), json=body) as resp:
        assert resp.status == 502
        assert resp.content_type == "application/json"
        error = (await resp.json())["error"]
    assert error["code"] == "upstream_unreachable"
    assert error["type"] == "server_error"
    assert str(port) not in error["message"]


@pytest.mark.parametrize(
    ("method", "target", "body"),
    [
        pytest.param("POST", "/v1/responses", clean_body(), id="gated"),
        pytest.param("GET", "/v1/models", None, id="pass-through"),
    ],
)
async def test_silent_upstream_is_504(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    method: str,
    target: str,
    body: dict[str, Any] | None,
) -> None:
    answered = asyncio.Event()

    async def never_answer(request: web.Request, received: Received) -> web.StreamResponse:
        await answered.wait()
        return web.Response(status=204)

    recording_upstream.handler = never_answer
    base = await start_proxy(recording_upstream.url, upstream={"read_timeout_s": 0.5})
    try:
        async with client.request(method, at(base, target), json=body) as resp:
            assert resp.status == 504
            assert resp.content_type == "application/json"
            error = (await resp.json())["error"]
    finally:
        answered.set()
    assert error["code"] == "upstream_timeout"
    [got] = recording_upstream.received
    assert (got.method, got.target) == (method, target)


@pytest.mark.parametrize("served", [True, False], ids=["as-served", "handler-cancellation"])
async def test_client_hanging_up_mid_stream_releases_the_upstream(
    recording_upstream: RecordingUpstream,
    serve_proxy: ProxyFactory,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    served: bool,
) -> None:
    allowed, wrote, gone = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def endless(request: web.Request, received: Received) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        # However the loss shows (a failed write, a closed transport, the handler cancelled by
        # the server), the upstream has noticed that the proxy went away.
        try:
            while request.transport is not None and not request.transport.is_closing():
                await response.write(b"data: tick\n\n")
                wrote.set()
                await allowed.wait()
                allowed.clear()
        except ConnectionResetError:
            pass
        finally:
            gone.set()
        return response

    async def allow_writes_until_gone() -> None:
        # One chunk per round until the upstream sees that the proxy went away.
        while not gone.is_set():
            wrote.clear()
            allowed.set()
            waiters = {asyncio.ensure_future(wrote.wait()), asyncio.ensure_future(gone.wait())}
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()

    recording_upstream.handler = endless
    base = await (serve_proxy if served else start_proxy)(recording_upstream.url)
    try:
        async with client.get(at(base, "/v1/responses/resp_1?stream=true")) as resp:
            first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), HANG_GUARD_S)
            assert first == b"data: tick\n\n"
            resp.close()  # the client hangs up mid-stream
        await asyncio.wait_for(allow_writes_until_gone(), HANG_GUARD_S)
    finally:
        gone.set()
        allowed.set()

    async def models(request: web.Request, received: Received) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": []})

    recording_upstream.handler = models
    async with client.get(at(base, "/v1/models")) as resp:
        assert resp.status == 200
        assert await resp.json() == {"object": "list", "data": []}
    assert metric(await scrape(client, base), "replay_proxy_open_streams") == 0
    assert [r.target for r in recording_upstream.received] == [
        "/v1/responses/resp_1?stream=true",
        "/v1/models",
    ]
