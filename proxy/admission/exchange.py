"""One request's whole life, free of any transport: the one place every front hands it to.

In the spirit of mitmproxy's `HttpStream` and h11's state machine: a front reads its wire and
tells the exchange what arrived (the head, the body, the answer's head, each chunk of the
answer, its end); the exchange says what to do (pass on, answer here, gate; forward these
bytes with these header changes; add these headers to the answer) and does every duty of the
request on the way: the target refused and counted, the tenant read from the credentials, the
content type and size checked once, the codings the tap can read asked for, the request ids,
the outcome counted once, the answer recorded, and door 2 under the policy of *this* request.

Its states, and which call moves it on (any state may end in ANSWERED, a refusal):

    HEAD ──head──▶ PASSED                    (nothing to gate or record: the rest goes by)
      │ └──head──▶ UPSTREAM                  (a read of a response, recorded; or ungated)
      └──head──▶ BODY ──body──▶ UPSTREAM     (admitted; or ANSWERED: refused or blocked)
    UPSTREAM ──answer_head──▶ ANSWER ──chunk*, end──▶ ──close──▶ DONE
"""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from types import MappingProxyType

from proxy.admission import body, mcp, pipeline, routing, targets
from proxy.admission.codings import readable_accept_encoding
from proxy.admission.dialect import (
    CHAT_COMPLETIONS,
    NO_DIALECT,
    OPEN_RESPONSES,
    dialect_of,
)
from proxy.admission.emitted import EmittedCalls
from proxy.admission.ids import new_request_id
from proxy.admission.mcp import McpCalls
from proxy.admission.mcp_tap import McpSession, McpTap, check_results
from proxy.admission.pipeline import NO_UPSTREAM, Answer, Forward, Transport
from proxy.admission.routing import RouteCaches
from proxy.admission.services import Services
from proxy.admission.tap import Recording, ResponseTap
from proxy.admission.tenants import credential_of, ledger_key, tenant_for
from proxy.config import Config
from proxy.gate.errors import ProxyError
from proxy.gate.policy import Policy
from proxy.gate.reasons import Outcome
from proxy.state.audit import Relayed
from proxy.state.metrics import Metrics

# A header's values by lower-case name, none when absent: how every front shows its headers.
HeaderValues = Callable[[str], Sequence[str]]

# Methods that never carry a request to create a response; on a gated path they pass through
# only when they have no body.
BODYLESS = frozenset({"GET", "HEAD", "OPTIONS"})
# The proxy's own id of the request on every answer; an upstream's own moves aside.
REQUEST_ID_HEADER = "x-request-id"
UPSTREAM_REQUEST_ID_HEADER = "x-upstream-request-id"
# The metrics' `route` of a request refused before its route was known.
ANY_ROUTE = "any"
# No headers (read only: shared by every exchange).
_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


class State(enum.Enum):
    """Where an exchange is in its request's life."""

    HEAD = "head"  # the request's head is expected
    BODY = "body"  # a gated body is expected, whole
    UPSTREAM = "upstream"  # the request goes upstream: the answer's head is expected
    ANSWER = "answer"  # the answer's body goes by, through the tap
    DONE = "done"  # the answer has ended (or was cut short): door 2 has its calls
    ANSWERED = "answered"  # the proxy answered here: nothing went upstream
    PASSED = "passed"  # nothing the exchange watches: the rest goes by without it


class Head(enum.Enum):
    """What a front does with a request once its head is read."""

    PASS = "pass"  # forward it (and its answer) untouched but for the target and credentials
    GATE = "gate"  # read the body whole and hand it to `body`
    SOCKET = "socket"  # a gated WebSocket: each of its frames is an exchange of its own


# The members the hot path names, read once: on Python 3.11 an Enum class's attribute goes
# through `EnumType.__getattr__`'s hook, some hundreds of instructions each time.
_HEAD, _BODY, _UPSTREAM, _ANSWER = State.HEAD, State.BODY, State.UPSTREAM, State.ANSWER
_DONE, _ANSWERED, _PASSED = State.DONE, State.ANSWERED, State.PASSED
_PASS, _GATE, _SOCKET = Head.PASS, Head.GATE, Head.SOCKET


def read_target(raw_target: str, metrics: Metrics) -> targets.Target:
    """The request target read; ProxyError 400 `invalid_request_target` (counted) if it is not
    one, whatever the path and method."""
    try:
        return targets.read_target(raw_target)
    except targets.TargetError as exc:
        raise refused_target(exc, metrics) from None


def refused_target(exc: targets.TargetError, metrics: Metrics) -> ProxyError:
    """The answer to a request target `targets.read_target` could not read, counted (for a
    front that reads the target itself and has the metrics at hand only when it fails)."""
    metrics.count(ANY_ROUTE, Outcome.INVALID_TARGET, NO_UPSTREAM, NO_DIALECT)
    return ProxyError(400, "invalid_request_target", str(exc))


def request_ids(request_id: str, theirs: Sequence[str]) -> list[tuple[str, str]]:
    """The headers that name an answer: the upstream's own ids as `x-upstream-request-id`,
    then the proxy's as `x-request-id` (set over any the upstream sent)."""
    if not theirs:  # the usual case
        return [(REQUEST_ID_HEADER, request_id)]
    named = [(UPSTREAM_REQUEST_ID_HEADER, value) for value in theirs]
    named.append((REQUEST_ID_HEADER, request_id))
    return named


def _not_gated_behind_envoy() -> ProxyError:
    return ProxyError(
        400,
        "websocket_not_gated",
        "a WebSocket on a gated path cannot be gated behind Envoy: send POST requests, "
        "or open the WebSocket through `replay-proxy serve`",
    )


def _no_websocket_mode(path: str) -> ProxyError:
    return ProxyError(
        400,
        "websocket_not_supported",
        f"{path} has no WebSocket mode: send each request as a POST",
    )


class _Nothing:
    """An awaitable done at once, awaited any number of times: nothing to feed a tap."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        yield from ()


_NOTHING = _Nothing()


def too_large(limit: int) -> body.BodyError:
    return body.BodyError(413, "body_too_large", f"the body exceeds the limit of {limit} bytes")


class Exchange:
    """One request (or one WebSocket frame) through its whole life; `state` says where."""

    # One is made per request: slots make it and its attributes cheaper than a dict would.
    __slots__ = (
        "added",
        "caches",
        "config",
        "dialect",
        "matched",
        "mcp",
        "outcome",
        "received",
        "recording",
        "request_id",
        "route",
        "services",
        "started",
        "state",
        "tap",
        "target",
        "tenant",
        "transport",
        "upstream",
    )

    def __init__(
        self,
        services: Services,
        config: Config,
        caches: RouteCaches,
        transport: Transport,
        request_id: str | None = None,
    ) -> None:
        self.services = services
        self.config = config
        self.caches = caches
        self.transport = transport
        self.request_id = request_id or new_request_id()
        self.state = _HEAD
        self.tenant: str | None = None
        self.received = ""  # the normalised path as received, a route's prefix and all
        self.target: targets.Target | None = None  # as forwarded (prefix removed)
        self.matched: Mapping[str, str] = _NO_HEADERS  # the headers routes match on
        self.route = ANY_ROUTE  # the metrics' route label
        self.dialect = NO_DIALECT  # and its dialect label: the API the body speaks
        self.upstream: str | None = None  # the name of the upstream it goes to
        self.outcome: Outcome | None = None
        self.recording: Recording | None = None
        self.tap: ResponseTap | McpTap | None = None
        self.added: Mapping[str, str] = _NO_HEADERS  # to the answer (`x-replay-gate`)
        self.mcp: McpSession | None = None  # the MCP session of a request to an MCP server
        self.started = time.perf_counter()

    # -- the request's head ------------------------------------------------------------------

    def head(
        self, method: str, target: targets.Target, values: HeaderValues, *, has_body: bool
    ) -> Head:
        """The head arrived (`target` as `read_target` read it): under a route's prefix, the
        rest is the request; the tenant is read from the credentials (401 without a listed
        key). A gated body is checked for its type and declared size before it is read.

        Behind Envoy there is no namespace of the proxy's own, and a request that is neither
        gated nor recorded is none of the processor's business: it passes as it came.
        """
        if self.state is not _HEAD:
            raise self._unexpected(_HEAD)
        routes = self.config.routing
        self.received = target.path
        try:
            self.target = mounted = routing.mounted(routes, target)
        except targets.TargetError as exc:
            raise self.refuse(
                ProxyError(400, "invalid_request_target", str(exc)), Outcome.INVALID_TARGET
            ) from None
        gated = mounted.gated
        behind_envoy = self.transport == "extproc"
        if mounted.own and not behind_envoy:
            message = f"{method} {mounted.path}: no such admin endpoint; /-/ is never forwarded"
            raise self.refuse(ProxyError(404, "not_found", message), Outcome.NOT_FOUND)
        if (
            behind_envoy
            and gated is None
            and not (method == "GET" and targets.reads_response(mounted.path))
        ):
            self.state = _PASSED
            return _PASS
        self._tenant(values)
        if not behind_envoy and mcp.unserved(target.path, self.config.mcp.servers):
            # A misspelled server must not reach the model's upstream (its calls unchecked).
            # Told only to a client the proxy knows: which names exist is no stranger's.
            self.dialect = mcp.LABEL
            message = f"{method} {target.path}: no MCP server of `mcp.servers` is served here"
            raise self.refuse(ProxyError(404, "not_found", message), Outcome.NOT_FOUND)
        if self.caches.match_headers:
            self.matched = routing.route_headers(routes, values)
        # Behind Envoy any upgrade to a WebSocket is refused; `serve` upgrades a GET's only.
        if (
            gated is not None
            and (method == "GET" or behind_envoy)
            and any(v.lower() == "websocket" for v in values("upgrade"))
        ):
            self.route = "websocket"
            spoken = dialect_of(gated)
            if not spoken.websocket:
                self.dialect = spoken.label
                raise self.refuse(_no_websocket_mode(mounted.path), route="websocket")
            self.dialect = OPEN_RESPONSES.label
            if behind_envoy:
                # Envoy relays a WebSocket's frames without the processor: they cannot be gated.
                raise self.refuse(_not_gated_behind_envoy(), route="websocket")
            self.state = _UPSTREAM
            return _SOCKET
        if gated is None or (method in BODYLESS and not has_body):
            self.route = "passthrough"
            self.state = _UPSTREAM
            return _PASS
        self.route = targets.GATED[gated]
        self.dialect = dialect_of(gated).label
        return self._body_expected(values)

    def mcp_head(
        self,
        method: str,
        server: str,
        target: targets.Target,
        values: HeaderValues,
        *,
        has_body: bool,
    ) -> Head:
        """The head of a request to the MCP server `server` (`/mcp/<server>`, under the
        config's `mcp.servers`): its tenant read as any request's, its session named by its
        `Mcp-Session-Id`; a POST's body (JSON-RPC messages) is gated, a GET (the server's
        stream) and a DELETE (the session's end) pass, their answers watched."""
        if self.state is not _HEAD:
            raise self._unexpected(_HEAD)
        route = self.config.mcp_routes[server]
        self.received, self.target, self.route = target.path, target, mcp.ROUTE
        self.dialect = mcp.LABEL
        self.upstream = route.upstream
        self._tenant(values)
        given = values("mcp-session-id")
        session = given[0] if given else None
        key = (ledger_key(self.tenant), server, session or "")
        self.mcp = McpSession(server, session, key, route, ends=method == "DELETE")
        if method != "POST" or not has_body:
            self.outcome = Outcome.FORWARD
            self.state = _UPSTREAM
            return _PASS
        return self._body_expected(values)

    def forward_target(self) -> str:
        """The target a request goes upstream under: an MCP server's endpoint is its URL
        itself (only the query is added), a gated path its canonical form, else the path."""
        assert self.target is not None
        if self.mcp is not None:
            return self.target.query
        return self.target.forward

    def _tenant(self, values: HeaderValues) -> None:
        """The tenant, from the credentials: 401 without a listed key."""
        try:
            self.tenant = tenant_for(credential_of(values), self.config)
        except ProxyError as exc:
            raise self.refuse(exc, Outcome.UNAUTHORIZED) from None

    def _body_expected(self, values: HeaderValues) -> Head:
        """A gated body is expected: its type and declared size are checked first."""
        content_type = ", ".join(values("content-type"))
        declared = ", ".join(values("content-length"))
        try:
            # Refused before the body is read: no need to wait for one that will not be read.
            body.check_content_type(content_type)
            limit = self.config.limits.max_body_bytes
            if declared.isdigit() and int(declared) > limit:
                raise too_large(limit)
        except body.BodyError as exc:
            raise self.invalid(exc) from None
        self.state = _BODY
        return _GATE

    def passthrough(self, method: str) -> str:
        """The upstream a request that is not gated goes to (routed by its path and headers);
        a read of a stored response is recorded like the answer that created it."""
        if self.state is not _UPSTREAM:
            raise self._unexpected(_UPSTREAM)
        try:
            routed = routing.select(self.config.routing, self.received, self.matched, None)
        except ProxyError as exc:
            raise self.refuse(exc) from None
        self.upstream = routed.upstream
        self.outcome = Outcome.FORWARD
        assert self.target is not None
        if method == "GET" and targets.reads_response(self.target.path):
            self.recording = Recording(
                self.services.ledger,
                ledger_key(self.tenant),
                self.config.limits.max_body_bytes,
                self.request_id,
                None,
                self.upstream,
            )
        return self.upstream

    def frame(self, request_id: str, config: Config, caches: RouteCaches) -> Exchange:
        """The exchange of one frame of this gated WebSocket, under the config in force when
        it arrived: its body is gated under its own route's policy, the tenant, path and
        headers the connection's."""
        frame = Exchange(self.services, config, caches, "websocket", request_id)
        frame.tenant, frame.received, frame.matched = self.tenant, self.received, self.matched
        frame.target, frame.route, frame.state = self.target, "websocket", State.BODY
        frame.dialect = self.dialect
        return frame

    def watch_turns(self) -> ResponseTap:
        """The tap of a gated WebSocket: every turn's response recorded with the context of its
        frame, its calls waiting for door 2 under that frame's policy. Door 2's record of a
        turn names its frame (`turn_forwarded`); of a response no frame asked for, the
        connection."""
        assert self.target is not None
        assert self.target.gated is not None
        relayed = Relayed(
            self.request_id,
            "websocket",
            self.target.gated,
            self.tenant,
            None,
            self.upstream,
            self.dialect,
        )
        self.tap = ResponseTap(
            self.services.ledger,
            ledger_key(self.tenant),
            "",
            None,
            self.config.limits.max_body_bytes,
            request_id=self.request_id,
            upstream=self.upstream,
            emitted=EmittedCalls(relayed),
        )
        return self.tap

    def turn_forwarded(self, frame: Exchange, decided: Forward) -> None:
        """A frame of this WebSocket was forwarded: its turn's response is recorded with its
        context, and its calls checked under its route's policy; door 2's record of them names
        the frame (its id, the hash of its bytes), as a request's names the request."""
        frame.counted()
        turn = frame.recording
        if isinstance(self.tap, ResponseTap) and turn is not None:
            asked = turn.emitted.relayed if turn.emitted is not None else None
            self.tap.expect(decided.context, decided.policy, decided.bounds, asked)

    def turns_relayed(self, gate: Policy, caches: RouteCaches) -> None:
        """A frame that may end a turn went to the client: door 2 checks the calls of the
        turns ended so far (`gate`, `caches`: of the config in force now)."""
        if isinstance(self.tap, ResponseTap):
            self.services.emitted.relayed(self.tap.emitted, gate, caches)

    def accept_encoding(self, values: HeaderValues, *, gated: bool = False) -> str | None:
        """The `Accept-Encoding` to send upstream in place of the client's, when the answer is
        recorded (`gated`: a gated body's, asked before its admission says) and the client
        sent one: only the codings the tap can read."""
        given = values("accept-encoding")
        if (self.recording is None and not gated) or not given:
            return None
        return readable_accept_encoding(", ".join(given))

    # -- the request's body ------------------------------------------------------------------

    def invalid(self, failure: ProxyError) -> ProxyError:
        """A gated body that could not be read (too large, too slow): counted, and answered."""
        return self.refuse(failure, route=self.route)

    async def body(
        self,
        raw: bytes,
        *,
        content_encoding: str = "",
        started: float | None = None,
        upstream: str | None = None,
    ) -> Answer | Forward:
        """The whole body (`started`: when it had arrived): admitted, or answered here. A
        WebSocket's frame names the `upstream` its connection goes to."""
        if self.state is not _BODY:
            raise self._unexpected(_BODY)
        limit = self.config.limits.max_body_bytes
        if len(raw) > limit:
            raise self.invalid(too_large(limit))
        assert self.target is not None
        session = self.mcp
        if session is not None:
            calls = McpCalls(session.server, self.services.tool_lists, session.key)
            request = pipeline.Request(
                raw,
                session.path,
                "mcp",
                self.request_id,
                self.tenant,
                None,  # checked at the head
                content_encoding,
                started,
                dialect=calls,
                route=session.route,
                server=session.server,
                session=session.session,
            )
        else:
            gated = self.target.gated
            assert gated is not None
            request = pipeline.Request(
                raw,
                gated,
                self.transport,
                self.request_id,
                self.tenant,
                None,  # checked at the head
                content_encoding,
                started,
                self.received,
                self.matched,
                upstream,
                dialect_of(gated),
            )
        services = self.services
        decided = await pipeline.admit(
            request,
            self.config,
            ledger=services.ledger,
            audit_log=services.audit_log,
            metrics=services.metrics,
            caches=self.caches,
        )
        if isinstance(decided, Answer):
            self.state = _ANSWERED
            return decided
        self.state = _UPSTREAM
        self.upstream = decided.upstream
        self.outcome = decided.outcome
        self.added = decided.add_headers
        if session is not None:
            # What the tap watches for, as admission read the body (it goes as it came).
            session.asked, session.raw, session.listed = calls.asked, raw, calls.listed
        if decided.record:
            self.recording = self._recording(request, decided)
        return decided

    def _recording(self, request: pipeline.Request, decided: Forward) -> Recording:
        """Where the answer to a forwarded request is recorded: for its tenant, as made by its
        route's upstream; the function_calls of the responses recorded wait there for door 2,
        under its route's policy and within its config's bounds."""
        relayed = Relayed(
            request.request_id,
            request.transport,
            request.path,
            request.tenant,
            request.raw,
            self.upstream,
            self.dialect,
        )
        return Recording(
            self.services.ledger,
            ledger_key(self.tenant),
            self.config.limits.max_body_bytes,
            request.request_id,
            decided.context,
            self.upstream,
            EmittedCalls(relayed),
            decided.policy,
            decided.bounds,
            chat=request.dialect is CHAT_COMPLETIONS,
        )

    # -- the answer --------------------------------------------------------------------------

    def counted(self) -> None:
        """The request went upstream and its answer began: counted, once, under its outcome."""
        self.services.metrics.count(
            self.route, self.outcome or Outcome.FORWARD, self.upstream or NO_UPSTREAM, self.dialect
        )

    def upstream_failed(self) -> None:
        """No answer could be had from the upstream."""
        self.state = _ANSWERED
        self.services.metrics.count(
            self.route, Outcome.UPSTREAM_ERROR, self.upstream or NO_UPSTREAM, self.dialect
        )

    def answer_head(
        self, status: int, content_type: str, content_encoding: str, length: int | None
    ) -> Mapping[str, str]:
        """The answer's head arrived: the headers to add to it; its body goes through the tap
        when it completes a response to record."""
        self.state = _ANSWER
        if self.recording is not None:
            self.tap = self.recording.tap(status, content_type, content_encoding, length)
        elif self.mcp is not None and status < 300:
            limit = self.config.limits.max_body_bytes
            self.tap = McpTap(
                self.services.tool_lists,
                self.mcp,
                content_type,
                content_encoding,
                limit,
                self.request_id,
                length,
            )
        return self.added

    def begin(self) -> Awaitable[None]:
        """The answer's head is about to go to the client, to await: an MCP session's end
        forgets its list before the client learns it ended."""
        tap = self.tap
        return tap.begin() if isinstance(tap, McpTap) and tap.session.ends else _NOTHING

    def chunk(self, data: bytes) -> Awaitable[None]:
        """A chunk of the answer, to await before it goes on: a follow-up sent the moment the
        client has the whole answer finds the record. (The tap's own coroutine, not one of
        the exchange's around it: one coroutine less per chunk.)"""
        tap = self.tap
        waiting = None if tap is None else tap.feed(data)
        return _NOTHING if waiting is None else waiting

    def feeder(self) -> Callable[[bytes], Awaitable[None] | None] | None:
        """What a front that relays many chunks hands each one to (what `chunk` does, without
        a call of the exchange's per chunk; it gives None for a chunk that needs no wait);
        None when the answer is not watched."""
        return None if self.tap is None else self.tap.feed

    def end(self) -> Awaitable[None]:
        """The answer ended whole, to await: a JSON response is recorded now."""
        tap = self.tap
        return _NOTHING if tap is None else tap.finish()

    def close(self) -> None:
        """The answer has been relayed, or cut short (the calls the client got count): door 2
        checks the calls of the responses recorded, under this request's policy."""
        if self.state is not _ANSWERED:
            self.state = _DONE
        if self.recording is not None:
            self.services.emitted.relayed(self.recording.emitted, self.config.gate, self.caches)
        elif isinstance(self.tap, McpTap) and self.tap.results:
            self._check_results(self.tap)

    def _check_results(self, tap: McpTap) -> None:
        """Door 2 for MCP: the tool results relayed, against their outputSchema."""
        session = tap.session
        services = self.services
        relayed = Relayed(
            self.request_id,
            "mcp",
            session.path,
            self.tenant,
            session.raw,
            self.upstream,
            self.dialect,
        )
        check_results(
            tap,
            self.caches.of(session.route.gate),
            self.caches.bounds,
            relayed,
            services.audit_log,
            services.emitted,
        )

    # -- refusals ----------------------------------------------------------------------------

    def refuse(
        self,
        failure: ProxyError,
        outcome: Outcome = Outcome.INVALID,
        route: str = ANY_ROUTE,
        upstream: str = NO_UPSTREAM,
    ) -> ProxyError:
        """The request is answered here with `failure`, counted under `outcome` (a head the
        front's wire refuses is refused through here too)."""
        self.services.metrics.count(route, outcome, upstream, self.dialect)
        self.state = _ANSWERED
        return failure

    def _unexpected(self, state: State) -> RuntimeError:
        return RuntimeError(
            f"exchange {self.request_id}: {state.value} expected, in {self.state.value}"
        )
