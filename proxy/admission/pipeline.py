"""Admission: the one pipeline every front runs a gated body through, free of any transport.

A front reads the bytes (its timeouts are its own) and hands them over with what the request
said of them. Admission reads them as the gate needs them (content type, content coding, strict
JSON), gates the body against the ledger, counts and audits what it finds, and says what the
front does next: answer here, or forward these bytes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from proxy.admission import body, prefixes, routing
from proxy.admission.dialect import OPEN_RESPONSES, Dialect, View, whole_input
from proxy.admission.routing import RouteCaches, Routed, bounds_of
from proxy.admission.tenants import ledger_key
from proxy.config import DEFAULT_UPSTREAM, Config, Route
from proxy.gate import items
from proxy.gate.arguments import compile_schemas, pending_schemas
from proxy.gate.caches import GateCaches
from proxy.gate.call_limits import CallLimits
from proxy.gate.errors import ProxyError
from proxy.gate.findings import Finding
from proxy.gate.pairing import NOTHING_RECORDED
from proxy.gate.policy import Policy
from proxy.gate.reasons import Outcome
from proxy.gate.values import value
from proxy.gate.verdict import (
    Bounds,
    Verdict,
    clean,
    inspect,
    judges_nothing,
    over_limit,
    rejection,
)
from proxy.state import audit
from proxy.state.audit import AuditLog
from proxy.state.ledger import Ledger, LedgerFault
from proxy.state.ledger_view import LedgerView, Wanted
from proxy.state.metrics import Metrics
from proxy.state.recording import COMPACTION, NO_CONTEXT, Context, Offered, kept, offered_tools

Transport = Literal["http", "websocket", "extproc", "mcp"]
TRANSPORTS: tuple[Transport, ...] = ("http", "websocket", "extproc", "mcp")

# A gated body goes upstream decoded (exactly the bytes the gate judged), so its
# Content-Encoding no longer applies.
_DECODED = frozenset({"content-encoding"})
_NO_HEADERS: Mapping[str, str] = MappingProxyType({})
# The SDK retries 408/409/429/5xx; a blocked request fails the same way every time.
_NOT_RETRIED: Mapping[str, str] = MappingProxyType({"x-should-retry": "false"})
# The metrics' `upstream` of a request that reached none.
NO_UPSTREAM = "-"
# A request that needs the ledger when its store cannot answer (down, slower than its timeout).
LEDGER_UNAVAILABLE = ProxyError(
    503,
    "ledger_unavailable",
    "the proxy could not read its record of earlier responses (a fault of the proxy's, not of "
    "this request); try again",
)


@value
class Request:
    """A gated request as its front received it, the body whole."""

    raw: bytes  # exactly as received: the audit record's `body_sha256` is of these bytes
    path: str  # the canonical gated path (one of its dialect's `paths`)
    transport: Transport
    request_id: str
    tenant: str | None = None
    # None where the transport frames JSON itself (a WebSocket text frame): no header to check.
    content_type: str | None = None
    content_encoding: str = ""
    # When the whole body had arrived (`time.perf_counter()`): the gate's time starts there.
    # None: now.
    started: float | None = None
    # What the routes are matched against: the normalised path as received (a route's
    # `path_prefix` still on it; None: `path`), and the headers by lower-case name.
    received_path: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    # The upstream a WebSocket connection was opened to: its frames may not choose another.
    upstream: str | None = None
    # What the body's API is: where its items live and how the gate's edits are made in it
    # (`dialect.dialect_of` its path).
    dialect: Dialect = OPEN_RESPONSES
    # The route the front chose itself (an MCP server's), not matched from `routes:`.
    route: Route | None = None
    # The MCP session the request belongs to (its server's name, its `Mcp-Session-Id`).
    server: str | None = None
    session: str | None = None

    def __post_init__(self) -> None:
        if self.path not in self.dialect.paths:
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


@value
class Forward:
    """Send `data` upstream as the body. Only bytes, so that the parsed body is freed before
    the upstream is waited for (a 1 MB body parses to several MB)."""

    data: bytes
    drop_headers: frozenset[str]  # of the client's, lower-case, beyond the hop's own
    add_headers: Mapping[str, str]  # to the answer relayed back (`x-replay-gate`)
    outcome: Outcome  # forward, strip or rewrite
    record: bool  # the upstream's answer is a response the ledger records
    # What the response it creates is recorded with: the input that passed, the tools offered.
    context: Context = NO_CONTEXT
    findings: tuple[Finding, ...] = ()  # those it was forwarded with (strip, rewrite, log)
    upstream: str = DEFAULT_UPSTREAM  # the name of the upstream its route sends it to
    policy: Policy | None = None  # its route's: door 2 checks the answer's calls under it
    bounds: Bounds = field(
        default_factory=Bounds
    )  # the config's (`limits`): what door 2's record lists, too


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
    caches: GateCaches | RouteCaches | None = None,
) -> Answer | Forward:
    """Read, route, gate and count a body: an answer of the proxy's own, or what to forward.

    `caches` are the gate's, owned by the front (see `GateCaches`): per route's policy, or
    those of `config.gate` alone.

    Never raises on bad input: a body it cannot read unambiguously is answered 4xx, a body
    the gate refuses is answered 400.
    """
    started = time.perf_counter() if request.started is None else request.started
    dialect = request.dialect
    label = "websocket" if request.transport == "websocket" else dialect.paths[request.path]
    # The verified prefixes of live sessions, when they are held (a front's caches hold them).
    sessions = caches if isinstance(caches, RouteCaches) and caches.prefixes.enabled else None
    try:
        if request.content_type is not None:
            body.check_content_type(request.content_type)
        applied = body.codings(request.content_encoding)
        raw = request.raw
        decoded = body.decode(raw, applied, config.limits.max_body_bytes) if applied else raw
        # What the ledger answered a prefix's read that failed open: the full read decides on
        # it, so that one request reads the store (and counts its fault) once.
        known: LedgerView | None = None
        if sessions is not None:
            # A session's history passed already: only what follows it is read and judged.
            shortcut = await _shortcut(
                request, config, decoded, sessions, ledger, metrics, label, started
            )
            if isinstance(shortcut, LedgerView):
                known = shortcut
            elif shortcut is not None:
                return shortcut
        parsed = dialect.parse(decoded)
        routed = _route(request, config, parsed)
    except ProxyError as exc:
        # A body that could not be read chose no upstream, whichever front it came through (a
        # WebSocket's frame too: its connection's upstream is not where it went).
        metrics.count(label, Outcome.INVALID, NO_UPSTREAM, dialect.label)
        return answer_to(exc)
    upstream = routed.upstream
    policy = routed.policy
    asked = parsed  # as the client sent it: the audit record's model and previous response
    try:
        await dialect.load(parsed)
        parsed, seen, view, changed = await _continued(
            request, config, routed, parsed, ledger, known
        )
    except LedgerFault:
        return _unavailable(dialect, metrics, label, upstream)
    except ProxyError as exc:
        metrics.count(label, Outcome.INVALID, upstream, dialect.label)
        return answer_to(exc)
    # The config's, made once with its caches (a front's are).
    bounds = caches.bounds if isinstance(caches, RouteCaches) else bounds_of(config)
    limits = dialect.call_limits(policy.vendor)
    # The function tools it offers, read once: the gate declares them, the record keeps them.
    offered = offered_tools(parsed.get("tools"))
    judged = await _inspect(
        seen.body,
        policy,
        view,
        metrics,
        _caches(caches, policy),
        bounds,
        limits,
        offered.schemas if seen.body is parsed else None,
    )
    # In the body's own terms from here on: its findings' places, the items it sends.
    verdict = seen.located(judged)
    own = dialect.answer(parsed, verdict)
    if own is not None:
        # Answered in the API's own terms (an MCP tool error or JSON-RPC error): nothing goes
        # upstream, and the findings are audited and counted as any.
        if verdict.findings:
            _audit(request, asked, verdict, audit_log, metrics, upstream, policy)
        metrics.gated(time.perf_counter() - started)
        # A rewritten call counts as a rewrite, a refused one as a block, a batch refused
        # without a finding as a body that could not be read.
        counted: Outcome = Outcome.REWRITE if verdict.outcome == Outcome.REWRITE else Outcome.BLOCK
        counted = counted if verdict.findings else Outcome.INVALID
        metrics.count(label, counted, upstream, dialect.label)
        return Answer(200, own, _NO_HEADERS, verdict.findings)
    # What goes upstream when the gate changed the body (or the route did): at most
    # `max_body_bytes`, else blocked, before the record says what became of the request.
    # Unchanged, the body goes decoded: an upstream that ignores a request's Content-Encoding
    # (many do) would otherwise parse the coded bytes, which need not be the document judged.
    data = decoded
    if verdict.outcome in ("strip", "rewrite") or changed:
        data = body.dumps(dialect.sent(parsed, verdict))
        limit = config.limits.max_body_bytes
        if len(data) > limit and verdict.outcome == "forward":
            # Grown by its route alone (a conversation inlined): too large to send, as if sent.
            metrics.count(label, Outcome.INVALID, upstream, dialect.label)
            return answer_to(_too_large(len(data), limit))
        if len(data) > limit:
            verdict = verdict.blocked(over_limit(verdict, str(len(data)), limit))
    if verdict.findings:
        _audit(request, asked, verdict, audit_log, metrics, upstream, policy)
    metrics.gated(time.perf_counter() - started)
    outcome = verdict.outcome
    if outcome == "block":
        metrics.count(label, Outcome.BLOCK, upstream, dialect.label)
        blocked = rejection(verdict, request_id=request.request_id)
        return Answer(400, blocked, _NOT_RETRIED, verdict.findings)
    header = verdict.header()
    recorded = NO_CONTEXT
    if dialect.records:
        recorded = context_of(
            parsed,
            verdict,
            view,
            compacts=dialect.compacts(request.path),
            dialect=dialect,
            offered=offered,
        )
        if config.ledger.whole_items and dialect.continues:
            recorded = replace(recorded, whole=tuple(whole_input(dialect, parsed, verdict)))
    if (
        sessions is not None
        and outcome is Outcome.FORWARD
        and not verdict.findings
        and not changed
        and (view is None or view.calls_alone is not None)
        and not config.ledger.whole_items
    ):
        _remember(request, sessions.prefixes, decoded, parsed, seen, recorded, routed, view)
    return Forward(
        data,
        _DECODED,
        MappingProxyType({"x-replay-gate": header}) if header else _NO_HEADERS,
        outcome,
        _makes_response(request, parsed),
        recorded,
        findings=verdict.findings,
        upstream=upstream,
        policy=policy,
        bounds=bounds,
    )


def _unavailable(dialect: Dialect, metrics: Metrics, label: str, upstream: str) -> Answer:
    """The ledger could not be read: the proxy's fault, not the request's, so a 503 the SDKs
    retry, never an `orphan`."""
    metrics.count(label, Outcome.LEDGER_UNAVAILABLE, upstream, dialect.label)
    failure = LEDGER_UNAVAILABLE
    return Answer(failure.status, dialect.unavailable(failure), failure.headers)


def _makes_response(request: Request, fields: Mapping[str, Any]) -> bool:
    """Whether the answer is a response the ledger records. A WebSocket frame of another type
    (the spec defaults it to `response.create`) makes none: the relay must not wait for one to
    record with this context."""
    return request.dialect.records and (
        request.transport != "websocket" or fields.get("type") in (None, "response.create")
    )


async def _shortcut(
    request: Request,
    config: Config,
    decoded: bytes,
    caches: RouteCaches,
    ledger: Ledger,
    metrics: Metrics,
    label: str,
    started: float,
) -> Forward | Answer | LedgerView | None:
    """What to forward when `decoded` extends a body of its session that passed clean (see
    `prefixes`): its new items read strictly and judged with the body's other members, which
    are those already read. None, to read it in full, whenever that judgement could differ from
    the full one's: a new item paired or told apart by an id of the prefix's, of a kind whose
    verdict reaches across the body, or with a finding; another route; a response or an item
    named in the ledger; the ledger holding other than it held of the prefix's calls when they
    were judged. The 503 when the ledger cannot be read; when it fails open, the view it gave
    (holding nothing) when that differs, for the full read to decide on: the body's calls are
    those it was asked about."""
    dialect = request.dialect
    key = prefixes.ITEMS_KEY.get(dialect)
    if key is None or config.ledger.whole_items:
        return None
    tenant = ledger_key(request.tenant)
    found = caches.prefixes.match(tenant, request.path, decoded)
    if found is None:
        return None
    # Read alone, the new items are nested a level less than in the body: only what jiter
    # reads at once is taken (within its 200 levels, wherever the whole body's limit falls).
    new = body.loads_shallow(found.new)
    if new is None:
        return None
    try:
        verified = found.verified
        fields = verified.fields
        extended = {**fields, key: new}
        routed = _route(request, config, extended)
    except ProxyError:
        return None  # read in full, for the precise answer
    if not isinstance(new, list) or (found.grew and not new):
        return None
    policy = routed.policy
    if routed.upstream != verified.upstream or policy is not verified.policy or routed.model:
        return None
    seen = dialect.view(extended)
    keys = prefixes.keys_of(seen.body)
    if keys is None or not keys.isdisjoint(verified.keys):
        return None
    view: LedgerView | None = None
    asked = verified.asked
    wanted = Wanted.of(seen.body, provenance=policy.require_provenance)
    if wanted is not None or asked:
        # Calls replayed without a status (every call, under provenance) are judged by what
        # the ledger holds of them: the prefix's verdict stands while it holds the same.
        if wanted is not None:
            if wanted.previous is not None or wanted.reference_ids:
                return None
            asked = (*asked, *wanted.call_ids)
        try:
            view = await ledger.read(
                tenant, seen.body, Wanted(None, [], list(asked)), routed.upstream
            )
        except LedgerFault:
            return _unavailable(dialect, metrics, label, routed.upstream)
        emitted = view.emitted_calls
        if {k: emitted[k] for k in verified.asked if k in emitted} != verified.emitted:
            return view if view.faulted else None
        seen.settle(view)
    bounds = caches.bounds
    limits = dialect.call_limits(policy.vendor)
    # Its tools read once, as `admit` reads them: the gate declares them, the record keeps them.
    offered = offered_tools(extended.get("tools"))
    judged = await _inspect(
        seen.body,
        policy,
        view,
        metrics,
        caches.of(policy),
        bounds,
        limits,
        offered.schemas if seen.body is extended else None,
    )
    if judged.findings or judged.outcome is not Outcome.FORWARD:
        return None
    recorded = NO_CONTEXT
    if dialect.records:
        compacts = dialect.compacts(request.path)
        recorded = context_of(
            extended, judged, view, compacts=compacts, dialect=dialect, offered=offered
        )
        if verified.calls:
            recorded = replace(recorded, items=(*verified.calls, *recorded.items))
    held = prefixes.Verified(
        decoded,
        found.cut,
        found.end,
        fields,
        verified.keys | keys,
        recorded.items,
        routed.upstream,
        policy,
        *_ledger_held(view),
    )
    caches.prefixes.remember(tenant, request.path, held, found.serial)
    metrics.gated(time.perf_counter() - started)
    return Forward(
        decoded,
        _DECODED,
        _NO_HEADERS,
        Outcome.FORWARD,
        _makes_response(request, fields),
        recorded,
        upstream=routed.upstream,
        policy=policy,
        bounds=bounds,
    )


def _remember(
    request: Request,
    held: prefixes.Prefixes,
    decoded: bytes,
    parsed: Mapping[str, Any],
    seen: View,
    recorded: Context,
    routed: Routed,
    view: LedgerView | None,
) -> None:
    """Hold a body read in full that passed clean, for the next turn of its session to extend
    (with what the ledger held of its calls, `view`, when it was asked about calls alone); not
    one whose items reach across the body, or that is too short to be worth it."""
    key = prefixes.ITEMS_KEY.get(request.dialect)
    if key is None or len(decoded) <= prefixes.ANCHOR or not isinstance(parsed.get(key), list):
        return
    keys = prefixes.keys_of(seen.body)
    if keys is None:
        return
    located = prefixes.locate(decoded, key, parsed)
    if located is None:
        return
    fields = {k: v for k, v in parsed.items() if k != key}
    verified = prefixes.Verified(
        decoded,
        *located,
        fields,
        keys,
        recorded.items,
        routed.upstream,
        routed.policy,
        *_ledger_held(view),
    )
    held.remember(ledger_key(request.tenant), request.path, verified, None)


def _ledger_held(view: LedgerView | None) -> tuple[tuple[str, ...], Mapping[str, Any]]:
    """What a held body keeps of the ledger's answer (`prefixes.Verified`): the calls it was
    asked about alone, and what it held of them; nothing when it was not asked."""
    if view is None or view.calls_alone is None:
        return (), {}
    return view.calls_alone, dict(view.emitted_calls)


async def _continued(
    request: Request,
    config: Config,
    routed: Routed,
    parsed: dict[str, Any],
    ledger: Ledger,
    known: LedgerView | None = None,
) -> tuple[dict[str, Any], View, LedgerView | None, bool]:
    """The body as its route sends it (its model renamed; a response another upstream made,
    continued, inlined), as the gate reads it (its dialect's view), the ledger's view of what
    it continues (`known`: read already for its calls alone), and whether the body changed.
    Raises LedgerFault, or ProxyError (`foreign_previous_response`)."""
    upstream = routed.upstream
    changed = routed.model is not None
    if changed:
        parsed = {**parsed, "model": routed.model}
    seen = request.dialect.view(parsed)
    view = known
    if view is None:
        view = await ledger.view(
            ledger_key(request.tenant),
            seen.body,
            provenance=routed.policy.require_provenance,
            upstream=upstream,
        )
    seen.settle(view)
    previous = seen.body.get("previous_response_id")
    if view is None or not isinstance(previous, str):
        return parsed, seen, view, changed
    # Only an upstream of this config is another one: a response recorded under a name the
    # config no longer has (before routes, the single form's `default`) is judged as before.
    origin = view.origin
    if origin is None or origin == upstream or origin not in config.upstream_named:
        return parsed, seen, view, changed
    parsed, view = await _materialize(request, routed, parsed, view, ledger, previous)
    seen = request.dialect.view(parsed)
    seen.settle(view)
    return parsed, seen, view, True


def _too_large(size: int, limit: int) -> ProxyError:
    return ProxyError(
        413,
        "body_too_large",
        f"the body as it would go upstream is {size} bytes, over the limit of {limit} bytes",
    )


def _route(request: Request, config: Config, parsed: Mapping[str, Any]) -> Routed:
    """The route of a parsed body; ProxyError when none takes it, or when a WebSocket's frame
    would take another upstream than its connection goes to."""
    if request.route is not None:
        return Routed(request.route)
    path = request.received_path or request.path
    routed = routing.select(config.routing, path, request.headers, parsed)
    if request.upstream is not None and routed.upstream != request.upstream:
        raise ProxyError(
            400,
            "wrong_upstream",
            f"this WebSocket goes to upstream {request.upstream!r}, and the frame's model routes "
            f"it to {routed.upstream!r}: open a WebSocket that routes there (its path or header)",
            param="model",
        )
    return routed


def _caches(caches: GateCaches | RouteCaches | None, policy: Policy) -> GateCaches:
    if isinstance(caches, RouteCaches):
        return caches.of(policy)
    if caches is None:
        return GateCaches.for_policy(policy)
    return caches


async def _materialize(
    request: Request,
    routed: Routed,
    parsed: dict[str, Any],
    view: LedgerView,
    ledger: Ledger,
    previous: str,
) -> tuple[dict[str, Any], LedgerView | None]:
    """A request continuing a response another upstream made: refused (400
    `foreign_previous_response`), or with `materialize` that response's whole conversation
    inlined before this input, `previous_response_id` gone, to be gated as one body. Raises
    LedgerFault."""
    origin = view.origin
    if not routed.route.materialize:
        raise ProxyError(
            400,
            "foreign_previous_response",
            f"previous_response_id {previous!r} was made by upstream {origin!r}; this request "
            f"goes to {routed.upstream!r}, which does not have it. Send the conversation's "
            "items in `input` instead, or use a route to that upstream (or one with "
            "materialize: true)",
            param="previous_response_id",
        )
    tenant = ledger_key(request.tenant)
    history = await ledger.history(tenant, previous)
    if history is None:
        raise ProxyError(
            400,
            "foreign_previous_response",
            f"previous_response_id {previous!r} was made by upstream {origin!r}, and its "
            f"conversation is not recorded whole, so it cannot go to {routed.upstream!r}: "
            "send the conversation's items in `input` instead",
            param="previous_response_id",
        )
    inlined = request.dialect.inlined(parsed, history)
    provenance = routed.policy.require_provenance
    return inlined, await ledger.view(
        tenant, inlined, provenance=provenance, upstream=routed.upstream
    )


def context_of(
    parsed: Mapping[str, Any],
    verdict: Verdict,
    view: LedgerView | None,
    *,
    compacts: bool,
    dialect: Dialect = OPEN_RESPONSES,
    offered: Offered | None = None,
) -> Context:
    """What the response this request creates is recorded with: the calls of its input that
    went upstream and passed the gate (none a finding named), an `item_reference` or a
    compaction item as the recorded items it stands for, and the function tools it offered.

    A call answered in the same input is left out: no later output may answer it again; so are
    messages (those the proxy relayed were recorded with the response that made them). A
    `/compact` request's context also holds the unanswered calls of the chain it names.
    (`offered`: `offered_tools` of its `tools`, when read already.)
    """
    tools, tools_key = offered_tools(parsed.get("tools")) if offered is None else offered
    input_items = dialect.input_items(parsed)
    named = {i for f in verdict.findings for i in (f.index, f.paired_index) if i is not None}
    # Each item's kind read once: a body of a few hundred pairs asks for each several times.
    kind = dialect.kind
    kinds = [kind(item) for item in input_items]
    went: Iterable[tuple[Any, str | None]]
    if verdict.input is None:
        went = zip(input_items, kinds, strict=True)
        sent = None
    else:
        went = ((item, kind(item)) for item in verdict.input)
        sent = {id(item) for item in verdict.input}
    answered = {
        call_id
        for item, item_kind in went
        if item_kind == items.FUNCTION_CALL_OUTPUT
        if (call_id := items.output_call_id(item)) is not None
    }
    found: list[dict[str, Any]] = []
    if compacts and view is not None:
        found += _unanswered((c for calls in view.chain_calls.values() for c in calls), answered)
    for index, item in enumerate(input_items):
        if index in named or (sent is not None and id(item) not in sent):
            continue
        item_kind = kinds[index]
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
            if items.pairing_key_of(item, item_kind) in answered:
                continue
            recorded = kept(item, tools_key)
            if recorded is not None:
                found.append(recorded)
    allowed = items.allowed_tools(parsed.get("tool_choice"))
    if not found and not tools and not compacts and allowed is None:
        return NO_CONTEXT
    return Context(tuple(found), tools, compacts, tools_key, allowed=allowed)


def _unanswered(found: Iterable[Any], answered: set[str]) -> list[dict[str, Any]]:
    """The recorded calls of `found` (the ledger's, tagged already) that no output answers."""
    return [
        recorded
        for item in found
        if isinstance(item, dict) and items.pairing_key(item) not in answered
        if (recorded := kept(item, trusted=True)) is not None
    ]


async def _inspect(
    parsed: Mapping[str, Any],
    gate: Policy,
    view: LedgerView | None,
    metrics: Metrics,
    caches: GateCaches,
    bounds: Bounds,
    limits: CallLimits | None,
    offered: Sequence[tuple[str, Any]] | None = None,
) -> Verdict:
    """Gate a parsed body (as routed, maybe inlined) against its recorded history, within the
    config's limits of what a verdict lists (`bounds`), a call within those the target's API
    adds (`limits`). (`offered`: `items.tool_schemas` of its `tools`, when read already.)"""
    if judges_nothing(parsed):
        return clean(bounds)  # messages alone: nothing to pair, no schema to compile
    # The tools it declares, found once: the schemas to compile and the calls' both read them.
    listed = isinstance(parsed.get("input"), list)
    declared = items.declared_tools(parsed, offered) if listed else None
    pending = pending_schemas(parsed, gate, caches, declared)
    if pending:
        # A schema first seen is compiled in a worker thread: a large one (thousands of
        # subschemas, within the limits) must not hold every other client's request.
        await asyncio.to_thread(compile_schemas, pending, gate, caches)
    recorded = view or NOTHING_RECORDED
    verdict = inspect(parsed, gate, recorded, caches, bounds, limits, declared)
    metrics.verdicts_held(len(caches.verdicts))
    return verdict


def _audit(
    request: Request,
    asked: dict[str, Any],
    verdict: Verdict,
    audit_log: AuditLog,
    metrics: Metrics,
    upstream: str,
    gate: Policy,
) -> None:
    """Count and record the findings of a request (`asked`: its body as the client sent it);
    a finding's tool is named in the metrics when `gate` pins it."""
    for finding in verdict.findings:
        metrics.found(
            finding.reason, finding.action, finding.name, gate.pinned, request.dialect.label
        )
    try:
        audit_log.write(
            audit.AuditedRequest(
                request_id=request.request_id,
                transport=request.transport,
                path=request.path,
                body=asked,
                raw=request.raw,
                tenant=request.tenant,
                upstream=upstream,
                server=request.server,
                session=request.session,
            ),
            verdict,
        )
    except OSError:
        # Counted, and still a failure of the request's (a 500, its traceback logged): a
        # request with findings goes nowhere unrecorded.
        metrics.audit_write_failures.inc()
        raise
