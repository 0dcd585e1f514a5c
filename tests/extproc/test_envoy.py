"""Behind a real Envoy: the processor decides as `serve` decides, from the same code.

Every case is sent to both fronts under the same config: the real `replay-proxy serve` (the
`start_routed` fixture) and a real Envoy with the real `replay-proxy extproc`; the client's
answer, what the recording upstream received, the audit records and the counts of the calls
the upstream emitted (door 2) and of the responses recorded must be the same.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import (
    BOMB,
    BOMB_HEADERS,
    GLOBAL,
    HANG_GUARD_S,
    JSON_HEADERS,
    POLL_S,
    at,
    clean_body,
    failing_body,
    odd_bytes,
    request_body,
    sales_call,
    sales_output,
)
from tests.extproc.conftest import MiB, routed
from tests.extproc.envoy import Extproc
from tests.fixture_types import ProxyFactory
from tests.server.checks import scrape
from tests.server.test_emitted_calls import CannedUpstream, emitted_call, response_with
from tests.servers.recording import RecordingUpstream


@dataclass(frozen=True)
class Front:
    """Where a front takes requests, where it audits (as which transport), and how its
    metrics are read."""

    url: str
    audit: Path
    transport: str
    scrape: Callable[[], Awaitable[str]]


@dataclass(frozen=True)
class Seen:
    """What one front did with a request: the client's answer, the upstream's view, the audit
    records of the request and what it added to the counts."""

    status: int
    answer: Any  # the JSON answer, its request id left out (each front makes its own)
    headers: dict[str, str | None]
    upstream: list[tuple[str, bytes, str | None, str | None]]  # target, body, coding, length
    audited: list[dict[str, Any]]  # without `ts`, `request_id`, `prev` and `transport`
    counted: dict[tuple[str, tuple[tuple[str, str], ...]], float]  # by sample name and labels


# Content-Length too: Envoy drops an answer's when a processor reads its body.
ANSWER_HEADERS = ("content-type", "content-length", "x-should-retry", "x-replay-gate")
# The counts compared: the calls the upstream emitted (door 2), the responses recorded.
COUNTED = ("replay_proxy_emitted_calls_total", "replay_proxy_ledger_writes_total")
# Left out of the audit records compared: what differs by front, or by the moment.
OWN_FIELDS = ("ts", "request_id", "prev", "transport")
# A request with this header is answered with a function_call that fails its schema.
BAD_CALL = {"x-answer": "bad-call"}


class Emitting:
    """The recording upstream's answers: as usual, or, to a request with BAD_CALL's header,
    a response whose function_call fails its schema (its SSE stream when the body asks for
    one). `calls` is how many such calls it has emitted."""

    def __init__(self, upstream: RecordingUpstream) -> None:
        self.usual = upstream.handler
        self.canned = CannedUpstream(response_with(emitted_call("c_bad", GLOBAL)))

    @property
    def calls(self) -> int:
        return len(self.canned.received)

    async def __call__(self, request: web.Request, received: Any) -> web.StreamResponse:
        if received.headers.get("x-answer") == BAD_CALL["x-answer"]:
            return await self.canned.handle(request)
        return await self.usual(request, received)


@pytest.fixture
def emitting(recording_upstream: RecordingUpstream) -> Emitting:
    emitting = recording_upstream.handler = Emitting(recording_upstream)
    return emitting


def counts(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in COUNTED
    }


async def counted_since(
    front: Front, before: dict[Any, float], emitted: int
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What the counts grew by since `before`, once door 2 has counted the `emitted` calls
    (or the hang guard is up): it checks them once the answer went out, so the client may
    have the answer first. The ledger's writes are counted before the answer ends."""
    for _ in range(int(HANG_GUARD_S / POLL_S)):
        now = counts(await front.scrape())
        grown = {key: value - before.get(key, 0.0) for key, value in now.items()}
        grown = {key: value for key, value in grown.items() if value}
        checked = sum(v for (name, _), v in grown.items() if name == COUNTED[0])
        if checked >= emitted:
            break
        await asyncio.sleep(POLL_S)
    return grown


def audited(front: Front, request_id: str, transport: str) -> list[dict[str, Any]]:
    lines = front.audit.read_text().splitlines() if front.audit.exists() else []
    records = [r for r in map(json.loads, lines) if r["request_id"] == request_id]
    assert all(r["transport"] == transport for r in records)
    return [{k: v for k, v in r.items() if k not in OWN_FIELDS} for r in records]


async def seen(
    client: aiohttp.ClientSession,
    front: Front,
    upstream: RecordingUpstream,
    target: str,
    data: bytes,
    headers: dict[str, str],
) -> Seen:
    upstream.received.clear()
    emitting = upstream.handler
    assert isinstance(emitting, Emitting)
    calls = emitting.calls
    before = counts(await front.scrape())
    async with client.post(at(front.url, target), data=io.BytesIO(data), headers=headers) as resp:
        raw = await resp.read()
        request_id = resp.headers["x-request-id"]
        assert request_id.startswith("req_")
        shown = {name: resp.headers.get(name) for name in ANSWER_HEADERS}
        if shown["content-type"] is not None:
            shown["content-type"] = shown["content-type"].split(";")[0]
        status = resp.status
    answer = raw.decode() if shown["content-type"] == "text/event-stream" else json.loads(raw)
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        answer["error"].pop("request_id", None)
    grown = await counted_since(front, before, emitting.calls - calls)
    received = [
        (
            r.target,
            r.body,
            r.headers.get("Content-Encoding"),
            r.headers.get("Content-Length"),
        )
        for r in upstream.received
    ]
    records = audited(front, request_id, front.transport)
    return Seen(status, answer, shown, received, records, grown)


def typed(call_type: str) -> dict[str, Any]:
    return sales_call("call_1") | {"type": call_type}


CASES = [
    # (target, headers, body, status, code or the x-replay-gate header of a forwarded one)
    pytest.param("/v1/responses", JSON_HEADERS, odd_bytes(clean_body()), 200, None, id="clean"),
    pytest.param(
        "/v1/responses", JSON_HEADERS, odd_bytes(failing_body()), 400, "replay_rejected", id="block"
    ),
    pytest.param(
        "/V1//Responses/",
        JSON_HEADERS,
        odd_bytes(failing_body()),
        400,
        "replay_rejected",
        id="block-path-variant",
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS,
        odd_bytes(request_body(sales_call("call_1", status="in_progress"), sales_output("call_1"))),
        200,
        "stripped=1",
        id="strip",
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS,
        odd_bytes(request_body(sales_call("call_1", arguments="{bad"), sales_output("call_1"))),
        200,
        "rewritten=1",
        id="rewrite",
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS,
        odd_bytes(request_body(typed("acme:function_call"), sales_output("call_1"))),
        200,
        "logged=1",
        id="log",
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS | {"Content-Encoding": "gzip"},
        gzip.compress(odd_bytes(clean_body())),
        200,
        None,
        id="gzip-clean-goes-up-decoded",
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS | {"Content-Encoding": "gzip"},
        gzip.compress(odd_bytes(failing_body())),
        400,
        "replay_rejected",
        id="gzip-block",
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS,
        b'{"model":"m","input":[],"input":"hi"}',
        400,
        "invalid_json",
        id="duplicate-keys",
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS | {"Content-Encoding": "gzip"},
        gzip.compress(odd_bytes(clean_body()))[:-6],
        400,
        "invalid_content_encoding",
        id="gzip-truncated",
    ),
    pytest.param(
        "/v1/responses", BOMB_HEADERS, BOMB, 413, "body_too_large", id="gzip-bomb-of-10-gib"
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS,
        b'{"input":"' + b"a" * MiB + b'"}',
        413,
        "body_too_large",
        id="oversized",
    ),
    pytest.param(
        "/v1/responses",
        {"Content-Type": "text/plain"},
        odd_bytes(clean_body()),
        415,
        "unsupported_media_type",
        id="text-plain",
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS | {"Content-Encoding": "zstd"},
        b"(\xb5/\xfd",
        415,
        "unsupported_content_encoding",
        id="zstd",
    ),
    pytest.param("/v1/responses", JSON_HEADERS, b"[1]", 400, "invalid_body", id="not-an-object"),
    pytest.param(
        "/v1/responses", JSON_HEADERS, b'{"input":5}', 400, "invalid_input", id="input-a-number"
    ),
    pytest.param(
        "/v1/responses/compact",
        JSON_HEADERS,
        odd_bytes(failing_body()),
        400,
        "replay_rejected",
        id="compact-block",
    ),
    # Under the `path_prefix` of a route (`/acme`, upstream `acme`): judged under that route,
    # and forwarded without the prefix.
    pytest.param(
        "/acme/v1/responses",
        JSON_HEADERS,
        odd_bytes(failing_body()),
        400,
        "replay_rejected",
        id="prefixed-block",
    ),
    pytest.param(
        "/ACME/V1/Responses/",
        JSON_HEADERS,
        odd_bytes(failing_body()),
        400,
        "replay_rejected",
        id="prefixed-block-path-variant",
    ),
    pytest.param(
        "/acme/v1/responses",
        JSON_HEADERS,
        odd_bytes(clean_body()),
        200,
        None,
        id="prefixed-clean-goes-up-without-it",
    ),
    # A prefix the bootstrap has no route of its own for is read by the processor all the same.
    pytest.param(
        "/team/v1/responses",
        JSON_HEADERS,
        odd_bytes(failing_body()),
        400,
        "replay_rejected",
        id="prefix-without-an-envoy-route-block",
    ),
    # Door 2: the upstream's own call fails its schema; relayed as it came, counted, audited.
    pytest.param(
        "/v1/responses",
        JSON_HEADERS | BAD_CALL,
        odd_bytes(clean_body()),
        200,
        None,
        id="emitted-bad-call-json",
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS | BAD_CALL,
        odd_bytes(clean_body(stream=True)),
        200,
        None,
        id="emitted-bad-call-sse",
    ),
    pytest.param(
        "/acme/v1/responses",
        JSON_HEADERS | BAD_CALL,
        odd_bytes(clean_body(stream=True)),
        200,
        None,
        id="prefixed-emitted-bad-call-sse",
    ),
]


@pytest.mark.parametrize(("target", "headers", "data", "status", "said"), CASES)
async def test_envoy_answers_as_serve_answers(
    recording_upstream: RecordingUpstream,
    emitting: Emitting,
    start_routed: ProxyFactory,
    behind_envoy: Callable[..., Any],
    tmp_path: Path,
    target: str,
    headers: dict[str, str],
    data: bytes,
    status: int,
    said: str | None,
) -> None:
    served = await start_routed(**routed(recording_upstream.url))
    envoy = await behind_envoy(recording_upstream.url)
    async with aiohttp.ClientSession(auto_decompress=False) as client:

        async def scrape_serve() -> str:
            return await scrape(client, served)

        fronts = (
            Front(served, tmp_path / "audit.jsonl", "http", scrape_serve),
            Front(envoy.url, envoy.audit, "extproc", envoy_scrape(envoy.processor)),
        )
        by_serve, by_envoy = [
            await seen(client, front, recording_upstream, target, data, headers) for front in fronts
        ]

    assert by_envoy == by_serve
    assert by_envoy.status == status
    upstream = "acme" if target.lower().startswith("/acme/") else "default"
    reasons = [[f["reason"] for f in r["findings"]] for r in by_envoy.audited]
    if status != 200:
        assert by_envoy.upstream == []  # never forwarded
        assert by_envoy.answer["error"]["code"] == said
        assert by_envoy.headers["content-type"] == "application/json"
        assert by_envoy.counted == {}
        if said == "replay_rejected":
            assert [(r["action"], r["upstream"]) for r in by_envoy.audited] == [("block", upstream)]
        return
    ((upstream_target, body, coding, length),) = by_envoy.upstream
    assert (upstream_target, coding, length) == ("/v1/responses", None, str(len(body)))
    assert by_envoy.headers["x-replay-gate"] == said
    if said is None:
        # Clean: byte for byte as the gate judged it (decoded, when it came coded).
        judged = gzip.decompress(data) if "Content-Encoding" in headers else data
        assert body == judged
    writes = {("replay_proxy_ledger_writes_total", ()): 1.0}  # the answer, recorded
    if BAD_CALL.items() <= headers.items():
        emitted = ("replay_proxy_emitted_calls_total", TOOL_FAILED)
        assert by_envoy.counted == writes | {emitted: 1.0}
        [record] = by_envoy.audited
        assert (record["event"], record["action"], record["upstream"]) == (
            "emitted_call_rejected",
            "log",
            upstream,
        )
        assert reasons == [["arguments_schema"]]
    else:
        assert by_envoy.counted == writes
        assert all(r["event"] == "replay_rejected" for r in by_envoy.audited)
        assert len(by_envoy.audited) == (said is not None)


TOOL_FAILED = (("tool", "get_latest_sales_report"), ("verdict", "arguments_schema"))


def envoy_scrape(processor: Extproc) -> Callable[[], Awaitable[str]]:
    async def read() -> str:
        return await asyncio.to_thread(processor.scrape)

    return read


async def test_blocked_through_envoy_is_audited_as_extproc(
    recording_upstream: RecordingUpstream, behind_envoy: Callable[..., Any]
) -> None:
    envoy = await behind_envoy(recording_upstream.url)
    sent = odd_bytes(failing_body())
    async with (
        aiohttp.ClientSession() as client,
        client.post(f"{envoy.url}/v1/responses", data=sent, headers=JSON_HEADERS) as resp,
    ):
        request_id = resp.headers["x-request-id"]
        answer = await resp.json()
    assert answer["error"]["request_id"] == request_id
    records = [json.loads(line) for line in envoy.audit.read_text().splitlines()]
    (record,) = [r for r in records if r["request_id"] == request_id]
    assert record["transport"] == "extproc"
    assert record["action"] == "block"
    assert record["path"] == "/v1/responses"
    assert recording_upstream.received == []


async def test_upstream_request_id_moves_aside(
    recording_upstream: RecordingUpstream, behind_envoy: Callable[..., Any]
) -> None:
    async def answer(request: Any, received: Any) -> Any:
        from aiohttp import web

        body = {"object": "response", "id": "resp_x", "output": []}
        return web.json_response(body, headers={"x-request-id": "upstream-id"})

    recording_upstream.handler = answer
    envoy = await behind_envoy(recording_upstream.url)
    async with (
        aiohttp.ClientSession() as client,
        client.post(
            f"{envoy.url}/v1/responses", data=odd_bytes(clean_body()), headers=JSON_HEADERS
        ) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["x-request-id"].startswith("req_")
        assert resp.headers["x-upstream-request-id"] == "upstream-id"
