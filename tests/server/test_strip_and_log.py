"""strip and log over real HTTP: what is forwarded and what is recorded."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.builders import (
    FINDING,
    JSON_HEADERS,
    UPSTREAM_ANSWER,
    USER,
    at,
    audit_records,
    compact,
    failing_body,
    odd_bytes,
    request_body,
    sales_call,
    sales_output,
)
from tests.fixture_types import ProxyFactory
from tests.servers.recording import RecordingUpstream


async def test_strip_forwards_compact_json_without_the_pair(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    base = await start_proxy(recording_upstream.url, gate={"action": "strip"})
    good_call, good_output = sales_call("call_0"), sales_output("call_0")
    bad_call, bad_output = sales_call("call_1", "mars"), sales_output("call_1")
    body = request_body(good_call, good_output, bad_call, bad_output)
    sent = gzip.compress(odd_bytes(body))
    headers = JSON_HEADERS | {"Content-Encoding": "gzip", "Authorization": "Bearer sk-strip"}

    async with client.post(at(base, "/v1/responses?x=1"), data=sent, headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["x-replay-gate"] == "stripped=1"
        assert await resp.json() == UPSTREAM_ANSWER

    [got] = recording_upstream.received
    assert got.target == "/v1/responses?x=1"
    assert got.body == compact(request_body(good_call, good_output))
    assert got.headers["Content-Length"] == str(len(got.body))
    assert "Content-Encoding" not in got.headers
    assert got.headers["Content-Type"] == "application/json"
    assert got.headers["Authorization"] == "Bearer sk-strip"
    [record] = audit_records(tmp_path)
    assert record["action"] == "strip"
    assert record["body_sha256"] == hashlib.sha256(sent).hexdigest()
    assert record["findings"] == [FINDING | {"index": 4, "paired_index": 3}]


async def test_strip_keeps_integers_beyond_64_bits(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
) -> None:
    base = await start_proxy(recording_upstream.url, gate={"action": "strip"})
    body = failing_body(metadata={"n": 2**64, "m": -(2**70)})

    async with client.post(at(base, "/v1/responses"), json=body) as resp:
        assert resp.status == 200
        assert resp.headers["x-replay-gate"] == "stripped=1"

    [got] = recording_upstream.received
    assert got.json() == {**body, "input": [USER]}


async def test_log_forwards_unchanged_and_records(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    base = await start_proxy(recording_upstream.url, gate={"action": "log"})
    sent = odd_bytes(failing_body())

    async with client.post(at(base, "/v1/responses"), data=sent, headers=JSON_HEADERS) as resp:
        assert resp.status == 200
        assert resp.headers["x-replay-gate"] == "logged=1"
        assert await resp.json() == UPSTREAM_ANSWER

    [got] = recording_upstream.received
    assert got.body == sent
    assert got.headers["Content-Length"] == str(len(sent))
    [record] = audit_records(tmp_path)
    assert record["action"] == "log"
    assert record["findings"] == [FINDING]


NAMESPACED_CALL = sales_call("call_ns", type="openai:function_call")


@pytest.mark.parametrize(
    ("items", "status", "forwarded", "gate_header"),
    [
        pytest.param(
            [NAMESPACED_CALL, sales_output("call_ns")],
            200,
            [],
            "stripped=1",
            id="namespaced-stripped",
        ),
        pytest.param(
            [sales_call("call_1", "mars"), sales_output("call_1")],
            400,
            None,
            None,
            id="schema-blocked",
        ),
        pytest.param(
            [
                sales_call("call_1"),
                sales_output("call_1"),
                NAMESPACED_CALL,
                sales_output("call_ns"),
            ],
            200,
            [sales_call("call_1"), sales_output("call_1")],
            "stripped=1",
            id="clean-pair-kept",
        ),
    ],
)
async def test_per_reason_action_overrides_the_default(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    items: list[Any],
    status: int,
    forwarded: list[Any] | None,
    gate_header: str | None,
) -> None:
    base = await start_proxy(
        recording_upstream.url, gate={"action": "block", "actions": {"namespaced": "strip"}}
    )
    body = request_body(*items)

    async with client.post(at(base, "/v1/responses"), json=body) as resp:
        assert resp.status == status
        assert resp.headers.get("x-replay-gate") == gate_header

    if forwarded is None:
        assert recording_upstream.received == []
    else:
        [got] = recording_upstream.received
        assert got.body == compact(request_body(*forwarded))
