"""Clean gated requests over real HTTP: forwarded byte for byte."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.builders import (
    ENCODE,
    JSON_HEADERS,
    UPSTREAM_ANSWER,
    at,
    audit_records,
    authority,
    clean_body,
    odd_bytes,
    stream_of,
)
from tests.fixture_types import ProxyFactory
from tests.servers.recording import Received, RecordingUpstream


@pytest.mark.parametrize("coding", ["identity", "gzip", "deflate", "br"])
async def test_clean_request_is_forwarded_byte_for_byte(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
    coding: str,
) -> None:
    base = await start_proxy(recording_upstream.url)
    judged = odd_bytes(clean_body())
    sent = ENCODE[coding](judged)
    headers = JSON_HEADERS | {"Authorization": "Bearer sk-clean", "x-foo": "bar"}
    if coding != "identity":
        headers["Content-Encoding"] = coding

    async with client.post(at(base, "/v1/responses?trace=1"), data=sent, headers=headers) as resp:
        assert resp.status == 200
        assert await resp.json() == UPSTREAM_ANSWER
        assert "x-replay-gate" not in resp.headers

    # Byte for byte as judged: a coded body goes upstream decoded, its coding removed.
    [got] = recording_upstream.received
    assert (got.method, got.target, got.body) == ("POST", "/v1/responses?trace=1", judged)
    assert "Content-Encoding" not in got.headers
    assert got.headers["Content-Length"] == str(len(judged))
    assert got.headers["Content-Type"] == "application/json"
    assert got.headers["Host"] == authority(recording_upstream.url)
    assert got.headers["Authorization"] == "Bearer sk-clean"
    assert got.headers["x-foo"] == "bar"
    assert audit_records(tmp_path) == []


async def test_clean_chunked_request_is_forwarded_whole_with_its_length(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
) -> None:
    base = await start_proxy(recording_upstream.url)
    sent = odd_bytes(clean_body())
    parts = [sent[:7], sent[7:100], sent[100:]]

    async with client.post(
        at(base, "/v1/responses"), data=stream_of(*parts), headers=JSON_HEADERS
    ) as resp:
        assert resp.status == 200

    [got] = recording_upstream.received
    assert got.body == sent
    assert got.headers["Content-Length"] == str(len(sent))
    assert "Transfer-Encoding" not in got.headers


@pytest.mark.parametrize(
    ("method", "target", "data"),
    [
        pytest.param("POST", "/v1/responses", odd_bytes(clean_body()), id="gated"),
        pytest.param("POST", "/v1/other", b"plain text", id="pass-through"),
        pytest.param("GET", "/v1/models", None, id="pass-through-get"),
    ],
)
async def test_hop_by_hop_headers_are_dropped_both_ways(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    method: str,
    target: str,
    data: bytes | None,
) -> None:
    async def with_hop_headers(request: web.Request, received: Received) -> web.StreamResponse:
        headers = {
            "Connection": "x-upstream-hop",
            "x-upstream-hop": "1",
            "Keep-Alive": "timeout=9",
            "x-upstream-kept": "yes",
        }
        return web.json_response(UPSTREAM_ANSWER, headers=headers)

    recording_upstream.handler = with_hop_headers
    base = await start_proxy(recording_upstream.url)
    hop_by_hop = {
        "Connection": "keep-alive, x-hop",
        "x-hop": "named in Connection",
        "Keep-Alive": "timeout=5",
        "Proxy-Connection": "keep-alive",
        "TE": "trailers",
        "Trailer": "x-checksum",
        "Upgrade": "h2c",
        "Proxy-Authorization": "Basic dXNlcjpwYXNz",
    }
    end_to_end = {"Authorization": "Bearer sk-hop", "x-foo": "bar", "Accept": "application/json"}

    async with client.request(
        method, at(base, target), data=data, headers=JSON_HEADERS | hop_by_hop | end_to_end
    ) as resp:
        assert resp.status == 200
        assert await resp.json() == UPSTREAM_ANSWER
        assert resp.headers["x-upstream-kept"] == "yes"
        assert "x-upstream-hop" not in resp.headers
        assert "Keep-Alive" not in resp.headers

    [got] = recording_upstream.received
    assert (got.method, got.target, got.body) == (method, target, data or b"")
    for name in hop_by_hop:
        assert name not in got.headers, name
    for name, value in end_to_end.items():
        assert got.headers[name] == value
    assert got.headers["Host"] == authority(recording_upstream.url)
