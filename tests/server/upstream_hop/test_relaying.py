"""The upstream hop on the wire: keep-alive reuse, every framing of an answer, closed idle
connections, pass-through bodies whole.

The upstream here is a bare socket server that answers from a script, so that the bytes on
the wire are exactly those of each case; the proxy and the client are real.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.fixture_types import ProxyFactory
from tests.server.upstream_hop.exchanges import CLEAN, Wire, post, tls_pair
from tests.servers.wire import (
    answer,
    chunked,
)

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
