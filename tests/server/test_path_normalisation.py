"""Path normalisation: every alias of a gated path is gated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.builders import (
    JSON_HEADERS,
    at,
    audit_records,
    authority,
    clean_body,
    failing_body,
    odd_bytes,
)
from tests.fixture_types import ProxyFactory
from tests.servers.recording import RecordingUpstream
from tests.servers.wire import exchange_raw

ALIASES = [
    pytest.param("//v1//responses/", "/v1/responses", id="duplicate-slashes"),
    pytest.param("/v1/./responses", "/v1/responses", id="dot-segment"),
    pytest.param("/v1/x/../responses", "/v1/responses", id="dot-dot-segment"),
    pytest.param("/v1/respons%65s", "/v1/responses", id="encoded-unreserved"),
    pytest.param("/V1/Responses", "/v1/responses", id="case"),
    pytest.param("/v1%2Fresponses", "/v1/responses", id="encoded-slash"),
    pytest.param("/v1/responses;v=1", "/v1/responses", id="path-parameter"),
    pytest.param("/responses", "/responses", id="no-v1"),
    pytest.param("/v1/responses/compact", "/v1/responses/compact", id="compact"),
    pytest.param("/Responses/Compact/", "/responses/compact", id="no-v1-compact-aliased"),
]


@pytest.mark.parametrize(("target", "canonical"), ALIASES)
async def test_aliased_path_with_failing_body_is_blocked(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
    target: str,
    canonical: str,
) -> None:
    base = await start_proxy(recording_upstream.url)

    async with client.post(at(base, target + "?trace=1"), json=failing_body()) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["code"] == "replay_rejected"

    assert recording_upstream.received == []
    [record] = audit_records(tmp_path)
    assert record["path"] == canonical


@pytest.mark.parametrize(("target", "canonical"), ALIASES)
async def test_aliased_path_with_clean_body_reaches_the_canonical_path(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    target: str,
    canonical: str,
) -> None:
    base = await start_proxy(recording_upstream.url)
    sent = odd_bytes(clean_body())

    async with client.post(
        at(base, target + "?trace=1&b=%2F"), data=sent, headers=JSON_HEADERS
    ) as resp:
        assert resp.status == 200

    [got] = recording_upstream.received
    assert (got.method, got.target, got.body) == ("POST", canonical + "?trace=1&b=%2F", sent)


@pytest.mark.parametrize(
    ("body", "status", "forwarded"),
    [
        pytest.param(failing_body(), 400, False, id="failing"),
        pytest.param(clean_body(), 200, True, id="clean"),
    ],
)
async def test_absolute_form_target_is_gated(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    body: dict[str, Any],
    status: int,
    forwarded: bool,
) -> None:
    base = await start_proxy(recording_upstream.url)
    data = json.dumps(body).encode()
    head = (
        "POST http://api.example.test/V1/responses/?trace=1 HTTP/1.1\r\n"
        f"Host: {authority(base)}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n"
        "Connection: close\r\n\r\n"
    )

    answer = await exchange_raw(base, head.encode() + data)

    assert answer.startswith(f"HTTP/1.1 {status} ".encode())
    if forwarded:
        [got] = recording_upstream.received
        assert (got.target, got.body) == ("/v1/responses?trace=1", data)
    else:
        assert b"replay_rejected" in answer
        assert recording_upstream.received == []
