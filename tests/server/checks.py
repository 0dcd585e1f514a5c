"""What the server tests read back: the proxy still serves, no descriptor leaked, a metric."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import CLEAN, HANG_GUARD_S, JSON_HEADERS, POLL_S, at
from tests.servers.recording import RecordingUpstream


async def served_clean(
    client: aiohttp.ClientSession, base: str, upstream: RecordingUpstream
) -> None:
    """The proxy still forwards a clean request, whole."""
    before = len(upstream.received)
    async with client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS) as resp:
        assert resp.status == 200
        await resp.read()
    assert [r.body for r in upstream.received[before:]] == [CLEAN]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def eventually(check: Callable[[], bool]) -> bool:
    """Whether `check` holds within the hang guard: sockets take a moment to close.

    Polled, because nothing signals that the kernel has let go of a socket.
    """
    for _ in range(int(HANG_GUARD_S / POLL_S)):
        if check():
            return True
        await asyncio.sleep(POLL_S)
    return check()


async def fds_after(baseline: int) -> int:
    """The count of open descriptors, once it is back to `baseline` or the hang guard is up."""
    await eventually(lambda: open_fds() <= baseline)
    return open_fds()


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text, or None when there is no such sample."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


async def scrape(client: aiohttp.ClientSession, base: str) -> str:
    async with client.get(at(base, "/-/metrics")) as resp:
        assert resp.status == 200
        assert resp.content_type == "text/plain"
        return await resp.text()
