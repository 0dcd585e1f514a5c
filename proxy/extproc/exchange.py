"""One HTTP request as Envoy's External Processor sees it: the messages Envoy sends about it
(request headers, the buffered body, the answer's headers and its streamed body), each answered
with the ProcessingResponse that the one admission pipeline decides.

The decisions are `serve`'s, from the same code: the target is read by `targets` (under a route's
`path_prefix` by `routing.mounted`), the body by `pipeline.admit`, the answer recorded by the tap,
its function_calls checked by door 2. Only the translation is here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.type.v3 import http_status_pb2

from proxy.admission import body, pipeline, routing, targets
from proxy.admission.codings import readable_accept_encoding
from proxy.admission.emitted import EmittedChecks, recording_of
from proxy.admission.ids import new_request_id
from proxy.admission.routing import RouteCaches
from proxy.admission.tap import Recording, ResponseTap
from proxy.admission.tenants import tenant_for
from proxy.config import Config
from proxy.gate.errors import ProxyError, internal_error
from proxy.state.audit import AuditLog
from proxy.state.ledger import Ledger
from proxy.state.metrics import Metrics

log = logging.getLogger("replay_proxy")

# Methods that never carry a request to create a response; on a gated path they pass through
# only when they have no body (as `serve` has them).
_BODYLESS = frozenset({"GET", "HEAD", "OPTIONS"})
# When the proxy holds the credentials (it lists its clients), a client's never go upstream.
_CREDENTIALS = ("authorization", "api-key")

_Mode = processing_mode_pb2.ProcessingMode
# A request the processor has nothing more to do with: the rest of it, and its answer, pass by
# without a message (honoured when the filter has `allow_mode_override: true`).
_NOTHING_MORE = _Mode(
    request_body_mode=_Mode.NONE,
    response_header_mode=_Mode.SKIP,
    response_body_mode=_Mode.NONE,
)
# An answer with nothing to record: its body passes by unseen.
_NO_ANSWER_BODY = _Mode(response_body_mode=_Mode.NONE)
_WHOLE_ANSWER_BODY = _Mode(response_body_mode=_Mode.BUFFERED)
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


@dataclass(frozen=True)
class Front:
    """What every exchange of one processor shares, as `serve`'s app holds it: the config, the
    ledger, the audit log, the metrics, the gate's caches for each route's policy, and door 2's
    checks."""

    config: Config
    ledger: Ledger
    audit_log: AuditLog
    metrics: Metrics
    caches: RouteCaches
    emitted: EmittedChecks


class Exchange:
    """One request's stream of messages: each `answer` is the reply Envoy waits for."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.request_id = new_request_id()
        self.started = time.perf_counter()
        self.headers: dict[str, list[str]] = {}
        self.received = ""  # the normalised path as received, a route's prefix and all
        self.gated: str | None = None  # the canonical gated path, once the body is to be gated
        self.tenant: str | None = None
        self.recording: Recording | None = None
        self.tap: ResponseTap | None = None
        self.added: Mapping[str, str] = {}  # to the answer (`x-replay-gate`)
        self.named = False  # the answer carries `x-request-id`: the request reached the gate

    async def answer(self, message: Any) -> Any:
        """The ProcessingResponse to one ProcessingRequest.

        A failure of the processor's own (a bug) before anything went upstream is answered
        500 `internal_error`, naming the request id its traceback is logged under; once the
        answer is on its way it ends the stream instead, and Envoy cuts the answer, so that
        a partial answer is never taken for a whole one.
        """
        kind = message.WhichOneof("request")
        try:
            return await self._answer(kind, message)
        except Exception:
            log.exception("%s unexpected error on %s", self.request_id, kind)
            if kind in ("request_headers", "request_body"):
                return self._immediate(pipeline.answer_to(internal_error(self.request_id)))
            raise

    async def _answer(self, kind: str, message: Any) -> Any:
        if kind == "request_headers":
            try:
                return await self._request_headers(message.request_headers)
            except ProxyError as exc:
                return self._immediate(pipeline.answer_to(exc))
        if kind == "request_body":
            return await self._request_body(message.request_body)
        if kind == "response_headers":
            return self._response_headers(message.response_headers)
        if kind == "response_body":
            return await self._response_body(message.response_body)
        if kind == "request_trailers":
            return ext_proc.ProcessingResponse(request_trailers=ext_proc.TrailersResponse())
        return ext_proc.ProcessingResponse(response_trailers=ext_proc.TrailersResponse())

    async def _request_headers(self, message: Any) -> Any:
        self.started = time.perf_counter()
        self.headers = headers = header_values(message.headers.headers)
        metrics = self.front.metrics
        raw_target = _one(headers, ":path")
        config = self.front.config
        try:
            read = targets.read_target(raw_target)
            self.received = read.path
            # Under a route's prefix, the rest is the request: read, gated and forwarded as such.
            target = routing.mounted(config.routing, read)
        except targets.TargetError as exc:
            metrics.count("any", "invalid_target", "-")
            raise ProxyError(400, "invalid_request_target", str(exc)) from None
        method = _one(headers, ":method").upper()
        gated = target.gated
        reads = method == "GET" and targets.reads_response(target.path)
        has_body = not message.end_of_stream
        if gated is None and not reads:
            # `/-/` too: it is `serve`'s own namespace, and behind Envoy there is none. Under a
            # route's prefix, it goes upstream without it, as `serve` sends it.
            unmounted = None
            if target is not read:
                unmounted = ext_proc.HeaderMutation(set_headers=[_header(":path", target.forward)])
            return _headers_response(unmounted, mode=_NOTHING_MORE)
        self.named = True
        self.tenant = self._tenant()
        if gated is not None and _one(headers, "upgrade").lower() == "websocket":
            # Envoy relays a WebSocket's frames without this processor: they cannot be gated.
            metrics.count("websocket", "invalid", "-")
            raise ProxyError(
                400,
                "websocket_not_gated",
                "a WebSocket on a gated path cannot be gated behind Envoy: send POST requests, "
                "or open the WebSocket through `replay-proxy serve`",
            )
        mutation = self._credentials_mutation()
        if target.forward != raw_target:
            mutation.set_headers.append(_header(":path", target.forward))
        if gated is not None and (method not in _BODYLESS or has_body):
            route = targets.GATED[gated]
            content_type = ", ".join(headers.get("content-type", ()))
            try:
                # Refused before the body is read, as `serve` refuses it.
                body.check_content_type(content_type)
                self._check_length()
            except body.BodyError:
                metrics.count(route, "invalid", "-")
                raise
            self.gated = gated
            _readable_encodings(headers, mutation)
            if not has_body:
                # No body message will follow: admission judges the empty body now.
                decided = await self._request_body(ext_proc.HttpBody(end_of_stream=True))
                if decided.HasField("immediate_response"):
                    return decided
            return _headers_response(mutation)
        if not reads:
            # A bodyless request on a gated path (a GET of the list) goes on as it came.
            return _headers_response(mutation, mode=_NOTHING_MORE)
        # A response read again is recorded like the answer that created it, as made by the
        # upstream of the route it takes.
        try:
            routed = routing.select(config.routing, self.received, self._route_headers(), None)
        except ProxyError:
            metrics.count("any", "invalid", "-")
            raise
        limit = config.limits.max_body_bytes
        self.recording = Recording(
            self.front.ledger, self.tenant or "-", limit, self.request_id, None, routed.upstream
        )
        _readable_encodings(headers, mutation)
        return _headers_response(mutation)

    def _route_headers(self) -> dict[str, str]:
        """The headers routes match on, as the HTTP front gives them."""
        headers = self.headers
        return routing.route_headers(self.front.config.routing, lambda n: headers.get(n, ()))

    def _tenant(self) -> str | None:
        credential = _one(self.headers, "authorization") or _one(self.headers, "api-key")
        try:
            return tenant_for(credential or None, self.front.config)
        except ProxyError:
            self.front.metrics.count("any", "unauthorized", "-")
            raise

    def _credentials_mutation(self) -> Any:
        mutation = ext_proc.HeaderMutation()
        if self.front.config.clients:
            mutation.remove_headers.extend(n for n in _CREDENTIALS if n in self.headers)
        return mutation

    def _check_length(self) -> None:
        limit = self.front.config.limits.max_body_bytes
        declared = _one(self.headers, "content-length")
        if declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)

    async def _request_body(self, message: Any) -> Any:
        if self.gated is None:
            return ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse())
        try:
            if not message.end_of_stream:
                # A part of the body: Envoy is not configured to buffer gated bodies whole.
                log.error(
                    "%s a gated body came in parts: set request_body_mode: BUFFERED",
                    self.request_id,
                )
                raise ProxyError(
                    500,
                    "gate_misconfigured",
                    "the gate must see the whole body; Envoy sent it in parts (request_body_mode "
                    "must be BUFFERED)",
                )
            return await self._gate(bytes(message.body))
        except ProxyError as exc:
            return self._immediate(pipeline.answer_to(exc))

    async def _gate(self, raw: bytes) -> Any:
        front = self.front
        config = front.config
        gated = self.gated
        assert gated is not None
        limit = config.limits.max_body_bytes
        if len(raw) > limit:
            front.metrics.count(targets.GATED[gated], "invalid", "-")
            raise _too_large(limit)
        headers = self.headers
        admitted = pipeline.Request(
            raw,
            gated,
            "extproc",
            self.request_id,
            self.tenant,
            ", ".join(headers.get("content-type", ())),
            ", ".join(headers.get("content-encoding", ())),
            self.started,
            # What routes match: the route's gate settings and its upstream's name apply behind
            # Envoy too (Envoy's route sends the request to that upstream's cluster).
            self.received,
            self._route_headers(),
        )
        decided = await pipeline.admit(
            admitted,
            config,
            ledger=front.ledger,
            audit_log=front.audit_log,
            metrics=front.metrics,
            caches=front.caches,
        )
        if isinstance(decided, pipeline.Answer):
            return self._immediate(decided)
        front.metrics.count(targets.GATED[gated], decided.outcome, decided.upstream)
        self.added = decided.add_headers
        if decided.record:
            self.recording = recording_of(admitted, decided, front.ledger, limit)
        dropped = [name for name in decided.drop_headers if name in headers]
        if decided.data == raw and not dropped:
            return ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse())
        # Decoded, stripped or rewritten: the bytes the gate judged go up, with their length
        # (in BUFFERED mode Envoy leaves `content-length` to the processor).
        mutation = ext_proc.HeaderMutation(
            set_headers=[_header("content-length", str(len(decided.data)))],
            remove_headers=dropped,
        )
        return ext_proc.ProcessingResponse(
            request_body=ext_proc.BodyResponse(
                response=ext_proc.CommonResponse(
                    header_mutation=mutation,
                    body_mutation=ext_proc.BodyMutation(body=decided.data),
                )
            )
        )

    def _response_headers(self, message: Any) -> Any:
        headers = header_values(message.headers.headers)
        mutation = ext_proc.HeaderMutation()
        if self.named:
            theirs = headers.get("x-request-id", [])
            if theirs:
                mutation.set_headers.append(_header("x-upstream-request-id", ", ".join(theirs)))
            mutation.set_headers.append(_header("x-request-id", self.request_id))
        for name, value in self.added.items():
            mutation.set_headers.append(_header(name, value))
        declared = _one(headers, "content-length")
        length = int(declared) if declared.isdigit() else None
        if self.recording is not None and not message.end_of_stream:
            self.tap = self.recording.tap(
                int(_one(headers, ":status") or 0),
                _one(headers, "content-type"),
                ", ".join(headers.get("content-encoding", ())),
                length,
            )
        mode = _NO_ANSWER_BODY
        if self.tap is not None:
            mode = None  # streamed: chunk by chunk (SSE, or an answer of unknown or large size)
            if not self.tap.sse and length is not None and length <= self.recording_limit():
                # A JSON answer within the limit is read whole: one message, and Envoy, which
                # drops an answer's Content-Length when it hands the body to a processor, gets
                # it back (the body goes on unchanged).
                mode = _WHOLE_ANSWER_BODY
                mutation.set_headers.append(_header("content-length", declared))
        return ext_proc.ProcessingResponse(
            response_headers=ext_proc.HeadersResponse(
                response=ext_proc.CommonResponse(header_mutation=mutation)
            ),
            mode_override=mode,
        )

    def recording_limit(self) -> int:
        """The most of an answer read whole: `limits.max_body_bytes`, which Envoy's buffer
        limit is sized for."""
        return self.front.config.limits.max_body_bytes

    async def _response_body(self, message: Any) -> Any:
        tap = self.tap
        if tap is not None:
            # Recorded before Envoy is told to pass the chunk on: a follow-up sent the instant
            # the client has the whole answer finds the record.
            await tap.feed(bytes(message.body))
            if message.end_of_stream:
                await tap.finish()
                self.close()
        return ext_proc.ProcessingResponse(response_body=ext_proc.BodyResponse())

    def close(self) -> None:
        """The answer has been relayed, or its stream cut short (the calls the client got
        count): door 2 checks the calls of the responses recorded, as `serve` does."""
        if self.recording is not None:
            front = self.front
            front.emitted.relayed(self.recording.emitted, front.config.gate, front.caches)

    def _immediate(self, decided: pipeline.Answer) -> Any:
        """The answer `serve` gives, given by Envoy: nothing goes upstream."""
        headers = {"content-type": "application/json", **decided.headers}
        headers["x-request-id"] = self.request_id
        code = decided.body.get("error", {}).get("code", "")
        return ext_proc.ProcessingResponse(
            immediate_response=ext_proc.ImmediateResponse(
                status=http_status_pb2.HttpStatus(code=decided.status),
                headers=ext_proc.HeaderMutation(
                    set_headers=[_header(name, value) for name, value in headers.items()]
                ),
                body=body.dumps(decided.body),
                details=f"replay_proxy_{code}" if code else "replay_proxy",
            )
        )


def header_values(headers: Iterable[Any]) -> dict[str, list[str]]:
    """Envoy's header map as lower-case names and their values, in order. A value that is not
    UTF-8 is refused (`serve` refuses it too: it could not go upstream unchanged)."""
    found: dict[str, list[str]] = {}
    for header in headers:
        name = header.key.lower()
        if header.raw_value:
            try:
                value = header.raw_value.decode("utf-8")
            except UnicodeDecodeError:
                raise ProxyError(
                    400, "invalid_header", f"the value of {name} is not UTF-8 text"
                ) from None
        else:
            value = header.value
        found.setdefault(name, []).append(value)
    return found


def _one(headers: Mapping[str, list[str]], name: str) -> str:
    values = headers.get(name)
    return values[0] if values else ""


def _header(name: str, value: str) -> Any:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=name, raw_value=value.encode("utf-8")),
        append_action=_OVERWRITE,
    )


def _headers_response(mutation: Any = None, *, mode: Any = None) -> Any:
    common = ext_proc.CommonResponse(header_mutation=mutation) if mutation is not None else None
    return ext_proc.ProcessingResponse(
        request_headers=ext_proc.HeadersResponse(response=common), mode_override=mode
    )


def _readable_encodings(headers: Mapping[str, list[str]], mutation: Any) -> None:
    """Leave in the upstream's `Accept-Encoding` only codings the tap can read."""
    if "accept-encoding" in headers:
        readable = readable_accept_encoding(", ".join(headers["accept-encoding"]))
        mutation.set_headers.append(_header("accept-encoding", readable))


def _too_large(limit: int) -> body.BodyError:
    return body.BodyError(413, "body_too_large", f"the body exceeds the limit of {limit} bytes")
