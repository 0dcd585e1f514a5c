"""Behind Envoy, the transport is Envoy's: SSE streams through unbuffered, clients may speak
HTTP/2, and with the processor down gated requests are refused, never forwarded."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.builders import (
    HANG_GUARD_S,
    JSON_HEADERS,
    clean_body,
    failing_body,
    odd_bytes,
    request_body,
    sales_call,
    sales_output,
)
from tests.servers.recording import Received, RecordingUpstream

CREATED = b'event: response.created\ndata: {"type":"response.created"}\n\n'
COMPLETED = (
    b"event: response.completed\n"
    b'data: {"type":"response.completed","response":'
    b'{"object":"response","id":"resp_sse","output":[]}}\n\n'
)


async def test_sse_events_arrive_before_the_stream_ends(
    recording_upstream: RecordingUpstream, behind_envoy: Callable[..., Any]
) -> None:
    release = asyncio.Event()

    async def stream(request: web.Request, received: Received) -> web.StreamResponse:
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await answer.prepare(request)
        await answer.write(CREATED)
        # The rest only once the client has the first event: a buffering hop never gets it.
        await asyncio.wait_for(release.wait(), HANG_GUARD_S)
        await answer.write(COMPLETED)
        await answer.write_eof()
        return answer

    recording_upstream.handler = stream
    envoy = await behind_envoy(recording_upstream.url)
    async with (
        aiohttp.ClientSession() as client,
        client.post(
            f"{envoy.url}/v1/responses", data=odd_bytes(clean_body()), headers=JSON_HEADERS
        ) as resp,
    ):
        assert resp.status == 200
        first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), HANG_GUARD_S)
        assert first == CREATED
        release.set()
        assert await resp.read() == COMPLETED


async def curl_http2(url: str, data: bytes, tmp_path: Path) -> tuple[str, int, dict[str, Any]]:
    """POST over HTTP/2 with prior knowledge (h2c); the version, status and JSON answer."""
    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("curl is not installed (Debian's curl speaks HTTP/2 through nghttp2)")
    sent = tmp_path / "body.json"
    sent.write_bytes(data)
    process = await asyncio.create_subprocess_exec(
        curl,
        "-sS",
        "--http2-prior-knowledge",
        "-H",
        "content-type: application/json",
        "--data-binary",
        f"@{sent}",
        "-w",
        "\n%{http_version} %{http_code}",
        url,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(process.communicate(), HANG_GUARD_S)
    answer, _, tail = out.rpartition(b"\n")
    version, code = tail.decode().split()
    return version, int(code), json.loads(answer)


@pytest.mark.parametrize(
    ("body", "status"),
    [pytest.param(clean_body(), 200, id="clean"), pytest.param(failing_body(), 400, id="block")],
)
async def test_http2_from_client_to_envoy(
    recording_upstream: RecordingUpstream,
    behind_envoy: Callable[..., Any],
    tmp_path: Path,
    body: dict[str, Any],
    status: int,
) -> None:
    envoy = await behind_envoy(recording_upstream.url)
    version, code, answer = await curl_http2(f"{envoy.url}/v1/responses", odd_bytes(body), tmp_path)
    assert (version, code) == ("2", status)
    if status == 400:
        assert answer["error"]["code"] == "replay_rejected"
        assert recording_upstream.received == []
    else:
        (received,) = recording_upstream.received
        assert received.body == odd_bytes(body)


async def test_processor_down_refuses_gated_requests(
    recording_upstream: RecordingUpstream, behind_envoy: Callable[..., Any]
) -> None:
    """`failure_mode_allow: false`: with the processor killed, Envoy refuses what it would have
    gated and forwards none of it; a path the route keeps from the processor still passes."""
    envoy = await behind_envoy(recording_upstream.url, ledger={"backend": "memory"})
    process = envoy.processor.process
    assert process is not None
    async with aiohttp.ClientSession() as client:
        async with client.post(
            f"{envoy.url}/v1/responses", data=odd_bytes(clean_body()), headers=JSON_HEADERS
        ) as resp:
            assert resp.status == 200  # up: forwarded
        assert len(recording_upstream.received) == 1

        os.kill(process.pid, signal.SIGKILL)
        await asyncio.to_thread(process.wait, HANG_GUARD_S)
        recording_upstream.received.clear()
        for target in ("/v1/responses", "/V1/Responses/", "/v1/responses/compact"):
            async with client.post(
                f"{envoy.url}{target}", data=odd_bytes(clean_body()), headers=JSON_HEADERS
            ) as resp:
                assert resp.status == 503, target
                error = (await resp.json())["error"]
                assert (error["type"], error["code"]) == ("server_error", "gate_unavailable")
        assert recording_upstream.received == []

        async with client.get(f"{envoy.url}/v1/models") as resp:
            assert resp.status == 200
        assert [r.target for r in recording_upstream.received] == ["/v1/models"]


async def test_a_chunked_body_past_envoys_buffer_is_refused_in_the_api_shape(
    recording_upstream: RecordingUpstream, behind_envoy: Callable[..., Any]
) -> None:
    """Without a Content-Length the processor cannot refuse it before it is read: Envoy's buffer
    limit (sized for limits.max_body_bytes) does, and its answer is mapped to the API's shape."""
    envoy = await behind_envoy(recording_upstream.url)

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"input":"'
        for _ in range(12):
            yield b"a" * 100_000
        yield b'"}'

    async with (
        aiohttp.ClientSession() as client,
        client.post(f"{envoy.url}/v1/responses", data=chunks(), headers=JSON_HEADERS) as resp,
    ):
        assert resp.status == 413
        assert resp.content_type == "application/json"
        error = (await resp.json())["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "body_too_large")
    assert recording_upstream.received == []


async def test_a_chunked_body_that_is_stripped_goes_up_with_its_length(
    recording_upstream: RecordingUpstream, behind_envoy: Callable[..., Any]
) -> None:
    envoy = await behind_envoy(recording_upstream.url)
    stripped = request_body(sales_call("call_1", status="in_progress"), sales_output("call_1"))
    sent = odd_bytes(stripped)

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(sent), 100):
            yield sent[start : start + 100]

    async with (
        aiohttp.ClientSession() as client,
        client.post(f"{envoy.url}/v1/responses", data=chunks(), headers=JSON_HEADERS) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["x-replay-gate"] == "stripped=1"
    (received,) = recording_upstream.received
    assert received.json() == request_body()
    assert received.headers["Content-Length"] == str(len(received.body))
    assert "Transfer-Encoding" not in received.headers
