"""Framing: tiny chunks, ambiguous lengths, bodies that stop."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest

from tests.builders import CLEAN, FAILING, HANG_GUARD_S
from tests.fixture_types import ProxyFactory
from tests.server.checks import fds_after, open_fds, served_clean
from tests.servers.recording import RecordingUpstream
from tests.servers.wire import chunks_of, close, connect, read_answer, read_to_eof, request_head


async def send_bytewise(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Every byte a write of its own, with the event loop turned between them."""
    for i in range(len(data)):
        writer.write(data[i : i + 1])
        await writer.drain()
        await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("sent", "status"),
    [pytest.param(CLEAN, 200, id="clean"), pytest.param(FAILING, 400, id="failing")],
)
async def test_body_in_thousands_of_one_byte_chunks(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    sent: bytes,
    status: int,
) -> None:
    base = await start_proxy(recording_upstream.url)
    head = request_head(
        Content_Type="application/json", Transfer_Encoding="chunked", Connection="close"
    )
    reader, writer = await connect(base)
    try:
        await send_bytewise(writer, head + chunks_of(sent))
        answer = await asyncio.wait_for(read_answer(reader), HANG_GUARD_S)
    finally:
        await close(writer)

    assert answer.status == status
    if status == 200:
        [got] = recording_upstream.received
        assert (got.body, got.headers["Content-Length"]) == (sent, str(len(sent)))
    else:
        assert answer.error()["code"] == "replay_rejected"
        assert recording_upstream.received == []


FRAMING = [
    pytest.param(
        request_head(
            Content_Type="application/json",
            Content_Length=len(CLEAN),
            Transfer_Encoding="chunked",
        )
        + chunks_of(CLEAN, 64),
        id="content-length-and-transfer-encoding",
    ),
    pytest.param(
        request_head(Content_Type="application/json", Transfer_Encoding="chunked").replace(
            b"\r\n\r\n", f"\r\nContent-Length: {len(CLEAN)}\r\n\r\n".encode()
        )
        + chunks_of(CLEAN, 64),
        id="transfer-encoding-then-content-length",
    ),
    pytest.param(
        request_head(Content_Type="application/json", Content_Length=len(CLEAN)).replace(
            b"\r\n\r\n", b"\r\nContent-Length: 3\r\n\r\n"
        )
        + CLEAN,
        id="two-content-lengths",
    ),
    pytest.param(
        request_head(Content_Type="application/json", Transfer_Encoding="chunked")
        + b"zz\r\n"
        + CLEAN
        + b"\r\n0\r\n\r\n",
        id="chunk-size-not-hex",
    ),
    pytest.param(
        request_head(Content_Type="application/json", Content_Length="-1") + CLEAN,
        id="negative-content-length",
    ),
]


@pytest.mark.parametrize("request_bytes", FRAMING)
async def test_ambiguous_framing_is_refused_and_never_forwarded(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    request_bytes: bytes,
) -> None:
    # aiohttp's parser refuses these before any of the proxy's code runs, with its own
    # text/plain 400 (the request never reaches a handler that could shape it), and closes.
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    base = await start_proxy(recording_upstream.url)
    reader, writer = await connect(base)
    try:
        writer.write(request_bytes)
        await writer.drain()
        answer = await asyncio.wait_for(read_to_eof(reader), HANG_GUARD_S)
    finally:
        await close(writer)

    assert answer.startswith((b"HTTP/1.0 400 ", b"HTTP/1.1 400 "))
    assert recording_upstream.received == []
    await served_clean(client, base, recording_upstream)
    # The client's fault is logged as such: one line, no traceback, not an error.
    (logged,) = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert logged.levelno <= logging.INFO
    assert logged.exc_info is None
    assert logged.getMessage().startswith("Error handling request from")


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_body_that_stops_midway_is_never_forwarded(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    framing: str,
) -> None:
    base = await start_proxy(recording_upstream.url)
    await served_clean(client, base, recording_upstream)  # the upstream connection is pooled
    baseline = open_fds()
    if framing == "content-length":
        head = request_head(Content_Type="application/json", Content_Length=len(CLEAN) + 1000)
        part = CLEAN
    else:
        head = request_head(Content_Type="application/json", Transfer_Encoding="chunked")
        part = chunks_of(CLEAN, 64)[:-5]  # every chunk but the last
    reader, writer = await connect(base)
    try:
        # The interim answer says the handler is reading the body: then the client leaves.
        writer.write(head.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n"))
        await writer.drain()
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HANG_GUARD_S)
        assert interim.startswith(b"HTTP/1.1 100 ")
        writer.write(part)
        await writer.drain()
    finally:
        await close(writer)

    await served_clean(client, base, recording_upstream)
    assert [r.body for r in recording_upstream.received] == [CLEAN, CLEAN]
    assert await fds_after(baseline) <= baseline
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
