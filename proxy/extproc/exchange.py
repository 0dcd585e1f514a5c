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

from proxy.admission import body, pipeline
from proxy.admission.credentials import CREDENTIAL_HEADERS
from proxy.admission.emitted import EmittedChecks
from proxy.admission.exchange import Exchange, Head, State, read_target, request_ids
from proxy.admission.routing import RouteCaches
from proxy.admission.services import Services
from proxy.config import Config
from proxy.gate.errors import ProxyError, internal_error
from proxy.state.ledger import Ledger
from proxy.state.metrics import Metrics

log = logging.getLogger("replay_proxy")


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
    """What every stream of one processor shares, as `serve`'s app holds it: the config, the
    services (ledger, audit log, metrics, door 2's checks) and the gate's caches for each
    route's policy."""

    config: Config
    services: Services
    caches: RouteCaches

    @property
    def ledger(self) -> Ledger:
        return self.services.ledger

    @property
    def metrics(self) -> Metrics:
        return self.services.metrics

    @property
    def emitted(self) -> EmittedChecks:
        return self.services.emitted


class ExtprocStream:
    """One request's stream of messages, translated to and from its exchange: each `answer`
    is the reply Envoy waits for."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.exchange = Exchange(front.services, front.config, front.caches, "extproc")
        self.request_id = self.exchange.request_id
        self.headers: dict[str, list[str]] = {}

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

    def _values(self, name: str) -> list[str]:
        return self.headers.get(name, [])

    async def _request_headers(self, message: Any) -> Any:
        exchange = self.exchange
        exchange.started = time.perf_counter()
        self.headers = headers = header_values(message.headers.headers)
        raw_target = _one(headers, ":path")
        read = read_target(raw_target, self.front.metrics)
        method = _one(headers, ":method").upper()
        has_body = not message.end_of_stream
        decided = exchange.head(method, read, self._values, has_body=has_body)
        target = exchange.target
        assert target is not None
        if exchange.state is State.PASSED:
            # `/-/` too: it is `serve`'s own namespace, and behind Envoy there is none. Under a
            # route's prefix, it goes upstream without it, as `serve` sends it.
            unmounted = None
            if target is not read:
                unmounted = ext_proc.HeaderMutation(set_headers=[_header(":path", target.forward)])
            return _headers_response(unmounted, mode=_NOTHING_MORE)
        mutation = self._credentials_mutation()
        if target.forward != raw_target:
            mutation.set_headers.append(_header(":path", target.forward))
        if decided is Head.GATE:
            self._ask_readable(mutation, gated=True)
            if not has_body:
                # No body message will follow: admission judges the empty body now.
                answered = await self._request_body(ext_proc.HttpBody(end_of_stream=True))
                if answered.HasField("immediate_response"):
                    return answered
            return _headers_response(mutation)
        # A response read again is recorded like the answer that created it, as made by the
        # upstream of the route it takes; a bodyless request on a gated path (a GET of the
        # list) goes on as it came.
        exchange.passthrough(method)
        if exchange.recording is None:
            return _headers_response(mutation, mode=_NOTHING_MORE)
        self._ask_readable(mutation)
        return _headers_response(mutation)

    def _credentials_mutation(self) -> Any:
        mutation = ext_proc.HeaderMutation()
        if self.front.config.clients:
            # When the proxy lists its clients, their credentials never go upstream.
            mutation.remove_headers.extend(n for n in CREDENTIAL_HEADERS if n in self.headers)
        return mutation

    def _ask_readable(self, mutation: Any, *, gated: bool = False) -> None:
        """Leave in the upstream's `Accept-Encoding` only codings the tap can read."""
        readable = self.exchange.accept_encoding(self._values, gated=gated)
        if readable is not None:
            mutation.set_headers.append(_header("accept-encoding", readable))

    async def _request_body(self, message: Any) -> Any:
        if self.exchange.state is not State.BODY:
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
        exchange = self.exchange
        coding = ", ".join(self.headers.get("content-encoding", ()))
        decided = await exchange.body(raw, content_encoding=coding, started=exchange.started)
        if isinstance(decided, pipeline.Answer):
            return self._immediate(decided)
        exchange.counted()
        dropped = [name for name in decided.drop_headers if name in self.headers]
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
        exchange = self.exchange
        headers = header_values(message.headers.headers)
        mutation = ext_proc.HeaderMutation()
        if exchange.state is not State.PASSED:
            # One header each (Envoy overwrites a name set twice): the upstream's ids joined.
            theirs = headers.get("x-request-id", [])
            for name, value in request_ids(self.request_id, [", ".join(theirs)] if theirs else []):
                mutation.set_headers.append(_header(name, value))
        declared = _one(headers, "content-length")
        length = int(declared) if declared.isdigit() else None
        # An answer without a body completes no response: nothing for the tap.
        status = 0 if message.end_of_stream else int(_one(headers, ":status") or 0)
        added = exchange.answer_head(
            status,
            _one(headers, "content-type"),
            ", ".join(headers.get("content-encoding", ())),
            length,
        )
        for name, value in added.items():
            mutation.set_headers.append(_header(name, value))
        tap = exchange.tap
        mode = _NO_ANSWER_BODY
        if tap is not None:
            mode = None  # streamed: chunk by chunk (SSE, or an answer of unknown or large size)
            if not tap.sse and length is not None and length <= self.recording_limit():
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
        exchange = self.exchange
        if exchange.tap is not None:
            # Recorded before Envoy is told to pass the chunk on: a follow-up sent the instant
            # the client has the whole answer finds the record.
            await exchange.chunk(bytes(message.body))
            if message.end_of_stream:
                await exchange.end()
                self.close()
        return ext_proc.ProcessingResponse(response_body=ext_proc.BodyResponse())

    def close(self) -> None:
        """The answer has been relayed, or its stream cut short (the calls the client got
        count): door 2 checks the calls of the responses recorded, as `serve` does."""
        self.exchange.close()

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
