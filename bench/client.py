"""The load benchmark's aiohttp client: checks each target's answers, times SSE streams."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from servers import Server
from workload import HEADERS, PATH, Body


def expected(target: str, body: Body) -> tuple[int, str | None]:
    """The status and `x-replay-gate` header each target must answer `body` with."""
    if target != "replay-proxy":
        return 200, None
    return {
        "clean": (200, None),
        "sse": (200, None),
        "block": (400, None),
        "strip": (200, "stripped=1"),
    }[body.kind]


async def check_answers(servers: dict[str, Server], bench_bodies: list[Body]) -> dict[str, str]:
    """Send every body to every target once; the benchmark must not measure the wrong answer."""
    answers: dict[str, str] = {}
    async with aiohttp.ClientSession() as session:
        for body in bench_bodies:
            for target, server in servers.items():
                async with session.post(
                    server.url + PATH, data=body.data, headers=HEADERS
                ) as response:
                    payload = await response.read()
                    got = (response.status, response.headers.get("x-replay-gate"))
                    if got != expected(target, body):
                        raise SystemExit(
                            f"{target} answered {body.name!r} with {got}, "
                            f"expected {expected(target, body)}: {payload[:300]!r}"
                        )
                    is_sse = response.content_type == "text/event-stream"
                    if is_sse != (body.kind == "sse"):
                        raise SystemExit(f"{target} answered {body.name!r} as {is_sse=}")
                    if target == "replay-proxy":
                        if body.kind == "block":
                            code = json.loads(payload)["error"]["code"]
                            answers[body.name] = f"400 {code}"
                        else:
                            answers[body.name] = " ".join(
                                filter(None, ["200", got[1], "SSE" if is_sse else None])
                            )
    return answers


@dataclass
class StreamStats:
    ttfb_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)


async def stream_once(
    session: aiohttp.ClientSession, url: str, data: bytes, gap_ms: float, stats: StreamStats
) -> None:
    headers = {**HEADERS, "x-bench-event-gap-ms": str(gap_ms)}
    start = time.perf_counter()
    arrivals: list[float] = []
    async with session.post(url + PATH, data=data, headers=headers) as response:
        if response.status != 200:
            raise SystemExit(f"streaming answer {response.status} from {url}")
        async for line in response.content:
            if line.startswith(b"data:"):
                arrivals.append(time.perf_counter())
    stats.ttfb_ms.append((arrivals[0] - start) * 1000)
    stats.gaps_ms.extend((b - a) * 1000 for a, b in itertools.pairwise(arrivals))


async def measure_streams(
    servers: dict[str, Server], stream_bodies: list[Body], samples: int, gap_ms: float
) -> dict[tuple[str, str], StreamStats]:
    """Time to first event and gaps between events, samples interleaved across targets."""
    stats = {(b.name, t): StreamStats() for b in stream_bodies for t in servers}
    deadline = time.monotonic() + 120
    async with aiohttp.ClientSession() as session:
        for body in stream_bodies:
            for server in servers.values():  # warm the connection and the caches
                await stream_once(session, server.url, body.data, 0, StreamStats())
            for i in range(samples):
                if time.monotonic() > deadline:
                    break
                order = list(servers.items())
                order = order[i % len(order) :] + order[: i % len(order)]
                for target, server in order:
                    await stream_once(
                        session, server.url, body.data, gap_ms, stats[body.name, target]
                    )
    return stats


async def hold_streams(
    url: str, data: bytes, count: int, rss_mb: Callable[[], float], limit_s: float = 60.0
) -> float:
    """Open `count` SSE streams at once (the upstream's events 10 s apart) and, once every one
    has had its first event, return the serving process's RSS in MB; then close them all."""
    headers = {**HEADERS, "x-bench-event-gap-ms": "10000"}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=limit_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def first_event() -> aiohttp.ClientResponse:
            response = await session.post(url + PATH, data=data, headers=headers)
            if response.status != 200:
                raise SystemExit(f"streaming answer {response.status} from {url}")
            async for line in response.content:
                if line.startswith(b"data:"):
                    break
            return response

        async with asyncio.timeout(limit_s):
            responses = await asyncio.gather(*(first_event() for _ in range(count)))
        rss = rss_mb()
        for response in responses:
            response.close()
    return rss
