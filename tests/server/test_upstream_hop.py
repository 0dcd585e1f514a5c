"""The upstream hop on the wire, through the real proxy: keep-alive reuse, every way an answer
may be framed, HEAD, connections the upstream closes, header bytes both ways, truncated and
early answers, oversized heads, the connection limit, pass-through WebSockets, TLS and
forward proxies.

The upstream here is a bare socket server that answers from a script, so that the bytes on
the wire are exactly those of each case; the proxy and the client are real.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from tests.builders import JSON_HEADERS, SALES_TOOL, sales_call, sales_output
from tests.conftest import ProxyFactory
from tests.servers.wire import (
    GUARD_S,
    ForwardProxy,
    ScriptedWire,
    Step,
    answer,
    chunked,
    exchange_raw,
    header_of,
    reset,
)

POLL_S = 0.01
CLEAN = json.dumps(
    {
        "model": "m",
        "tools": [SALES_TOOL],
        "input": [{"role": "user", "content": "hi"}, sales_call("c1"), sales_output("c1")],
    }
).encode()

Wire = Callable[..., Awaitable[ScriptedWire]]


@pytest.fixture
async def wire() -> AsyncIterator[Wire]:
    """Start a scripted upstream; `tls` (a server context) makes it an https one."""
    servers: list[tuple[asyncio.Server, ScriptedWire]] = []

    async def start(script: list[Step], tls: ssl.SSLContext | None = None) -> ScriptedWire:
        upstream = ScriptedWire(script)
        server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0, ssl=tls)
        servers.append((server, upstream))
        scheme = "https" if tls else "http"
        upstream.url = f"{scheme}://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return upstream

    yield start
    for server, upstream in servers:
        server.close()
        await upstream.stop()
        await server.wait_closed()


@pytest.fixture
async def forward_proxy() -> AsyncIterator[ForwardProxy]:
    proxy = ForwardProxy()
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    proxy.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    yield proxy
    server.close()
    await proxy.stop()
    await server.wait_closed()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=GUARD_S)) as session:
        yield session


async def post(client: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    async with client.post(url + "/v1/responses", data=CLEAN, headers=JSON_HEADERS) as got:
        return got.status, await got.read()


def tls_pair(tmp_path: Path) -> tuple[trustme.CA, ssl.SSLContext, Path]:
    """A CA, a server context for 127.0.0.1 it issued, and the CA's certificate as a file."""
    ca = trustme.CA()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(tls)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return ca, tls, ca_file


# Moved from the tests of the hand-made client the proxy had: they hold for the proxy as a whole.


async def test_an_https_upstream_is_reached_when_its_certificate_is_trusted(
    wire: Wire,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The system's trust store decides (here SSL_CERT_FILE, which OpenSSL reads): a trusted
    upstream is reached over TLS, an untrusted one is 502 and hears nothing."""
    _, tls, ca_file = tls_pair(tmp_path)
    upstream = await wire([(answer(b"over tls"), False)], tls)
    untrusted = await start_proxy(upstream.url)
    status, payload = await post(client, untrusted)
    assert status == 502
    assert json.loads(payload)["error"]["code"] == "upstream_unreachable"
    # The reason is the operator's to read, in the log; the client is told only what failed.
    assert b"CERTIFICATE_VERIFY_FAILED" not in payload
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text
    assert upstream.seen == []
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    trusted = await start_proxy(upstream.url)
    assert await post(client, trusted) == (200, b"over tls")
    assert upstream.seen[0].header(b"host") == upstream.url.removeprefix("https://").encode()


async def test_sequential_requests_share_one_upstream_connection(
    wire: Wire, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    upstream = await wire([(answer(b'{"n":%d}' % i), False) for i in range(5)])
    proxy = await start_proxy(upstream.url)
    for i in range(5):
        assert await post(client, proxy) == (200, b'{"n":%d}' % i)
    assert [s.connection for s in upstream.seen] == [1] * 5
    assert all(s.body == CLEAN for s in upstream.seen)
    assert upstream.seen[0].request_line == b"POST /v1/responses HTTP/1.1"
    assert upstream.seen[0].header(b"content-length") == str(len(CLEAN)).encode()


@pytest.mark.parametrize(
    ("wire_answer", "expected"),
    [
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunked(b'{"a":', b'"b"', b"}"),
            b'{"a":"b"}',
            id="chunked",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + b"x" * 70000,
            b"x" * 70000,
            id="ended-by-close",
        ),
        pytest.param(
            b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n"
            b"HTTP/1.1 100 Continue\r\n\r\n" + answer(b"final"),
            b"final",
            id="after-interim-answers",
        ),
        pytest.param(answer(b"y" * (4 << 20)), b"y" * (4 << 20), id="4-mib"),
    ],
)
async def test_every_framing_of_an_answer_arrives_whole(
    wire: Wire,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    wire_answer: bytes,
    expected: bytes,
) -> None:
    ends_by_close = b"Content-Length" not in wire_answer and b"chunked" not in wire_answer
    upstream = await wire([(wire_answer, ends_by_close), (answer(b"next"), False)])
    proxy = await start_proxy(upstream.url)
    assert await post(client, proxy) == (200, expected)
    assert await post(client, proxy) == (200, b"next")
    # A connection whose answer ended with it is never offered a second request.
    assert [s.connection for s in upstream.seen] == ([1, 2] if ends_by_close else [1, 1])


async def test_an_idle_connection_the_upstream_closed_is_not_reused(
    wire: Wire, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """The upstream answers and closes without saying so: the next request, idempotent, goes
    out on a new connection, whether or not the proxy saw the close before sending it."""
    upstream = await wire([(answer(b"one"), True), (answer(b"two"), False)])
    proxy = await start_proxy(upstream.url)
    for expected in (b"one", b"two"):
        async with client.get(proxy + "/v1/models") as got:
            assert (got.status, await got.read()) == (200, expected)
    assert [s.connection for s in upstream.seen] == [1, 2]


async def parts() -> AsyncIterator[bytes]:
    for part in (b"alpha ", b"beta ", b"gamma"):
        yield part


@pytest.mark.parametrize(
    ("streamed", "framing"),
    [
        pytest.param(True, (b"transfer-encoding", b"chunked"), id="unknown-length-chunked"),
        pytest.param(False, (b"content-length", b"16"), id="known-length"),
    ],
)
async def test_a_pass_through_body_goes_upstream_whole_in_its_framing(
    wire: Wire,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    streamed: bool,
    framing: tuple[bytes, bytes],
) -> None:
    upstream = await wire([(answer(b"stored"), False)])
    proxy = await start_proxy(upstream.url)
    data = parts() if streamed else b"alpha beta gamma"
    async with client.post(proxy + "/v1/files", data=data) as got:
        assert (got.status, await got.read()) == (200, b"stored")
    (seen,) = upstream.seen
    name, value = framing
    other = b"content-length" if name == b"transfer-encoding" else b"transfer-encoding"
    assert (seen.header(name), seen.header(other)) == (value, None)
    assert seen.body == b"alpha beta gamma"


async def test_a_second_answer_to_one_request_is_never_relayed(
    wire: Wire, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """Bytes after a whole answer cannot belong to the next request: that connection goes."""
    upstream = await wire([(answer(b"one") + answer(b"stray"), False), (answer(b"two"), False)])
    proxy = await start_proxy(upstream.url)
    assert await post(client, proxy) == (200, b"one")
    assert await post(client, proxy) == (200, b"two")
    assert [s.connection for s in upstream.seen] == [1, 2]


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
    assert upstream.connections == 1


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


# Proxies, CA bundles and client certificates.


async def test_an_http_proxy_from_the_environment_carries_the_hop(
    wire: Wire,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    forward_proxy: ForwardProxy,
) -> None:
    upstream = await wire([(answer(b"via proxy"), False)])
    proxy = await start_proxy(upstream.url, environ={"HTTP_PROXY": forward_proxy.url})
    assert await post(client, proxy) == (200, b"via proxy")
    assert forward_proxy.lines == [b"POST " + upstream.url.encode() + b"/v1/responses HTTP/1.1"]
    assert upstream.seen[0].body == CLEAN


@pytest.mark.parametrize(
    ("environ", "settings"),
    [
        pytest.param({"NO_PROXY": "127.0.0.1"}, {}, id="no-proxy-names-the-host"),
        pytest.param({"no_proxy": "*"}, {}, id="no-proxy-star"),
        pytest.param({}, {"trust_env": False}, id="trust-env-false"),
    ],
)
async def test_a_proxy_the_settings_exclude_is_not_used(
    wire: Wire,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    forward_proxy: ForwardProxy,
    environ: dict[str, str],
    settings: dict[str, Any],
) -> None:
    upstream = await wire([(answer(b"direct"), False)])
    proxy = await start_proxy(
        upstream.url, environ={"HTTP_PROXY": forward_proxy.url, **environ}, upstream=settings
    )
    assert await post(client, proxy) == (200, b"direct")
    assert forward_proxy.lines == []


async def test_an_https_upstream_through_a_tunnel_with_its_own_ca_file(
    wire: Wire,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    forward_proxy: ForwardProxy,
    tmp_path: Path,
) -> None:
    """HTTPS_PROXY is tunnelled to with CONNECT; `upstream.ca_file` is the trust the TLS hop
    checks the upstream's certificate against."""
    _, tls, ca_file = tls_pair(tmp_path)
    upstream = await wire([(answer(b"tunnelled"), False)], tls)
    proxy = await start_proxy(
        upstream.url,
        environ={"HTTPS_PROXY": forward_proxy.url},
        upstream={"ca_file": str(ca_file)},
    )
    assert await post(client, proxy) == (200, b"tunnelled")
    authority = upstream.url.removeprefix("https://").encode()
    assert forward_proxy.lines == [b"CONNECT " + authority + b" HTTP/1.1"]
    assert upstream.seen[0].body == CLEAN


async def test_a_client_certificate_is_presented_to_an_upstream_that_requires_one(
    wire: Wire, start_proxy: ProxyFactory, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    ca, tls, ca_file = tls_pair(tmp_path)
    tls.verify_mode = ssl.CERT_REQUIRED
    ca.configure_trust(tls)
    issued = ca.issue_cert("replay-proxy.test")
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    upstream = await wire([(answer(b"mutual"), False)], tls)
    without = await start_proxy(upstream.url, upstream={"ca_file": str(ca_file)})
    status, _ = await post(client, without)
    assert status == 502
    assert upstream.seen == []
    with_cert = await start_proxy(
        upstream.url,
        upstream={"ca_file": str(ca_file), "client_cert": str(cert), "client_key": str(key)},
    )
    assert await post(client, with_cert) == (200, b"mutual")
