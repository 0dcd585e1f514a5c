"""Admission: the one pipeline every front runs a gated body through, free of any transport.

A front reads the bytes (its timeouts are its own) and hands them over with what the request
said of them. Admission reads them as the gate needs them (content type, content coding, strict
JSON), gates the body against the ledger, counts and audits what it finds, and says what the
front does next: answer here, or forward these bytes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from proxy.admission import body, targets
from proxy.config import Config
from proxy.gate import items
from proxy.gate.arguments import compile_schemas, pending_schemas
from proxy.gate.caches import GateCaches
from proxy.gate.errors import ProxyError
from proxy.gate.pairing import NOTHING_RECORDED
from proxy.gate.verdict import Finding, Verdict, inspect, rejection
from proxy.state import audit
from proxy.state.audit import AuditLog
from proxy.state.ledger import (
    COMPACTION,
    NO_CONTEXT,
    Context,
    Ledger,
    LedgerView,
    kept,
)
from proxy.state.ledger import tools_key as tools_key_of
from proxy.state.metrics import Metrics

Transport = Literal["http", "websocket", "extproc"]
TRANSPORTS: tuple[Transport, ...] = ("http", "websocket", "extproc")

# A gated body goes upstream decoded (exactly the bytes the gate judged), so its
# Content-Encoding no longer applies.
_DECODED = frozenset({"content-encoding"})
_NO_HEADERS: Mapping[str, str] = MappingProxyType({})
# The SDK retries 408/409/429/5xx; a blocked request fails the same way every time.
_NOT_RETRIED: Mapping[str, str] = MappingProxyType({"x-should-retry": "false"})


@dataclass(frozen=True, slots=True)
class Request:
    """A gated request as its front received it, the body whole."""

    raw: bytes  # exactly as received: the audit record's `body_sha256` is of these bytes
    path: str  # the canonical gated path (a key of `targets.GATED`)
    transport: Transport
    request_id: str
    tenant: str | None = None
    # None where the transport frames JSON itself (a WebSocket text frame): no header to check.
    content_type: str | None = None
    content_encoding: str = ""
    # When the whole body had arrived (`time.perf_counter()`): the gate's time starts there.
    # None: now.
    started: float | None = None

    def __post_init__(self) -> None:
        if self.path not in targets.GATED:
            raise ValueError(f"path: {self.path!r} is not a gated path")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport: {self.transport!r} is not one of {', '.join(TRANSPORTS)}")


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer the request here, with `body` (a JSON document); nothing goes upstream."""

    status: int
    body: Mapping[str, Any]
    headers: Mapping[str, str]
    findings: tuple[Finding, ...] = ()  # of a blocked request: for its access line and span


@dataclass(frozen=True, slots=True)
class Forward:
    """Send `data` upstream as the body. Only bytes, so that the parsed body is freed before
    the upstream is waited for (a 1 MB body parses to several MB)."""

    data: bytes
    drop_headers: frozenset[str]  # of the client's, lower-case, beyond the hop's own
    add_headers: Mapping[str, str]  # to the answer relayed back (`x-replay-gate`)
    outcome: Literal["forward", "strip", "rewrite"]
    record: bool  # the upstream's answer is a response the ledger records
    # What the response it creates is recorded with: the input that passed, the tools offered.
    context: Context = NO_CONTEXT
    findings: tuple[Finding, ...] = ()  # those it was forwarded with (strip, rewrite, log)


def answer_to(error: ProxyError) -> Answer:
    """The answer a failure decided here gets, in the API's error shape."""
    return Answer(error.status, error.document(), error.headers)


async def admit(
    request: Request,
    config: Config,
    *,
    ledger: Ledger,
    audit_log: AuditLog,
    metrics: Metrics,
    caches: GateCaches | None = None,
) -> Answer | Forward:
    """Read, gate and count a body: an answer of the proxy's own, or what to forward.

    `caches` are the gate's for `config.gate`, owned by the front (see `GateCaches`).

    Never raises on bad input: a body it cannot read unambiguously is answered 4xx, a body
    the gate refuses is answered 400.
    """
    started = time.perf_counter() if request.started is None else request.started
    label = "websocket" if request.transport == "websocket" else targets.GATED[request.path]
    limit = config.limits.max_body_bytes
    raw = request.raw
    try:
        if request.content_type is not None:
            body.check_content_type(request.content_type)
        applied = body.codings(request.content_encoding)
        decoded = body.decode(raw, applied, limit) if applied else raw
        parsed = body.parse(decoded)
    except body.BodyError as exc:
        metrics.requests.labels(label, "invalid").inc()
        return answer_to(exc)
    if caches is None:
        caches = GateCaches.for_policy(config.gate)
    verdict, view = await _inspect(request, parsed, config, ledger, audit_log, metrics, caches)
    metrics.gate_seconds.observe(time.perf_counter() - started)
    if verdict.outcome == "block":
        metrics.requests.labels(label, "block").inc()
        blocked = rejection(verdict, request_id=request.request_id)
        return Answer(400, blocked, _NOT_RETRIED, verdict.findings)
    header = verdict.header()
    added = MappingProxyType({"x-replay-gate": header}) if header else _NO_HEADERS
    compacts = targets.GATED[request.path] == "responses_compact"
    recorded = context_of(parsed, verdict, view, compacts=compacts)
    # A WebSocket frame of another type (the spec defaults it to `response.create`) makes no
    # response: the relay must not wait for one to record with this context.
    record = request.transport != "websocket" or parsed.get("type") in (None, "response.create")
    if verdict.outcome in ("strip", "rewrite"):
        assert verdict.input is not None
        changed = body.with_input(parsed, verdict.input)
        return Forward(
            changed, _DECODED, added, verdict.outcome, record, recorded, verdict.findings
        )
    # Decoded: an upstream that ignores a request's Content-Encoding (many do) would otherwise
    # parse the coded bytes, which need not be the document the gate judged.
    return Forward(decoded, _DECODED, added, "forward", record, recorded, verdict.findings)


def context_of(
    parsed: Mapping[str, Any], verdict: Verdict, view: LedgerView | None, *, compacts: bool
) -> Context:
    """What the response this request creates is recorded with: the calls of its input that
    went upstream and passed the gate (none a finding named), an `item_reference` or a
    compaction item as the recorded items it stands for, and the function tools it offered.

    A call answered in the same input is left out: no later output may answer it again; so are
    messages (those the proxy relayed were recorded with the response that made them). A
    `/compact` request's context also holds the unanswered calls of the chain it names.
    """
    tools = tuple(items.tool_schemas(parsed.get("tools")))
    listed = parsed.get("input")
    input_items = listed if isinstance(listed, list) else []
    named = {i for f in verdict.findings for i in (f.index, f.paired_index) if i is not None}
    sent = None if verdict.input is None else {id(item) for item in verdict.input}
    answered = {
        call_id
        for item in (input_items if verdict.input is None else verdict.input)
        if items.is_output(item)
        if (call_id := items.output_call_id(item)) is not None
    }
    tools_key = tools_key_of(tools) if tools else None
    found: list[dict[str, Any]] = []
    if compacts and view is not None:
        found += _unanswered((c for calls in view.chain_calls.values() for c in calls), answered)
    for index, item in enumerate(input_items):
        if index in named or (sent is not None and id(item) not in sent):
            continue
        item_kind = items.kind(item)
        if item_kind in (items.ITEM_REFERENCE, COMPACTION):
            ref = items.reference_id(item)
            resolved = view.item(ref) if view is not None and ref is not None else None
            if resolved is None:
                continue
            calls = resolved.get("calls") if resolved.get("type") == COMPACTION else [resolved]
            found += _unanswered(calls if isinstance(calls, list) else (), answered)
        elif item_kind == items.FUNCTION_CALL or (
            item_kind != items.FUNCTION_CALL_OUTPUT and isinstance(item, dict) and "call_id" in item
        ):
            # Only what an output may answer: a client that resends its whole history each
            # turn must not make every response hold that history again.
            found += _unanswered((item,), answered, tools_key, trusted=False)
    if not found and not tools and not compacts:
        return NO_CONTEXT
    return Context(tuple(found), tools, compacts, tools_key)


def _unanswered(
    found: Iterable[Any],
    answered: set[str],
    tools: str | None = None,
    *,
    trusted: bool = True,
) -> list[dict[str, Any]]:
    return [
        recorded
        for item in found
        if isinstance(item, dict) and items.pairing_key(item) not in answered
        if (recorded := kept(item, tools, trusted=trusted)) is not None
    ]


async def _inspect(
    request: Request,
    parsed: dict[str, Any],
    config: Config,
    ledger: Ledger,
    audit_log: AuditLog,
    metrics: Metrics,
    caches: GateCaches,
) -> tuple[Verdict, LedgerView | None]:
    """Gate a parsed body against its recorded history; count and audit what it finds."""
    gate = config.gate
    tenant = request.tenant
    view = await ledger.view(tenant or "-", parsed, provenance=gate.require_provenance)
    pending = pending_schemas(parsed, gate, caches)
    if pending:
        # A schema first seen is compiled in a worker thread: a large one (thousands of
        # subschemas, within the limits) must not hold every other client's request.
        await asyncio.to_thread(compile_schemas, pending, gate, caches)
    verdict = inspect(parsed, gate, view or NOTHING_RECORDED, caches)
    metrics.verdict_cache.set(len(caches.verdicts))
    if verdict.findings:
        for finding in verdict.findings:
            metrics.findings.labels(finding.reason, finding.action).inc()
        try:
            audit_log.write(
                audit.Request(
                    request_id=request.request_id,
                    transport=request.transport,
                    path=request.path,
                    body=parsed,
                    raw=request.raw,
                    tenant=tenant,
                ),
                verdict,
            )
        except OSError:
            # Counted, and still a failure of the request's (a 500, its traceback logged): a
            # request with findings goes nowhere unrecorded.
            metrics.audit_write_failures.inc()
            raise
    return verdict, view
