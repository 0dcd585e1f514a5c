"""The proxy over real HTTP on 127.0.0.1: what the client saw and what the upstream received."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import re
import zlib
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import brotli
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families
from yarl import URL

from proxy.running.config_file import parse_config
from proxy.running.workers import free_port
from proxy.server.app import make_app
from tests.conftest import (
    AUDIT_FIELDS,
    SALES_TOOL,
    ProxyFactory,
    Received,
    RecordingUpstream,
    audit_records,
    sales_call,
    sales_output,
)

# Generous bounds that only stop a hang; nothing here waits for time to pass.
HANG_GUARD_S = 10

USER = {"role": "user", "content": "How did APAC do last quarter?"}
JSON = {"Content-Type": "application/json"}
ENCODE: dict[str, Callable[[bytes], bytes]] = {
    "identity": lambda data: data,
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
}
FINDING = {
    "index": 2,
    "call_id": "call_1",
    "paired_index": 1,
    "name": "get_latest_sales_report",
    "reason": "arguments_schema",
    "fail": [{"path": "/region", "reason": "enum"}],
}
UPSTREAM_ANSWER = {"object": "response", "id": "resp_1", "output": []}


def request_body(*items: Any, **fields: Any) -> dict[str, Any]:
    # Keys deliberately not in sorted order: a re-serialising proxy would show.
    return {"tools": [SALES_TOOL], "input": [USER, *items], "model": "gpt-test"} | fields


def clean_body(**fields: Any) -> dict[str, Any]:
    return request_body(sales_call("call_1"), sales_output("call_1"), **fields)


def failing_body(**fields: Any) -> dict[str, Any]:
    return request_body(sales_call("call_1", "mars"), sales_output("call_1"), **fields)


def odd_bytes(body: Any) -> bytes:
    """The body as some client might write it: tabs, spaces before commas, a CRLF at the end."""
    return json.dumps(body, indent="\t", separators=(" ,", " :  ")).encode() + b"\r\n"


def compact(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def at(base: str, target: str) -> URL:
    """The URL of a raw target, sent exactly as written (no normalisation by the client)."""
    return URL(base + target, encoded=True)


def authority(url: str) -> str:
    return URL(url).raw_authority


async def stream_of(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


@pytest.fixture
async def serve_proxy(tmp_path: Path) -> AsyncIterator[ProxyFactory]:
    """Like `start_proxy`, but run the way `running.serving.serve` runs it: an `AppRunner` with
    aiohttp's defaults, where a handler is not cancelled when its client goes away (the
    `TestServer` behind `start_proxy` cancels it, which would hide the proxy's own handling)."""
    runners: list[web.AppRunner] = []

    async def start(upstream: str) -> str:
        config = parse_config(
            {"upstream": {"url": upstream}, "audit": {"path": str(tmp_path / "audit.jsonl")}}
        )
        runner = web.AppRunner(
            make_app(config), handle_signals=False, access_log=None, shutdown_timeout=1
        )
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


async def exchange_raw(base: str, request: bytes) -> bytes:
    """Send exact request bytes on a connection of their own; the whole answer, to EOF."""
    url = URL(base)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), HANG_GUARD_S)
    finally:
        writer.close()
        await writer.wait_closed()


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text, or None when there is no such sample."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


async def scrape(client: aiohttp.ClientSession, base: str) -> str:
    async with client.get(at(base, "/-/metrics")) as resp:
        assert resp.status == 200
        assert resp.content_type == "text/plain"
        return await resp.text()


# 1. Clean gated requests: byte for byte


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
    headers = JSON | {"Authorization": "Bearer sk-clean", "x-foo": "bar"}
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

    async with client.post(at(base, "/v1/responses"), data=stream_of(*parts), headers=JSON) as resp:
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
        method, at(base, target), data=data, headers=JSON | hop_by_hop | end_to_end
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


# 2. Blocked requests: the answer, nothing upstream, the audit record


@pytest.mark.parametrize(
    ("coding", "include_arguments"),
    [("identity", False), ("gzip", False), ("identity", True)],
)
async def test_blocked_request(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
    coding: str,
    include_arguments: bool,
) -> None:
    base = await start_proxy(recording_upstream.url, audit={"include_arguments": include_arguments})
    secret = "sk-secret-never-in-the-log"
    sent = ENCODE[coding](odd_bytes(failing_body(previous_response_id="resp_prev")))
    headers = JSON | {"Authorization": f"Bearer {secret}"}
    if coding != "identity":
        headers["Content-Encoding"] = coding

    async with client.post(at(base, "/v1/responses"), data=sent, headers=headers) as resp:
        assert resp.status == 400
        assert resp.content_type == "application/json"
        assert resp.headers["x-should-retry"] == "false"
        request_id = resp.headers["x-request-id"]
        answer = await resp.json()

    assert answer == {
        "error": {
            "type": "invalid_request_error",
            "code": "replay_rejected",
            "param": "input[2]",
            "message": "input[2] (call_id call_1): paired function_call failed the replay gate: "
            "arguments_schema at /region (enum)",
            "findings": [FINDING],
            "request_id": request_id,
        }
    }
    assert recording_upstream.received == []

    log_text = (tmp_path / "audit.jsonl").read_text()
    [record] = audit_records(tmp_path)
    assert set(record) == AUDIT_FIELDS
    assert datetime.fromisoformat(record["ts"]).tzinfo is not None
    assert record["event"] == "replay_rejected"
    assert re.fullmatch(r"req_[0-9a-f]{32}", record["request_id"])
    assert record["request_id"] == request_id
    assert record["action"] == "block"
    assert record["transport"] == "http"
    assert record["path"] == "/v1/responses"
    assert record["model"] == "gpt-test"
    assert record["previous_response_id"] == "resp_prev"
    assert isinstance(record["tenant"], str)
    assert record["tenant"]
    assert secret not in log_text
    assert secret not in record["tenant"]
    assert record["body_sha256"] == hashlib.sha256(sent).hexdigest()
    if include_arguments:
        assert record["findings"] == [FINDING | {"arguments": '{"region": "mars"}'}]
    else:
        assert record["findings"] == [FINDING]
        assert "mars" not in log_text


async def test_tenant_is_a_stable_fingerprint_of_the_credential(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    base = await start_proxy(recording_upstream.url)
    credentials = [
        {"Authorization": "Bearer sk-alice"},
        {"Authorization": "Bearer sk-alice"},
        {"Authorization": "Bearer sk-bob"},
        {"api-key": "azure-key-carol"},
        {},
    ]
    for credential in credentials:
        async with client.post(
            at(base, "/v1/responses"), json=failing_body(), headers=credential
        ) as resp:
            assert resp.status == 400

    alice, alice_again, bob, carol, nobody = (r["tenant"] for r in audit_records(tmp_path))
    assert alice == alice_again
    assert len({alice, bob, carol}) == 3
    assert nobody is None
    log_text = (tmp_path / "audit.jsonl").read_text()
    for secret in ("sk-alice", "sk-bob", "azure-key-carol"):
        assert secret not in log_text
    assert recording_upstream.received == []


async def test_any_blocking_finding_blocks_and_every_finding_is_listed(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    base = await start_proxy(
        recording_upstream.url, gate={"action": "strip", "actions": {"orphan": "block"}}
    )
    body = failing_body()
    body["input"].append(sales_output("call_gone"))

    async with client.post(at(base, "/v1/responses"), json=body) as resp:
        assert resp.status == 400
        assert resp.headers["x-should-retry"] == "false"
        error = (await resp.json())["error"]

    orphan = {
        "index": 3,
        "call_id": "call_gone",
        "paired_index": None,
        "name": None,
        "reason": "orphan",
    }
    assert error["code"] == "replay_rejected"
    assert error["param"] == "input[3]"
    assert error["message"].endswith("(and 1 more finding)")
    assert error["findings"] == [FINDING, orphan]
    assert recording_upstream.received == []
    [record] = audit_records(tmp_path)
    assert record["action"] == "block"
    assert record["findings"] == [FINDING, orphan]


# 3. strip and log


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
    headers = JSON | {"Content-Encoding": "gzip", "Authorization": "Bearer sk-strip"}

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

    async with client.post(at(base, "/v1/responses"), data=sent, headers=JSON) as resp:
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


# 4. Path normalisation

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

    async with client.post(at(base, target + "?trace=1&b=%2F"), data=sent, headers=JSON) as resp:
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


# 5. Pass-through


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


# 6. Streaming

EVENT_1 = b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n'
EVENT_2 = b'event: response.completed\ndata: {"type":"response.completed","sequence_number":1}\n\n'
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("method", "target", "body"),
    [
        pytest.param("POST", "/v1/responses", clean_body(stream=True), id="gated"),
        pytest.param("GET", "/v1/responses/resp_1?stream=true", None, id="pass-through"),
    ],
)
async def test_sse_reaches_the_client_event_by_event(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    method: str,
    target: str,
    body: dict[str, Any] | None,
) -> None:
    first_read = asyncio.Event()

    async def sse(request: web.Request, received: Received) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(EVENT_1)
        # The next event exists only once the client has read the first through the proxy.
        await first_read.wait()
        await response.write(EVENT_2)
        await response.write(DONE)
        await response.write_eof()
        return response

    recording_upstream.handler = sse
    base = await start_proxy(recording_upstream.url)
    try:
        async with client.request(method, at(base, target), json=body) as resp:
            assert resp.status == 200
            assert resp.content_type == "text/event-stream"
            first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), HANG_GUARD_S)
            assert first == EVENT_1
            assert metric(await scrape(client, base), "replay_proxy_open_streams") == 1
            first_read.set()
            rest = await asyncio.wait_for(resp.content.read(), HANG_GUARD_S)
            assert rest == EVENT_2 + DONE
    finally:
        first_read.set()
    [got] = recording_upstream.received
    assert (got.method, got.target) == (method, target)


# 7. Bodies the proxy cannot read unambiguously: never forwarded

LIMIT = 4096
GZIPPED = gzip.compress(json.dumps(clean_body()).encode())
CLEAN_CALL = json.dumps(sales_call("call_1"))
# The same call with `arguments` twice: a last-wins parser reads a clean call, a first-wins one not.
DUPLICATED = CLEAN_CALL.replace(
    '"arguments"', '"arguments": "{\\"region\\": \\"mars\\"}", "arguments"'
)
BAD_INPUT = [
    pytest.param({}, b"{}", 415, "unsupported_media_type", id="no-content-type"),
    pytest.param({"Content-Type": "text/plain"}, b"{}", 415, "unsupported_media_type", id="text"),
    pytest.param(
        {"Content-Type": "application/x-www-form-urlencoded"},
        b"input=hi",
        415,
        "unsupported_media_type",
        id="form",
    ),
    pytest.param(
        {"Content-Type": "application/json; charset=latin-1"},
        b"{}",
        415,
        "unsupported_charset",
        id="latin-1",
    ),
    pytest.param(
        JSON | {"Content-Encoding": "compress"},
        b"{}",
        415,
        "unsupported_content_encoding",
        id="compress-coding",
    ),
    pytest.param(
        JSON, b'{"input": "' + b"a" * LIMIT + b'"}', 413, "body_too_large", id="too-large-raw"
    ),
    pytest.param(
        JSON,
        [b'{"input": "', b"a" * LIMIT, b'"}'],
        413,
        "body_too_large",
        id="too-large-raw-chunked",
    ),
    pytest.param(
        JSON | {"Content-Encoding": "gzip"},
        gzip.compress(b'{"input": "' + b"a" * (1 << 20) + b'"}'),
        413,
        "body_too_large",
        id="gzip-bomb",
    ),
    pytest.param(
        JSON | {"Content-Encoding": "br"},
        brotli.compress(b'{"input": "' + b"a" * (1 << 20) + b'"}'),
        413,
        "body_too_large",
        id="br-bomb",
    ),
    pytest.param(JSON, b"input=hello", 400, "invalid_json", id="not-json"),
    pytest.param(JSON, b"", 400, "invalid_json", id="empty"),
    pytest.param(JSON, b'{"input": []} {}', 400, "invalid_json", id="trailing-data"),
    pytest.param(JSON, b'[{"input": []}]', 400, "invalid_body", id="not-an-object"),
    pytest.param(JSON, b'{"input": 42}', 400, "invalid_input", id="input-number"),
    pytest.param(JSON, b'{"input": {"role": "user"}}', 400, "invalid_input", id="input-object"),
    pytest.param(JSON, b'{"model": "a", "model": "b"}', 400, "invalid_json", id="duplicate-key"),
    pytest.param(
        JSON,
        f'{{"input": [{DUPLICATED}, {json.dumps(sales_output("call_1"))}]}}'.encode(),
        400,
        "invalid_json",
        id="duplicate-key-at-depth",
    ),
    pytest.param(JSON, b'{"input": [], "temperature": NaN}', 400, "invalid_json", id="nan"),
    pytest.param(JSON, b'{"input": [], "top_p": Infinity}', 400, "invalid_json", id="infinity"),
    pytest.param(JSON, b'{"input": "caf\xe9"}', 400, "invalid_json", id="invalid-utf-8"),
    pytest.param(JSON, b'{"input": "\\ud83d"}', 400, "invalid_json", id="lone-surrogate"),
    pytest.param(
        JSON | {"Content-Encoding": "gzip"},
        GZIPPED[:12] + bytes(b ^ 0xFF for b in GZIPPED[12:40]) + GZIPPED[40:],
        400,
        "invalid_content_encoding",
        id="corrupt-gzip",
    ),
    pytest.param(
        JSON | {"Content-Encoding": "gzip"},
        GZIPPED[: len(GZIPPED) // 2],
        400,
        "invalid_content_encoding",
        id="truncated-gzip",
    ),
]


@pytest.mark.parametrize("path", ["/v1/responses", "/responses/compact"])
@pytest.mark.parametrize(("headers", "data", "status", "code"), BAD_INPUT)
async def test_unreadable_body_is_answered_and_never_forwarded(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
    path: str,
    headers: dict[str, str],
    data: bytes | list[bytes],
    status: int,
    code: str,
) -> None:
    base = await start_proxy(recording_upstream.url, limits={"max_body_bytes": LIMIT})
    payload = stream_of(*data) if isinstance(data, list) else data

    async with client.post(
        at(base, path), data=payload, headers=headers, skip_auto_headers={"Content-Type"}
    ) as resp:
        assert resp.status == status
        assert resp.content_type == "application/json"
        error = (await resp.json())["error"]

    assert error["type"] == "invalid_request_error"
    assert error["code"] == code
    assert isinstance(error["message"], str)
    assert error["message"]
    assert recording_upstream.received == []
    assert audit_records(tmp_path) == []


@pytest.mark.parametrize(
    "content_type",
    ["application/json; charset=utf-8", "application/json;charset=UTF-8", "Application/JSON"],
)
async def test_json_content_type_with_charset_is_accepted(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    content_type: str,
) -> None:
    base = await start_proxy(recording_upstream.url)
    sent = odd_bytes(clean_body())

    async with client.post(
        at(base, "/v1/responses"), data=sent, headers={"Content-Type": content_type}
    ) as resp:
        assert resp.status == 200

    [got] = recording_upstream.received
    assert (got.body, got.headers["Content-Type"]) == (sent, content_type)


# 8. Upstream failures and a client that hangs up


@pytest.mark.parametrize(
    ("method", "target", "body"),
    [
        pytest.param("POST", "/v1/responses", clean_body(), id="gated"),
        pytest.param("GET", "/v1/models", None, id="pass-through"),
    ],
)
async def test_unreachable_upstream_is_502(
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    method: str,
    target: str,
    body: dict[str, Any] | None,
) -> None:
    port = free_port("127.0.0.1")
    base = await start_proxy(f"http://127.0.0.1:{port}")

    async with client.request(method, at(base, target), json=body) as resp:
        assert resp.status == 502
        assert resp.content_type == "application/json"
        error = (await resp.json())["error"]
    assert error["code"] == "upstream_unreachable"
    assert error["type"] == "server_error"
    assert str(port) not in error["message"]


@pytest.mark.parametrize(
    ("method", "target", "body"),
    [
        pytest.param("POST", "/v1/responses", clean_body(), id="gated"),
        pytest.param("GET", "/v1/models", None, id="pass-through"),
    ],
)
async def test_silent_upstream_is_504(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    method: str,
    target: str,
    body: dict[str, Any] | None,
) -> None:
    answered = asyncio.Event()

    async def never_answer(request: web.Request, received: Received) -> web.StreamResponse:
        await answered.wait()
        return web.Response(status=204)

    recording_upstream.handler = never_answer
    base = await start_proxy(recording_upstream.url, upstream={"read_timeout_s": 0.5})
    try:
        async with client.request(method, at(base, target), json=body) as resp:
            assert resp.status == 504
            assert resp.content_type == "application/json"
            error = (await resp.json())["error"]
    finally:
        answered.set()
    assert error["code"] == "upstream_timeout"
    [got] = recording_upstream.received
    assert (got.method, got.target) == (method, target)


@pytest.mark.parametrize("served", [True, False], ids=["as-served", "handler-cancellation"])
async def test_client_hanging_up_mid_stream_releases_the_upstream(
    recording_upstream: RecordingUpstream,
    serve_proxy: ProxyFactory,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    served: bool,
) -> None:
    allowed, wrote, gone = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def endless(request: web.Request, received: Received) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        # However the loss shows (a failed write, a closed transport, the handler cancelled by
        # the server), the upstream has noticed that the proxy went away.
        try:
            while request.transport is not None and not request.transport.is_closing():
                await response.write(b"data: tick\n\n")
                wrote.set()
                await allowed.wait()
                allowed.clear()
        except ConnectionResetError:
            pass
        finally:
            gone.set()
        return response

    async def allow_writes_until_gone() -> None:
        # One chunk per round until the upstream sees that the proxy went away.
        while not gone.is_set():
            wrote.clear()
            allowed.set()
            waiters = {asyncio.ensure_future(wrote.wait()), asyncio.ensure_future(gone.wait())}
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()

    recording_upstream.handler = endless
    base = await (serve_proxy if served else start_proxy)(recording_upstream.url)
    try:
        async with client.get(at(base, "/v1/responses/resp_1?stream=true")) as resp:
            first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), HANG_GUARD_S)
            assert first == b"data: tick\n\n"
            resp.close()  # the client hangs up mid-stream
        await asyncio.wait_for(allow_writes_until_gone(), HANG_GUARD_S)
    finally:
        gone.set()
        allowed.set()

    async def models(request: web.Request, received: Received) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": []})

    recording_upstream.handler = models
    async with client.get(at(base, "/v1/models")) as resp:
        assert resp.status == 200
        assert await resp.json() == {"object": "list", "data": []}
    assert metric(await scrape(client, base), "replay_proxy_open_streams") == 0
    assert [r.target for r in recording_upstream.received] == [
        "/v1/responses/resp_1?stream=true",
        "/v1/models",
    ]


# 9. Admin endpoints


async def test_healthy(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    base = await start_proxy(recording_upstream.url)

    async with client.get(at(base, "/-/healthy")) as resp:
        assert resp.status == 200

    assert recording_upstream.received == []


async def test_metrics_count_requests_findings_gate_time_and_streams(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    base = await start_proxy(recording_upstream.url)
    requests: list[tuple[str, str, Any, int]] = [
        ("POST", "/v1/responses", clean_body(), 200),
        ("POST", "/v1/responses", failing_body(), 400),
        ("POST", "/v1/responses/compact", failing_body(), 400),
        ("POST", "/v1/responses", [], 400),
        ("GET", "/v1/models", None, 200),
    ]
    for method, target, body, status in requests:
        async with client.request(method, at(base, target), json=body) as resp:
            assert resp.status == status

    text = await scrape(client, base)

    requests_total = "replay_proxy_requests_total"
    assert metric(text, requests_total, route="responses", outcome="forward") == 1
    assert metric(text, requests_total, route="responses", outcome="block") == 1
    assert metric(text, requests_total, route="responses_compact", outcome="block") == 1
    assert metric(text, requests_total, route="responses", outcome="invalid") == 1
    assert metric(text, requests_total, route="passthrough", outcome="forward") == 1
    findings = "replay_proxy_findings_total"
    assert metric(text, findings, reason="arguments_schema", action="block") == 2
    assert "# TYPE replay_proxy_gate_seconds histogram" in text
    assert metric(text, "replay_proxy_gate_seconds_count") == 3
    assert metric(text, "replay_proxy_gate_seconds_bucket", le="+Inf") == 3
    assert metric(text, "replay_proxy_open_streams") == 0
    assert [r.target for r in recording_upstream.received] == ["/v1/responses", "/v1/models"]


async def test_verdict_cache_gauge_counts_what_the_gate_remembers(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """The gauge reads the caches the front owns for the policy in force."""
    base = await start_proxy(recording_upstream.url)
    assert metric(await scrape(client, base), "replay_proxy_verdict_cache_entries") == 0
    bodies = [clean_body(), clean_body(), failing_body()]  # the second call is the first again
    for body in bodies:
        async with client.post(at(base, "/v1/responses"), json=body) as resp:
            await resp.read()

    assert metric(await scrape(client, base), "replay_proxy_verdict_cache_entries") == 2
