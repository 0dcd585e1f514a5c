"""Slow clients: cut off by the read deadlines, holding up no one meanwhile."""

from __future__ import annotations

import asyncio
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from tests.builders import CLEAN, DEADLINE_S, HANG_GUARD_S, JSON_HEADERS
from tests.fixture_types import ProxyFactory
from tests.server.checks import fds_after, open_fds, served_clean
from tests.servers.recording import RecordingUpstream
from tests.servers.wire import close, connect, read_answer, read_to_eof, request_head


@dataclass
class Trickle:
    """Sends `data` over `writer`: `first` bytes at once, the rest a byte at a time (or never)."""

    writer: asyncio.StreamWriter
    data: bytes
    first: int
    pace_s: float | None
    sent: int = 0

    async def run(self) -> None:
        self.writer.write(self.data[: self.first])
        self.sent = self.first
        if self.pace_s is None:
            return
        with suppress(ConnectionError):
            for i in range(self.first, len(self.data)):
                await asyncio.sleep(self.pace_s)
                self.writer.write(self.data[i : i + 1])
                await self.writer.drain()
                self.sent = i + 1


# A byte every 20 ms: soon enough for any timeout on the next byte, while the whole takes
# seconds, far past the deadline.
PACES = [pytest.param(None, id="stalls"), pytest.param(0.02, id="trickles")]


@pytest.mark.parametrize("pace_s", PACES)
async def test_slow_head_is_cut_off_and_holds_up_no_one(
    recording_upstream: RecordingUpstream,
    tight_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    pace_s: float | None,
) -> None:
    base = await tight_proxy(recording_upstream.url)
    await served_clean(client, base, recording_upstream)
    baseline = open_fds()
    head = request_head(
        Content_Type="application/json", Content_Length=len(CLEAN), X_Padding="p" * 500
    )
    reader, writer = await connect(base)
    slow = Trickle(writer, head, first=20, pace_s=pace_s)
    sending = asyncio.create_task(slow.run())
    try:
        await served_clean(client, base, recording_upstream)
        answer = await asyncio.wait_for(read_to_eof(reader), HANG_GUARD_S)
    finally:
        sending.cancel()
        with suppress(asyncio.CancelledError):
            await sending
        await close(writer)

    # Closed with no answer: aiohttp's keep-alive timer bounds the wait for a whole head.
    assert answer == b""
    assert slow.sent < len(head)
    assert [r.body for r in recording_upstream.received] == [CLEAN, CLEAN]
    assert await fds_after(baseline) <= baseline


@pytest.mark.parametrize(
    ("pace_s", "target", "extra"),
    [
        pytest.param(None, "/v1/responses", {}, id="stalls"),
        pytest.param(0.02, "/v1/responses", {}, id="trickles"),
        pytest.param(None, "/v1/responses/compact", {}, id="stalls-compact"),
        # A POST does not upgrade: it may not escape the deadline by saying it would.
        pytest.param(None, "/v1/responses", {"Upgrade": "websocket"}, id="stalls-saying-upgrade"),
    ],
)
async def test_slow_body_is_answered_408_and_holds_up_no_one(
    recording_upstream: RecordingUpstream,
    tight_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    pace_s: float | None,
    target: str,
    extra: dict[str, str],
) -> None:
    base = await tight_proxy(recording_upstream.url)
    await served_clean(client, base, recording_upstream)
    baseline = open_fds()
    head = request_head(target, Content_Type="application/json", Content_Length=len(CLEAN), **extra)
    reader, writer = await connect(base)
    slow = Trickle(writer, head + CLEAN, first=len(head) + 10, pace_s=pace_s)
    sending = asyncio.create_task(slow.run())
    try:
        await served_clean(client, base, recording_upstream)
        answer = await asyncio.wait_for(read_answer(reader), HANG_GUARD_S)
    finally:
        sending.cancel()
        with suppress(asyncio.CancelledError):
            await sending
        await close(writer)

    assert answer.status == 408
    assert answer.error()["code"] == "body_timeout"
    assert slow.sent < len(head + CLEAN)
    assert [r.body for r in recording_upstream.received] == [CLEAN, CLEAN]
    assert await fds_after(baseline) <= baseline


async def test_a_body_read_in_time_may_take_longer_upstream(
    recording_upstream: RecordingUpstream,
    tight_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
) -> None:
    # The body deadline ends with the body: the upstream may take longer than it to answer.
    answered = asyncio.Event()

    async def slow_answer(request: Any, received: Any) -> aiohttp.web.StreamResponse:
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(3):
            await asyncio.sleep(DEADLINE_S / 2)
            await response.write(b"data: tick\n\n")
        answered.set()
        return response

    recording_upstream.handler = slow_answer
    base = await tight_proxy(recording_upstream.url)
    async with client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS) as resp:
        assert resp.status == 200
        assert await resp.read() == b"data: tick\n\n" * 3
    assert answered.is_set()
