"""Faults: a misbehaving upstream, a client that leaves; the proxy leaks nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import pytest

from tests.builders import CLEAN, DEADLINE_S, HANG_GUARD_S, JSON_HEADERS
from tests.fixture_types import ProxyFactory
from tests.server.checks import eventually, fds_after, open_fds
from tests.servers.wire import (
    OK_BODY,
    Behaviour,
    RawUpstream,
    answer_head,
    answer_ok,
    chunks_of,
    close,
    connect,
    read_to_eof,
    request_head,
    reset,
)

JSON_BODY = json.dumps({"object": "response", "id": "resp_2", "output": [], "pad": "x" * 200})
SSE_BODY = b"".join(
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","n":%d}\n\n' % n
    for n in range(3)
)


JSON_ANSWER = answer_head(b"application/json", b"Content-Length: %d" % len(JSON_BODY))
SSE_ANSWER = answer_head(b"text/event-stream", b"Transfer-Encoding: chunked")


async def garbage(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proceed: asyncio.Event
) -> None:
    writer.write(b"SSH-2.0-OpenSSH_9.6\r\nthis is not HTTP\r\n\r\n")
    await writer.drain()


async def hang_up(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proceed: asyncio.Event
) -> None:
    pass


async def reset_at_once(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proceed: asyncio.Event
) -> None:
    reset(writer)


def partly(data: bytes, *, with_reset: bool) -> Behaviour:
    """Send `data`; once the client has seen it (`proceed`), reset or close the connection."""

    async def behave(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proceed: asyncio.Event
    ) -> None:
        writer.write(data)
        await writer.drain()
        await asyncio.wait_for(proceed.wait(), HANG_GUARD_S)
        if with_reset:
            reset(writer)

    return behave


def bytewise(data: bytes) -> Behaviour:
    """Send `data` a byte at a time, in all longer than the proxy's read timeout."""

    async def behave(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proceed: asyncio.Event
    ) -> None:
        for i in range(len(data)):
            writer.write(data[i : i + 1])
            await writer.drain()
            await asyncio.sleep(DEADLINE_S * 2 / len(data))

    return behave


async def stream_until_gone(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proceed: asyncio.Event
) -> None:
    writer.write(SSE_ANSWER + chunks_of(SSE_BODY, 1 << 20)[:-5])
    await writer.drain()
    # The stream stays open until the proxy closes its end.
    await asyncio.wait_for(read_to_eof(reader), HANG_GUARD_S)


@dataclass(frozen=True)
class Refused:
    """The proxy answers the error itself."""

    status: int
    code: str


@dataclass(frozen=True)
class Cut:
    """The answer starts (`part`), then the client's connection is cut: never a clean end."""

    part: bytes


@dataclass(frozen=True)
class Whole:
    body: bytes


CUT_JSON = JSON_ANSWER + JSON_BODY.encode()[:50]
CUT_SSE = SSE_ANSWER + chunks_of(SSE_BODY[:90], 1 << 20)[:-5]
FAULTS = [
    pytest.param(garbage, Refused(502, "upstream_bad_response"), id="answers-garbage"),
    pytest.param(hang_up, Refused(502, "upstream_unreachable"), id="hangs-up-at-once"),
    pytest.param(reset_at_once, Refused(502, "upstream_unreachable"), id="resets-at-once"),
    pytest.param(partly(CUT_JSON, with_reset=True), Cut(b'{"object"'), id="resets-mid-body"),
    pytest.param(partly(CUT_JSON, with_reset=False), Cut(b'{"object"'), id="closes-mid-body"),
    pytest.param(partly(CUT_SSE, with_reset=True), Cut(SSE_BODY[:90]), id="resets-mid-stream"),
    pytest.param(
        bytewise(JSON_ANSWER + JSON_BODY.encode()),
        Whole(JSON_BODY.encode()),
        id="answers-a-byte-at-a-time",
    ),
    pytest.param(
        bytewise(SSE_ANSWER + chunks_of(SSE_BODY, 7)),
        Whole(SSE_BODY),
        id="streams-a-byte-at-a-time",
    ),
]


@pytest.mark.parametrize(("first", "expected"), FAULTS)
async def test_upstream_fault_gets_its_answer_and_leaks_nothing(
    raw_upstream: Callable[[Behaviour], Awaitable[RawUpstream]],
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    first: Behaviour,
    expected: Refused | Cut | Whole,
) -> None:
    upstream = await raw_upstream(first)
    base = await start_proxy(upstream.url, upstream={"read_timeout_s": DEADLINE_S})
    baseline = open_fds()

    async with client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS) as resp:
        if isinstance(expected, Refused):
            assert resp.status == expected.status
            assert (await resp.json())["error"]["code"] == expected.code
        elif isinstance(expected, Cut):
            assert resp.status == 200
            part = resp.content.readexactly(len(expected.part))
            got = await asyncio.wait_for(part, HANG_GUARD_S)
            assert got == expected.part
            upstream.proceed.set()
            with pytest.raises(aiohttp.ClientPayloadError):
                await asyncio.wait_for(resp.read(), HANG_GUARD_S)
        else:
            assert resp.status == 200
            assert await resp.read() == expected.body

    async with client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS) as resp:
        assert (resp.status, await resp.read()) == (200, OK_BODY)
    assert [request.endswith(CLEAN) for request in upstream.whole] == [True, True]
    assert await eventually(lambda: upstream.open == 0)
    assert await fds_after(baseline) <= baseline


async def test_client_leaving_mid_upload_aborts_the_upstream_request(
    raw_upstream: Callable[[Behaviour], Awaitable[RawUpstream]],
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
) -> None:
    # A pass-through body streams upstream as it arrives: the upstream has the head already.
    upstream = await raw_upstream(answer_ok)
    base = await start_proxy(upstream.url)
    baseline = open_fds()
    _, writer = await connect(base)
    try:
        writer.write(request_head("/v1/files", Content_Length=100_000) + b"x" * 1000)
        await writer.drain()
        await asyncio.wait_for(upstream.head_read.wait(), HANG_GUARD_S)
    finally:
        await close(writer)

    assert await eventually(lambda: upstream.open == 0)
    assert upstream.whole == []  # the upstream never took a part for the whole
    async with client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS) as resp:
        assert (resp.status, await resp.read()) == (200, OK_BODY)
    assert await eventually(lambda: upstream.open == 0)
    assert await fds_after(baseline) <= baseline


async def test_client_leaving_mid_stream_releases_the_upstream(
    raw_upstream: Callable[[Behaviour], Awaitable[RawUpstream]],
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
) -> None:
    upstream = await raw_upstream(stream_until_gone)
    base = await start_proxy(upstream.url)
    baseline = open_fds()

    async with client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS) as resp:
        assert resp.status == 200
        first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), HANG_GUARD_S)
        assert SSE_BODY.startswith(first)
        resp.close()  # the client hangs up mid-stream

    # The upstream sees the proxy close its end, and nothing is left open.
    assert await eventually(lambda: upstream.open == 0)
    async with client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS) as resp:
        assert (resp.status, await resp.read()) == (200, OK_BODY)
    assert await eventually(lambda: upstream.open == 0)
    assert await fds_after(baseline) <= baseline
