"""The upstream hop on the wire: keep-alive reuse, every way an answer may be framed, interim
answers, HEAD, idle connections the upstream closes, and streamed request bodies.

The upstream here is a bare socket server that answers from a script, so that the bytes on
the wire are exactly those of each case; the proxy and the client are real.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
import trustme
from yarl import URL

from proxy import http1
from tests.conftest import SALES_TOOL, ProxyFactory, sales_call, sales_output

GUARD_S = 10
POLL_S = 0.01
CLEAN = json.dumps(
    {
        "model": "m",
        "tools": [SALES_TOOL],
        "input": [{"role": "user", "content": "hi"}, sales_call("c1"), sales_output("c1")],
    }
).encode()
JSON_HEADERS = {"Content-Type": "application/json"}


def answer(body: bytes, *head: bytes, status: bytes = b"200 OK") -> bytes:
    lines = [b"HTTP/1.1 " + status, *head, b"Content-Length: %d" % len(body)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def chunked(*chunks: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


@dataclass
class Seen:
    connection: int
    head: bytes
    body: bytes

    @property
    def request_line(self) -> bytes:
        return self.head.split(b"\r\n", 1)[0]

    def header(self, name: bytes) -> bytes | None:
        found = re.search(rb"(?im)^" + re.escape(name) + rb":[ \t]*(.*?)[ \t]*\r$", self.head)
        return found[1] if found else None


# What the upstream does with one request: the bytes it answers, and whether it then closes.
Step = tuple[bytes, bool]


@dataclass
class ScriptedWire:
    """Answers the n-th request it reads with `script[n]`, on whichever connection it came."""

    script: list[Step]
    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    closed: int = 0
    writers: dict[int, asyncio.StreamWriter] = field(default_factory=dict)

    def hang_up(self, connections: list[int]) -> None:
        """Close these connections (by number), unannounced, as a server ending idle ones does."""
        for number in connections:
            self.writers[number].close()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self.writers[number] = writer
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                seen = Seen(number, head, b"")
                seen.body = await read_body(reader, seen)
                self.seen.append(seen)
                data, close_after = self.script[len(self.seen) - 1]
                writer.write(data)
                await writer.drain()
                if close_after:
                    return
        except ConnectionError:
            return
        finally:
            self.writers.pop(number, None)
            writer.close()
            with suppress(ConnectionError):
                await writer.wait_closed()
            self.closed += 1


async def read_body(reader: asyncio.StreamReader, seen: Seen) -> bytes:
    length = seen.header(b"content-length")
    if length is not None:
        return await reader.readexactly(int(length))
    if (seen.header(b"transfer-encoding") or b"").lower() != b"chunked":
        return b""
    body = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        body += await reader.readexactly(size)
        await reader.readexactly(2)
        if size == 0:
            return bytes(body)


Wire = Callable[..., Awaitable[ScriptedWire]]


@pytest.fixture
async def wire() -> AsyncIterator[Wire]:
    """Start a scripted upstream; `tls` (a server context) makes it an https one."""
    servers: list[asyncio.Server] = []

    async def start(script: list[Step], tls: ssl.SSLContext | None = None) -> ScriptedWire:
        upstream = ScriptedWire(script)
        server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0, ssl=tls)
        servers.append(server)
        scheme = "https" if tls else "http"
        upstream.url = f"{scheme}://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return upstream

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=GUARD_S)) as session:
        yield session


async def post(client: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    async with client.post(url + "/v1/responses", data=CLEAN, headers=JSON_HEADERS) as got:
        return got.status, await got.read()


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
    ca = trustme.CA()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(tls)
    upstream = await wire([(answer(b"over tls"), False)], tls)
    untrusted = await start_proxy(upstream.url)
    status, payload = await post(client, untrusted)
    assert status == 502
    assert json.loads(payload)["error"]["code"] == "upstream_unreachable"
    # The reason is the operator's to read, in the log; the client is told only what failed.
    assert b"CERTIFICATE_VERIFY_FAILED" not in payload
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text
    assert upstream.seen == []
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
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


async def test_an_answer_to_head_has_no_body_and_the_hop_goes_on(
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


async def test_the_pool_lets_go_of_connections_the_upstream_closed(wire: Wire) -> None:
    """A burst leaves idle connections behind. When the upstream closes the older ones while
    the newest is still in use, the pool lets go of them without waiting to reuse them."""
    burst = 5
    upstream = await wire([(answer(b"%d" % n), False) for n in range(1, burst + 2)])
    pool = http1.Pool(URL(upstream.url), connect_timeout_s=GUARD_S, read_timeout_s=GUARD_S)
    try:
        held = []
        for n in range(1, burst + 1):  # each on a connection of its own, the n-th on the n-th
            got = await pool.request("GET", "/v1/models", (), None)
            assert b"".join([chunk async for chunk in got.chunks()]) == b"%d" % n
            held.append(got)
        for got in held:
            got.release()
        assert pool.idle == burst
        upstream.hang_up(list(range(1, burst)))
        for _ in range(int(GUARD_S / POLL_S)):
            if upstream.closed == burst - 1:
                break
            await asyncio.sleep(POLL_S)
        await asyncio.sleep(POLL_S)  # for the pool's side to read the closes
        got = await pool.request("GET", "/v1/models", (), None)
        assert b"".join([chunk async for chunk in got.chunks()]) == b"%d" % (burst + 1)
        got.release()
        assert upstream.seen[-1].connection == burst  # the newest was reused
        assert pool.idle == 1  # and the closed ones are gone
    finally:
        pool.close()
