"""Pass-through: paths that are not gated go upstream untouched."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from tests.builders import (
    HANG_GUARD_S,
    UPSTREAM_ANSWER,
    at,
    audit_records,
    authority,
    clean_body,
    stream_of,
)
from tests.fixture_types import ProxyFactory
from tests.servers.recording import Received, RecordingUpstream


@pytest.mark.parametrize(
    ("method", "target", "parts", "content_type"),
    [
        pytest.param("GET", "/v1/models?limit=2", None, None, id="get-models"),
        pytest.param("DELETE", "/v1/responses/resp_1", None, None, id="delete-response"),
        pytest.param("GET", "/v1/responses", None, None, id="get-gated-path-no-body"),
        pytest.param("OPTIONS", "/v1/responses", None, None, id="options-gated-path"),
        pytest.param("HEAD", "/v1/models", None, None, id="head"),
        pytest.param(
            "GET", "/v1/responses/resp_1/input_items?order=asc&after=a%2Fb", None, None, id="query"
        ),
        pytest.param(
            "POST",
            "/v1/other?x=1",
            [b"not json, ", b"streamed ", b"in parts\n"],
            "text/plain",
            id="post-streamed-text",
        ),
        pytest.param(
            "PUT", "/v1/files/f_1", [b"\x00\x01\xff binary"], "application/octet-stream", id="put"
        ),
    ],
)
async def test_pass_through_request_reaches_the_upstream_unchanged(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
    method: str,
    target: str,
    parts: list[bytes] | None,
    content_type: str | None,
) -> None:
    base = await start_proxy(recording_upstream.url)
    data = None if parts is None else stream_of(*parts)
    headers = {} if content_type is None else {"Content-Type": content_type}

    async with client.request(method, at(base, target), data=data, headers=headers) as resp:
        assert resp.status == 200
        assert await resp.read() == (
            b"" if method == "HEAD" else json.dumps(UPSTREAM_ANSWER).encode()
        )

    [got] = recording_upstream.received
    assert (got.method, got.target) == (method, target)
    assert got.body == b"".join(parts or [])
    assert got.headers.get("Content-Type") == content_type
    if parts is not None:
        # The client sent no length; a proxy that streams cannot know one either.
        assert got.headers["Transfer-Encoding"] == "chunked"
    assert audit_records(tmp_path) == []


async def test_pass_through_request_body_is_streamed_not_buffered(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    first_arrived = asyncio.Event()

    async def upload(request: web.Request) -> web.Response:
        first = await request.content.readexactly(5)
        first_arrived.set()
        return web.Response(body=first + await request.content.read())

    async def parts() -> AsyncIterator[bytes]:
        yield b"part1"
        # The upstream must see part 1 before part 2 exists: nothing in between buffers it.
        await asyncio.wait_for(first_arrived.wait(), HANG_GUARD_S)
        yield b"part2"

    app = web.Application()
    app.router.add_post("/v1/uploads", upload)
    upstream = TestServer(app, host="127.0.0.1")
    await upstream.start_server()
    try:
        base = await start_proxy(str(upstream.make_url("")).rstrip("/"))
        async with client.post(at(base, "/v1/uploads"), data=parts()) as resp:
            assert resp.status == 200
            assert await resp.read() == b"part1part2"
    finally:
        await upstream.close()


@pytest.mark.parametrize(
    ("method", "target", "body"),
    [
        pytest.param("GET", "/v1/models", None, id="pass-through"),
        pytest.param("POST", "/v1/responses", clean_body(), id="gated"),
    ],
)
@pytest.mark.parametrize(
    ("status", "reason", "headers", "answer"),
    [
        pytest.param(200, "OK", {"Content-Type": "application/json"}, b'{"ok":true}', id="200"),
        pytest.param(
            404,
            "Not Found",
            {"Content-Type": "application/json"},
            b'{"error":{"message":"no such model","type":"not_found","param":null,"code":null}}',
            id="404",
        ),
        pytest.param(
            418,
            "Short And Stout",
            {"Content-Type": "text/plain", "x-teapot": "yes", "Set-Cookie": "a=1"},
            b"I'm a teapot",
            id="418",
        ),
        pytest.param(500, "Internal Server Error", {}, b"upstream broke", id="500"),
        pytest.param(400, "Bad Request", {"x-request-id": "req_up"}, b"{}", id="upstream-400"),
    ],
)
async def test_upstream_answer_of_any_status_comes_back_unchanged(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    method: str,
    target: str,
    body: dict[str, Any] | None,
    status: int,
    reason: str,
    headers: dict[str, str],
    answer: bytes,
) -> None:
    async def answer_with(request: web.Request, received: Received) -> web.StreamResponse:
        response = web.Response(status=status, reason=reason, body=answer, headers=headers)
        response.headers.add("Set-Cookie", "b=2")
        return response

    recording_upstream.handler = answer_with
    base = await start_proxy(recording_upstream.url)

    async with client.request(method, at(base, target), json=body) as resp:
        assert (resp.status, resp.reason) == (status, reason)
        assert await resp.read() == answer
        for name, value in headers.items():
            # The upstream's own request id is kept aside; `x-request-id` is the proxy's.
            shown = "x-upstream-request-id" if name.lower() == "x-request-id" else name
            assert resp.headers.getall(shown)[0] == value
        assert resp.headers.getall("Set-Cookie")[-1] == "b=2"
        assert len(resp.headers.getall("Set-Cookie")) == len({"Set-Cookie"} & set(headers)) + 1
        assert "x-replay-gate" not in resp.headers
    assert len(recording_upstream.received) == 1


@pytest.mark.parametrize(
    ("target", "body"),
    [
        pytest.param("/v1/responses", clean_body(), id="gated"),
        pytest.param("/v1/other", {"any": "thing"}, id="pass-through"),
    ],
)
async def test_expect_100_continue_is_honoured(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    target: str,
    body: dict[str, Any],
) -> None:
    # curl sends `Expect: 100-continue` for large bodies and waits for the interim answer.
    base = await start_proxy(recording_upstream.url)
    data = json.dumps(body).encode()
    url = URL(base)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(
            f"POST {target} HTTP/1.1\r\nHost: {authority(base)}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            "Expect: 100-continue\r\nConnection: close\r\n\r\n".encode()
        )
        await writer.drain()
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HANG_GUARD_S)
        assert interim.startswith(b"HTTP/1.1 100 ")
        writer.write(data)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), HANG_GUARD_S)
    finally:
        writer.close()
        await writer.wait_closed()

    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.endswith(json.dumps(UPSTREAM_ANSWER).encode())
    [got] = recording_upstream.received
    assert (got.target, got.body) == (target, data)
