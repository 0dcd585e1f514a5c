"""The upstream reads what the gate judged: decoded bodies, headers that keep their meaning,
and every WebSocket frame judged whatever its `type`."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import re
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import brotli
import pytest
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from tests.builders import (
    HANG_GUARD_S,
    SALES_TOOL,
    USER,
    audit_records,
    raw_deflate,
    sales_call,
    sales_output,
)
from tests.fixture_types import ProxyFactory
from tests.servers.recording import Received, RecordingUpstream


def body_of(*items: Any) -> bytes:
    """A body as some client might write it, so that a re-serialising proxy would show."""
    body = {"tools": [SALES_TOOL], "input": [USER, *items], "model": "m"}
    return json.dumps(body, indent="\t", separators=(" ,", " :  ")).encode() + b"\r\n"


CLEAN = body_of(sales_call("call_1"), sales_output("call_1"))
FAILING = body_of(sales_call("call_1", "mars"), sales_output("call_1"))


Encode = Callable[[bytes], bytes]
CODINGS = [
    pytest.param(["gzip"], gzip.compress, id="gzip"),
    pytest.param(["x-gzip"], gzip.compress, id="x-gzip"),
    pytest.param(["deflate"], zlib.compress, id="deflate"),
    pytest.param(["deflate"], raw_deflate, id="raw-deflate"),
    pytest.param(["br"], brotli.compress, id="br"),
    pytest.param(["gzip, br"], lambda d: brotli.compress(gzip.compress(d)), id="gzip-then-br"),
    pytest.param(
        ["gzip", "br"], lambda d: brotli.compress(gzip.compress(d)), id="two-header-lines"
    ),
    # aiohttp as an upstream decodes a single coding token only: it must never see this.
    pytest.param(["identity, br"], brotli.compress, id="identity-then-br"),
    pytest.param(["BR, Identity"], brotli.compress, id="br-then-identity-any-case"),
    pytest.param(["identity"], lambda d: d, id="identity"),
]


@pytest.mark.parametrize(
    ("action", "sent_body"),
    [pytest.param("block", CLEAN, id="clean"), pytest.param("log", FAILING, id="logged")],
)
@pytest.mark.parametrize(("content_encoding", "encode"), CODINGS)
async def test_a_coded_body_goes_upstream_decoded(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    content_encoding: list[str],
    encode: Encode,
    action: str,
    sent_body: bytes,
) -> None:
    """The recording upstream ignores a request's Content-Encoding (it records the raw bytes),
    as many servers do: what it parses must be exactly the document the gate judged."""
    base = await start_proxy(recording_upstream.url, gate={"action": action})
    sent = encode(sent_body)
    headers = CIMultiDict({"Content-Type": "application/json"})
    for value in content_encoding:
        headers.add("Content-Encoding", value)

    async with (
        aiohttp.ClientSession(auto_decompress=False) as client,
        client.post(URL(base + "/v1/responses", encoded=True), data=sent, headers=headers) as resp,
    ):
        assert resp.status == 200

    [got] = recording_upstream.received
    assert got.body == sent_body
    assert "Content-Encoding" not in got.headers
    assert got.headers["Content-Length"] == str(len(sent_body))
    if action == "log":
        [record] = audit_records(tmp_path)
        assert record["body_sha256"] == hashlib.sha256(sent).hexdigest()


async def exchange(base: str, head: str, body: bytes) -> tuple[int, dict[str, Any] | None]:
    """Send an exact request head and body on a connection of their own: the answer's status
    and its JSON body (None if it is not JSON)."""
    url = URL(base)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HANG_GUARD_S)
        length = re.search(rb"(?im)^content-length:\s*(\d+)", answer)
        assert length is not None, answer
        payload = await asyncio.wait_for(reader.readexactly(int(length[1])), HANG_GUARD_S)
    finally:
        writer.close()
        await writer.wait_closed()
    try:
        parsed = json.loads(payload)
    except ValueError:
        parsed = None
    return int(answer.split(b" ", 2)[1]), parsed


TARGETS = [
    pytest.param("POST", "/v1/responses", CLEAN, id="gated"),
    pytest.param("POST", "/v1/other", b"plain text", id="pass-through"),
    pytest.param("PUT", "/v1/files/f_1", b"\x00\x01", id="pass-through-put"),
]
CONNECTIONS = [
    pytest.param(["content-type"], 400, id="content-type"),
    pytest.param(["Content-Encoding"], 400, id="content-encoding"),
    pytest.param(["keep-alive, CONTENT-LENGTH"], 400, id="content-length-second"),
    pytest.param(["close ,transfer-encoding , x-hop"], 400, id="transfer-encoding-amid"),
    pytest.param(["keep-alive", "Content-Type"], 400, id="second-header-line"),
    pytest.param(["keep-alive, x-hop"], 200, id="other-names-pass"),
    pytest.param(["keep-alive, content-typed, x-hop"], 200, id="a-longer-name-passes"),
]


@pytest.mark.parametrize(("method", "target", "data"), TARGETS)
@pytest.mark.parametrize(("connection", "status"), CONNECTIONS)
async def test_connection_may_not_drop_a_header_that_gives_the_body_its_meaning(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    method: str,
    target: str,
    data: bytes,
    connection: list[str],
    status: int,
) -> None:
    base = await start_proxy(recording_upstream.url)
    lines = [
        f"{method} {target} HTTP/1.1",
        f"Host: {URL(base).raw_authority}",
        "Content-Type: application/json",
        f"Content-Length: {len(data)}",
        "x-hop: named in Connection",
        *(f"Connection: {value}" for value in connection),
    ]

    got_status, answer = await exchange(base, "\n".join(lines) + "\n", data)

    assert got_status == status
    if status == 400:
        assert answer is not None
        error = answer["error"]
        assert (error["type"], error["code"]) == (
            "invalid_request_error",
            "invalid_connection_header",
        )
        assert error["message"]
        assert recording_upstream.received == []
    else:
        [got] = recording_upstream.received
        assert (got.method, got.target, got.body) == (method, target, data)
        assert "x-hop" not in got.headers


async def test_an_answers_connection_header_does_not_drop_its_content_encoding(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory
) -> None:
    """The tap reads the answer decoded by its Content-Encoding; the client must be able to."""
    coded = gzip.compress(b'{"object":"response","id":"resp_1","output":[]}')

    async def gzipped(request: web.Request, received: Received) -> web.StreamResponse:
        headers = {
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",
            "Connection": "content-encoding, content-type, x-upstream-hop",
            "x-upstream-hop": "1",
        }
        return web.Response(body=coded, headers=headers)

    recording_upstream.handler = gzipped
    base = await start_proxy(recording_upstream.url)

    async with (
        aiohttp.ClientSession(auto_decompress=False) as client,
        client.post(
            base + "/v1/responses", data=CLEAN, headers={"Content-Type": "application/json"}
        ) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Encoding"] == "gzip"
        assert resp.headers["Content-Type"] == "application/json"
        assert "x-upstream-hop" not in resp.headers
        assert await resp.read() == coded


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


FAILING_INPUT = [sales_call("call_1", "mars"), sales_output("call_1")]
FRAMES = [
    pytest.param({"input": FAILING_INPUT}, True, id="no-type"),
    pytest.param({"type": "Response.Create", "input": FAILING_INPUT}, True, id="other-case"),
    pytest.param({"type": "response.append", "input": FAILING_INPUT}, True, id="other-type"),
    pytest.param({"type": None, "input": FAILING_INPUT}, True, id="null-type"),
    pytest.param({"type": "response.create", "input": FAILING_INPUT}, True, id="response-create"),
    pytest.param({"type": "session.update", "session": {}}, False, id="nothing-to-gate"),
    pytest.param({"input": "hello"}, False, id="no-type-clean"),
]


@pytest.mark.parametrize(("frame", "refused"), FRAMES)
async def test_every_websocket_frame_is_judged_whatever_its_type(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    session: aiohttp.ClientSession,
    frame: dict[str, Any],
    refused: bool,
) -> None:
    """The spec gives a client event's `type` the default `response.create`: an upstream may
    read a frame without one, or with another, as a request."""
    base = await start_proxy(recording_upstream.url)
    text = json.dumps({"model": "m", "tools": [SALES_TOOL], **frame})
    async with session.ws_connect(base + "/v1/responses") as ws:
        await ws.send_str(text)
        event = json.loads(await ws.receive_str(timeout=HANG_GUARD_S))

    if refused:
        assert (event["type"], event["status"]) == ("error", 400)
        assert event["error"]["code"] == "replay_rejected"
        assert recording_upstream.frames == []
    else:
        assert event["type"] == "response.completed"
        assert recording_upstream.frames == [text]
