"""The defects of the hand-made upstream client, each on loopback: header bytes both ways,
truncated and early answers, oversized heads, stray bytes, HEAD, the connection limit,
pass-through WebSockets.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from tests.fixture_types import ProxyFactory
from tests.server.upstream_hop.exchanges import POLL_S, Wire, post
from tests.servers.wire import (
    GUARD_S,
    answer,
    exchange_raw,
    header_of,
    reset,
)

# Each defect the hand-made client had, found by a review on loopback.


@pytest.mark.parametrize(
    ("sent", "answered"),
    [
        pytest.param("café".encode(), "café".encode(), id="utf-8-latin-letter"),
        pytest.param("€".encode(), "€ ✓".encode(), id="utf-8-outside-latin-1"),
        pytest.param(b"plain ascii", b"plain ascii", id="ascii"),
    ],
)
async def test_header_bytes_beyond_ascii_are_relayed_unchanged_both_ways(
    wire: Wire, start_proxy: ProxyFactory, sent: bytes, answered: bytes
) -> None:
    """UTF-8 in a header value reaches the upstream, and the upstream's reaches the client,
    as the same bytes: never a 500, never re-encoded."""
    upstream = await wire([(answer(b"ok", b"X-Reply: " + answered), False)])
    proxy = await start_proxy(upstream.url)
    got = await exchange_raw(
        proxy,
        b"GET /v1/models HTTP/1.1\r\nHost: proxy\r\nX-Name: "
        + sent
        + b"\r\nConnection: close\r\n\r\n",
    )
    assert got.startswith(b"HTTP/1.1 200 "), got[:200]
    assert header_of(got, b"x-reply") == answered
    (seen,) = upstream.seen
    assert seen.header(b"x-name") == sent


async def test_a_client_header_that_is_not_utf8_is_refused(
    wire: Wire, start_proxy: ProxyFactory
) -> None:
    """Latin-1 bytes could not reach the upstream unchanged: 400 naming the header, and the
    upstream hears nothing."""
    upstream = await wire([(answer(b"ok"), False)])
    proxy = await start_proxy(upstream.url)
    got = await exchange_raw(
        proxy,
        b"GET /v1/models HTTP/1.1\r\nHost: proxy\r\nX-Name: caf\xe9\r\nConnection: close\r\n\r\n",
    )
    assert got.startswith(b"HTTP/1.1 400 "), got[:200]
    error = json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "invalid_header"
    assert "X-Name" in error["message"]
    assert upstream.seen == []


async def test_an_answer_header_that_is_not_utf8_is_a_bad_answer(
    wire: Wire, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    upstream = await wire([(answer(b"ok", b"X-Reply: caf\xe9"), False)])
    proxy = await start_proxy(upstream.url)
    async with client.get(proxy + "/v1/models") as got:
        assert got.status == 502
        assert (await got.json())["error"]["code"] == "upstream_bad_response"


async def test_an_answer_cut_by_a_reset_reaches_the_client_cut(
    wire: Wire, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """An answer delimited by the connection's close is incomplete when a reset ends it
    (RFC 9112 §8): the client's connection is cut, never ended cleanly."""
    relayed = asyncio.Event()

    async def cut(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\npartial")
        await writer.drain()
        await relayed.wait()
        reset(writer)

    upstream = await wire([cut])
    proxy = await start_proxy(upstream.url)
    async with client.get(proxy + "/v1/files/f/content") as got:
        assert got.status == 200
        assert await got.content.readexactly(7) == b"partial"
        relayed.set()
        with pytest.raises(aiohttp.ClientPayloadError):
            await got.read()
    assert len(upstream.seen) == 1


async def test_an_early_answer_is_relayed_while_the_upstream_stops_reading(
    wire: Wire, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """An upstream answers 413 after the head and reads no more of the body: the client gets
    that answer, and once it is gone the proxy lets go of the upstream connection."""
    client_done = asyncio.Event()
    closed_by_proxy = asyncio.Event()

    async def early(
        head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        writer.write(answer(b"too large", b"Connection: close", status=b"413 Payload Too Large"))
        await writer.drain()
        await client_done.wait()
        async with asyncio.timeout(GUARD_S):
            while await reader.read(1 << 20):
                pass
        closed_by_proxy.set()

    async def upload() -> AsyncIterator[bytes]:
        for _ in range(1024):  # at most 64 MiB; the upstream stops reading long before
            yield b"u" * (64 * 1024)

    upstream = await wire([early])
    proxy = await start_proxy(upstream.url)
    async with client.post(proxy + "/v1/files", data=upload()) as got:
        assert (got.status, await got.read()) == (413, b"too large")
    client_done.set()
    async with asyncio.timeout(GUARD_S):
        await closed_by_proxy.wait()


async def test_an_answer_head_past_the_limit_is_refused_unread(
    wire: Wire, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """A 64 MiB header value is a bad answer (502), and the proxy stops reading it early."""
    sent = [0]

    async def huge(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nX-Big: ")
        try:
            for _ in range(64):
                writer.write(b"a" * (1 << 20))
                await writer.drain()
                sent[0] += 1 << 20
            writer.write(b"\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        except ConnectionError:
            return

    upstream = await wire([huge])
    proxy = await start_proxy(upstream.url)
    status, payload = await post(client, proxy)
    assert status == 502
    assert json.loads(payload)["error"]["code"] == "upstream_bad_response"
    assert sent[0] < 64 << 20


async def test_stray_bytes_after_an_answer_do_not_spoil_the_next_request(
    wire: Wire, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """Half an answer nobody asked for, after a whole one: the next request is answered."""
    upstream = await wire(
        [(answer(b"one") + b"HTTP/1.1 200 OK\r\nContent-Le", False), (answer(b"two"), False)]
    )
    proxy = await start_proxy(upstream.url)
    for expected in (b"one", b"two"):
        async with client.get(proxy + "/v1/models") as got:
            assert (got.status, await got.read()) == (200, expected)


async def test_an_answer_to_head_has_no_body_and_keeps_its_connection(
    wire: Wire, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    # A HEAD answer announces the length of a body it does not send.
    head_answer = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nX-Kind: head\r\n\r\n"
    upstream = await wire([(head_answer, False), (answer(b"[]"), False)])
    proxy = await start_proxy(upstream.url)
    async with client.head(proxy + "/v1/models") as got:
        assert got.status == 200
        assert got.headers["X-Kind"] == "head"
        assert await got.read() == b""
    async with client.get(proxy + "/v1/models") as got:
        assert (got.status, await got.read()) == (200, b"[]")
    assert [s.request_line for s in upstream.seen] == [
        b"HEAD /v1/models HTTP/1.1",
        b"GET /v1/models HTTP/1.1",
    ]
    assert [s.connection for s in upstream.seen] == [1, 1]


async def open_streams(client: aiohttp.ClientSession, proxy: str) -> float:
    async with client.get(proxy + "/-/metrics") as got:
        for line in (await got.text()).splitlines():
            if line.startswith("replay_proxy_open_streams "):
                return float(line.split()[1])
    raise AssertionError("no open_streams gauge")


async def test_the_connection_limit_holds_requests_until_a_connection_is_free(
    wire: Wire, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """`upstream.max_connections: 1`: a second request waits for the first one's connection
    instead of opening another."""
    upstream = await wire([(answer(b"first"), False), (answer(b"second"), False)])
    upstream.hold[0] = asyncio.Event()
    proxy = await start_proxy(upstream.url, upstream={"max_connections": 1})

    async def get() -> tuple[int, bytes]:
        async with client.get(proxy + "/v1/models") as got:
            return got.status, await got.read()

    both = asyncio.gather(get(), get())
    for _ in range(int(GUARD_S / POLL_S)):
        if len(upstream.seen) == 1 and await open_streams(client, proxy) == 2:
            break
        await asyncio.sleep(POLL_S)
    else:
        raise AssertionError("the two requests did not both reach the proxy")
    upstream.hold[0].set()
    assert sorted(await both) == [(200, b"first"), (200, b"second")]
    # Both on one connection (each scrape checks readiness too: a connect that sends nothing).
    assert len({seen.connection for seen in upstream.seen}) == 1


class EchoSocket:
    """A WebSocket upstream: echoes text with a prefix and binary as it is, closes with 4002
    on `bye`, and records the path it was opened on and the close code it was sent."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.close_codes: list[int | None] = []
        self.two_closed = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.paths.append(request.path_qs)
        async for message in ws:
            if message.type == aiohttp.WSMsgType.TEXT and message.data == "bye":
                await ws.close(code=4002, message=b"upstream done")
            elif message.type == aiohttp.WSMsgType.TEXT:
                await ws.send_str("echo:" + message.data)
            elif message.type == aiohttp.WSMsgType.BINARY:
                await ws.send_bytes(message.data)
        self.close_codes.append(ws.close_code)
        if len(self.close_codes) == 2:
            self.two_closed.set()
        return ws


async def test_a_websocket_on_an_ungated_path_is_relayed_as_a_websocket(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    echo = EchoSocket()
    app = web.Application()
    app.router.add_get("/v1/realtime", echo.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        proxy = await start_proxy(str(server.make_url("")).rstrip("/"))
        # Under the normalised path, as every pass-through request.
        async with client.ws_connect(URL(proxy + "/v1//realtime?model=m", encoded=True)) as ws:
            await ws.send_str("hi")
            assert (await ws.receive_str()) == "echo:hi"
            await ws.send_bytes(b"\x00\x01")
            assert (await ws.receive_bytes()) == b"\x00\x01"
            await ws.send_str("bye")
            closing = await ws.receive()
            assert closing.type == aiohttp.WSMsgType.CLOSE
            assert ws.close_code == 4002
        async with client.ws_connect(proxy + "/v1/realtime") as ws:
            await ws.send_str("hello")
            assert (await ws.receive_str()) == "echo:hello"
            await ws.close(code=4001, message=b"client done")
        async with asyncio.timeout(GUARD_S):
            await echo.two_closed.wait()
        assert echo.paths == ["/v1/realtime?model=m", "/v1/realtime"]
        assert echo.close_codes[1] == 4001
    finally:
        await server.close()


async def test_an_ungated_websocket_the_upstream_refuses_gets_its_status(
    wire: Wire, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """The upgrade reaches the upstream as one (its Upgrade headers kept), and a refusal's
    status comes back."""
    upstream = await wire([(answer(b"no", status=b"403 Forbidden"), True)])
    proxy = await start_proxy(upstream.url)
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await client.ws_connect(proxy + "/v1/realtime")
    assert refused.value.status == 403
    (seen,) = upstream.seen
    assert seen.request_line == b"GET /v1/realtime HTTP/1.1"
    assert (seen.header(b"upgrade") or b"").lower() == b"websocket"
    assert seen.header(b"sec-websocket-key") is not None
