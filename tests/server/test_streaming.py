"""Streaming: answers relayed as they arrive."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.builders import HANG_GUARD_S, at, clean_body
from tests.fixture_types import ProxyFactory
from tests.server.checks import metric, scrape
from tests.servers.recording import Received, RecordingUpstream

EVENT_1 = b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n'
EVENT_2 = b'event: response.completed\ndata: {"type":"response.completed","sequence_number":1}\n\n'
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("method", "target", "body"),
    [
        pytest.param("POST", "/v1/responses", clean_body(stream=True), id="gated"),
        pytest.param("GET", "/v1/responses/resp_1?stream=true", None, id="pass-through"),
    ],
)
async def test_sse_reaches_the_client_event_by_event(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    method: str,
    target: str,
    body: dict[str, Any] | None,
) -> None:
    first_read = asyncio.Event()

    async def sse(request: web.Request, received: Received) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(EVENT_1)
        # The next event exists only once the client has read the first through the proxy.
        await first_read.wait()
        await response.write(EVENT_2)
        await response.write(DONE)
        await response.write_eof()
        return response

    recording_upstream.handler = sse
    base = await start_proxy(recording_upstream.url)
    try:
        async with client.request(method, at(base, target), json=body) as resp:
            assert resp.status == 200
            assert resp.content_type == "text/event-stream"
            first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), HANG_GUARD_S)
            assert first == EVENT_1
            assert metric(await scrape(client, base), "replay_proxy_open_streams") == 1
            first_read.set()
            rest = await asyncio.wait_for(resp.content.read(), HANG_GUARD_S)
            assert rest == EVENT_2 + DONE
    finally:
        first_read.set()
    [got] = recording_upstream.received
    assert (got.method, got.target) == (method, target)
