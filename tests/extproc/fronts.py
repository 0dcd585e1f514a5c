"""What a front did with one request, read the same way for every front: the client's answer,
what the recording upstream received, the audit records the request added and what it added to
the metrics. The Envoy tests compare `serve` with Envoy + `extproc` through it."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import GLOBAL, HANG_GUARD_S, POLL_S, at
from tests.extproc.envoy import Extproc
from tests.server.test_emitted_calls import CannedUpstream, emitted_call, response_with
from tests.servers.recording import ANSWER, RecordingUpstream
from tests.servers.strict_chat import answering, tool_completion

# The Chat completion answering a Chat request with BAD_CALL's header: its call fails.
CHAT_BAD_CALL = tool_completion(
    {
        "id": "c_bad",
        "type": "function",
        "function": {"name": "get_latest_sales_report", "arguments": GLOBAL},
    }
)

# A metric sample: its name and its labels, sorted.
Sample = tuple[str, tuple[tuple[str, str], ...]]


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
    counted: dict[Sample, float]  # by sample name and labels


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
    one; its events on a WebSocket opened with that header). `calls` is how many such calls
    it has emitted."""

    def __init__(self, upstream: RecordingUpstream) -> None:
        self.usual = upstream.handler
        self.canned = CannedUpstream(response_with(emitted_call("c_bad", GLOBAL)))
        self.chat_calls = 0

    @property
    def calls(self) -> int:
        return len(self.canned.received) + self.chat_calls

    async def __call__(self, request: web.Request, received: Any) -> web.StreamResponse:
        if received.headers.get("x-answer") != BAD_CALL["x-answer"]:
            return await self.usual(request, received)
        if request.path.endswith("/chat/completions"):
            # A Chat completion making the same failing call, as JSON or as its stream.
            self.chat_calls += 1
            return await answering(CHAT_BAD_CALL)(request, received)
        return await self.canned.handle(request)

    def frames(self, request: web.Request, turn: int) -> list[str]:
        """The events answering a WebSocket turn: the response an HTTP request gets."""
        if request.headers.get("x-answer") == BAD_CALL["x-answer"]:
            self.canned.received.append(turn)
            return self.canned.frames
        return [json.dumps({"type": "response.completed", "response": ANSWER})]


def counts(text: str, families: Iterable[str] = COUNTED) -> dict[Sample, float]:
    names = frozenset(families)
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in names
    }


async def counted_since(
    front: Front, before: dict[Sample, float], emitted: int, families: Iterable[str] = COUNTED
) -> dict[Sample, float]:
    """What the counts grew by since `before`, once door 2 has counted the `emitted` calls
    (or the hang guard is up): it checks them once the answer went out, so the client may
    have the answer first. The ledger's writes are counted before the answer ends."""
    for _ in range(int(HANG_GUARD_S / POLL_S)):
        now = counts(await front.scrape(), families)
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
    families: Iterable[str] = COUNTED,
) -> Seen:
    upstream.received.clear()
    emitting = upstream.handler
    assert isinstance(emitting, Emitting)
    calls = emitting.calls
    before = counts(await front.scrape(), families)
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
    grown = await counted_since(front, before, emitting.calls - calls, families)
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


def envoy_scrape(processor: Extproc) -> Callable[[], Awaitable[str]]:
    async def read() -> str:
        return await asyncio.to_thread(processor.scrape)

    return read
