"""The WebSocket relays: on a gated path every `response.create` frame is gated exactly like a
POST body; on any other path frames pass both ways untouched."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from proxy.admission import body, pipeline
from proxy.admission.access import Access
from proxy.admission.continuations import Continuations
from proxy.admission.exchange import Exchange
from proxy.admission.ids import new_request_id
from proxy.admission.tap import ResponseTap
from proxy.gate.errors import ProxyError, internal_error
from proxy.gate.reasons import Outcome
from proxy.server.access import ACCESS, name_answer
from proxy.server.headers import WEBSOCKET_OWN, upstream_headers
from proxy.server.in_force import InForce
from proxy.server.keys import IN_FORCE, METRICS, REQUEST_ID
from proxy.server.tracing import TRACING
from proxy.server.upstream import Upstream, UpstreamError, upstream_failure

log = logging.getLogger("replay_proxy")

# What a client's upgrade needs (RFC 6455 §4.1); one without it is refused before the upstream
# is asked.
_HANDSHAKE = (
    "the WebSocket handshake is invalid: it needs Connection: Upgrade, Sec-WebSocket-Version: 13 "
    "and a Sec-WebSocket-Key of 16 bytes in base64"
)


def _protocols(request: web.Request) -> list[str]:
    return [
        p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()
    ]


# Close codes a peer may receive but no endpoint may send (RFC 6455 §7.4.1): what goes on.
# aiohttp reads a close frame without a code as code 0: that is 1005 (no status received).
_UNSENDABLE = {0: 1000, 1005: 1000, 1006: 1011, 1015: 1011}
# A close frame's reason fits in 123 bytes (RFC 6455 §5.5: a control frame's payload is at most
# 125 bytes, two of them the code).
_MAX_REASON = 123

_Socket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse


def sendable(code: int | None) -> int:
    """The close code to pass on for one received (None: the side ended without one)."""
    if code is None:
        return 1000
    return _UNSENDABLE.get(code, code)


@dataclass
class Ending:
    """How one side of a relayed WebSocket ended: the code and reason of the close frame it
    sent, or (no close frame) the code aiohttp gave the end it saw."""

    code: int | None = None
    reason: str = ""


async def iter_data(source: _Socket, ending: Ending) -> AsyncIterator[aiohttp.WSMessage]:
    """The data frames of `source` until it ends; then `ending` says how it did.

    `async for` over a socket drops the close frame's reason: frames are received one by one
    so that the reason reaches the other side with the code.
    """
    while True:
        message = await source.receive()
        if message.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
            yield message
        elif message.type == aiohttp.WSMsgType.CLOSE:
            ending.code, ending.reason = message.data, message.extra or ""
            return
        elif message.type in (
            aiohttp.WSMsgType.CLOSING,
            aiohttp.WSMsgType.CLOSED,
            aiohttp.WSMsgType.ERROR,
        ):
            ending.code = source.close_code
            return


async def close_as(sink: _Socket, ending: Ending) -> None:
    """Close `sink` with the code and reason its peer's side ended with (a code no endpoint may
    send becomes the one that says the same: 1006 → 1011)."""
    # A reason cut inside a character would not be UTF-8 (RFC 6455 §7.1.6): the rest goes.
    reason = ending.reason.encode()[:_MAX_REASON].decode("utf-8", "ignore").encode()
    await sink.close(code=sendable(ending.code), message=reason)


async def relay_websocket_ungated(
    request: web.Request, current: InForce, to: Upstream, target: str, exchange: Exchange
) -> web.StreamResponse:
    """A WebSocket on a path that is not gated: open the same one upstream under `target` (the
    normalised path), then pass frames both ways as they are, and the close code and reason of
    whichever side ends first to the other."""
    client, upstream = await _connect(request, current, to, target, exchange)
    exchange.counted()
    request[ACCESS].outcome = Outcome.FORWARD
    return await _relay(
        request,
        client,
        upstream,
        lambda pair: (
            _pass_frames(client, upstream, pair.client_ended),
            _pass_frames(upstream, client, pair.upstream_ended),
        ),
    )


async def _connect(
    request: web.Request,
    current: InForce,
    to: Upstream,
    target: str,
    exchange: Exchange | None = None,
) -> tuple[web.WebSocketResponse, aiohttp.ClientWebSocketResponse]:
    """The same WebSocket opened upstream under `target`, and the client's side to answer the
    upgrade with; a handshake that cannot be answered is refused before the upstream is asked.
    With an `exchange` (an ungated WebSocket), an upstream that cannot be had is counted."""
    limit = current.config.limits.max_body_bytes
    protocols = _protocols(request)
    if not web.WebSocketResponse(protocols=protocols).can_prepare(request):
        raise ProxyError(400, "invalid_websocket_handshake", _HANDSHAKE)
    books = request.app[METRICS]
    headers = upstream_headers(request.headers, current.config, WEBSOCKET_OWN, to.settings)
    if TRACING in request.app:
        request.app[TRACING].inject(headers)
    sent = time.perf_counter()
    try:
        upstream = await to.connect_websocket(target, headers, protocols, limit)
    except UpstreamError as exc:
        # A refused upgrade is an answer, with its status; none had is named by its failure.
        failed = str(exc.status) if exc.code == "upstream_refused" else exc.code
        books.upstream_answered(
            to.name,
            "websocket" if exchange is None else exchange.route,
            failed.removeprefix("upstream_"),
            time.perf_counter() - sent,
        )
        if exchange is not None:
            exchange.upstream_failed()
        what = f"WebSocket {target.partition('?')[0]}"
        raise upstream_failure(request[REQUEST_ID], what, exc) from None
    elapsed = time.perf_counter() - sent
    route = "websocket" if exchange is None else exchange.route
    books.upstream_answered(to.name, route, "101", elapsed)
    request[ACCESS].upstream_s = elapsed  # until the upgrade's answer
    client = web.WebSocketResponse(
        protocols=[upstream.protocol] if upstream.protocol else (), max_msg_size=limit
    )
    return client, upstream


async def _relay(
    request: web.Request,
    client: web.WebSocketResponse,
    upstream: aiohttp.ClientWebSocketResponse,
    sides: Callable[[_Pair], tuple[Coroutine[Any, Any, None], Coroutine[Any, Any, None]]],
) -> web.StreamResponse:
    """Answer the upgrade, relay both directions (`sides` makes them, once the upgrade is
    answered) until one ends, then close each side the way the other ended."""
    metrics = request.app[METRICS]
    pair = _Pair(client, upstream)
    metrics.stream_opened()
    try:
        access = request[ACCESS]
        name_answer(request, client, access)
        await client.prepare(request)
        access.status = client.status  # 101, set as the upgrade is answered
        await pair.relay(*sides(pair), request[REQUEST_ID])
    finally:
        metrics.stream_closed()
        await pair.close()
    return client


@dataclass
class _Pair:
    """The two sockets of a relayed WebSocket, and how each side ended."""

    client: web.WebSocketResponse
    upstream: aiohttp.ClientWebSocketResponse
    client_ended: Ending = field(default_factory=Ending)
    upstream_ended: Ending = field(default_factory=Ending)

    async def relay(
        self,
        from_client: Coroutine[Any, Any, None],
        from_upstream: Coroutine[Any, Any, None],
        connection_id: str,
    ) -> None:
        """Relay both directions until one ends."""
        tasks = [asyncio.create_task(from_client), asyncio.create_task(from_upstream)]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is not None:
                    log.warning("%s websocket relay ended: %r", connection_id, task.exception())
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """Each side closed the way the other ended, if it is not closed yet.

        The relay may be cancelled midway through passing a close on (its handler is, when
        the client's connection goes): the code and reason are then passed on here.
        """
        for ended, side in (
            (self.client_ended, self.client),
            (self.upstream_ended, self.upstream),
        ):
            if ended.code is None:
                ended.code = side.close_code
        await close_as(self.upstream, self.client_ended)
        if self.client.prepared:
            await close_as(self.client, self.upstream_ended)


async def _pass_frames(source: _Socket, sink: _Socket, ending: Ending) -> None:
    """Every data frame of `source` to `sink`, until `source` closes; then `sink` is closed
    the way `source` was."""
    async for message in iter_data(source, ending):
        if message.type == aiohttp.WSMsgType.TEXT:
            await sink.send_str(message.data)
        else:
            await sink.send_bytes(message.data)
    await close_as(sink, ending)


async def relay_websocket(
    request: web.Request, current: InForce, to: Upstream, exchange: Exchange
) -> web.StreamResponse:
    """Open the same WebSocket upstream, then relay frames both ways until either side ends.

    `exchange` is the upgrade's: it chose the upstream by the path as received and the headers
    routes match on, and each frame is an exchange of its own, routed by them and its own body
    (a frame whose model routes elsewhere is refused) and gated under its own route's policy.

    The upgrade answer's `x-request-id` names the connection; each frame the gate judges gets
    an id of its own (its audit record's, and its error frame's `error.request_id`), logged
    with the connection's when the frame is answered here.
    """
    app = request.app
    assert exchange.target is not None
    assert exchange.target.gated is not None
    access = request[ACCESS]
    access.route = "websocket"
    target = exchange.target.gated + exchange.target.query
    client, upstream = await _connect(request, current, to, target)
    access.outcome, access.frames = Outcome.FORWARD, 0
    tap = exchange.watch_turns()
    frames = _ClientFrames(app, exchange, access=access)
    return await _relay(
        request,
        client,
        upstream,
        lambda pair: (
            frames.relay(client, upstream, pair.client_ended),
            _upstream_frames(app, exchange, upstream, client, tap, pair.upstream_ended),
        ),
    )


@dataclass
class _ClientFrames:
    """The client's side of a gated WebSocket: each frame gated, and what the connection may
    still continue."""

    app: web.Application
    connection: Exchange  # the upgrade's: its frames' tenant, path, headers and upstream
    continuations: Continuations = field(default_factory=Continuations)
    access: Access | None = None  # the connection's: its frames and their findings counted

    async def relay(
        self,
        client: web.WebSocketResponse,
        upstream: aiohttp.ClientWebSocketResponse,
        ending: Ending,
    ) -> None:
        """Every frame of the client, gated, until it closes; then the upstream is closed the
        way the client closed."""
        async for message in iter_data(client, ending):
            if message.type == aiohttp.WSMsgType.TEXT:
                reply, forward = await self.gate(message.data)
                if reply is not None:
                    await client.send_str(reply)
                if forward is not None:
                    await upstream.send_str(forward)
            else:
                # A binary frame could carry a request the upstream parses: it is never relayed.
                refused = ProxyError(400, "invalid_frame", "binary frames are not accepted")
                await client.send_str(_error_event(pipeline.answer_to(refused)))
        await close_as(upstream, ending)

    async def gate(self, text: str) -> tuple[str | None, str | None]:
        """(an error event to answer with, the frame to forward): one of them is None.

        Every frame is judged, whatever its `type`: the spec gives `type` the default
        `response.create`, so a frame without one (or with another) may be read upstream as a
        request, and a frame with nothing to gate passes unchanged. A frame the proxy fails on
        (a bug) is answered with a 500 error event naming its id, and the connection carries
        on. A frame answered here with a 4xx evicts the response it continued, for this
        connection.
        """
        connection = self.connection
        connection_id = connection.request_id
        request_id = new_request_id()
        if self.access is not None:
            self.access.frames = (self.access.frames or 0) + 1
        raw = text.encode("utf-8", "surrogatepass")
        # Each frame is gated under the config in force when it arrives (reloads apply).
        in_force = self.app[IN_FORCE].current
        frame = connection.frame(request_id, in_force.config, in_force.caches)
        evicted = self.continuations.refusal(raw)
        if evicted is not None:
            frame.refuse(evicted, route="websocket", upstream=connection.upstream or "-")
            log.info(
                "%s answered a frame of WebSocket %s: %s", request_id, connection_id, evicted.code
            )
            return _error_event(pipeline.answer_to(evicted)), None
        try:
            decided = await frame.body(raw, upstream=connection.upstream)
        except Exception:
            log.exception(
                "%s unexpected error on a frame of WebSocket %s", request_id, connection_id
            )
            self.continuations.failed(raw)
            return _error_event(pipeline.answer_to(internal_error(request_id))), None
        if self.access is not None:
            self.access.found(finding.action for finding in decided.findings)
        if isinstance(decided, pipeline.Answer):
            code = decided.body["error"]["code"]
            log.info("%s answered a frame of WebSocket %s: %s", request_id, connection_id, code)
            if decided.status < 500:
                # A fault of the proxy's (its ledger down) is retried as it was: not evicted.
                self.continuations.failed(raw)
            return _error_event(decided), None
        connection.turn_forwarded(frame, decided)
        # Unchanged text goes on as it came; a stripped frame as the bytes admission made.
        return None, text if decided.data is raw else decided.data.decode()


async def _upstream_frames(
    app: web.Application,
    exchange: Exchange,
    upstream: aiohttp.ClientWebSocketResponse,
    client: web.WebSocketResponse,
    tap: ResponseTap,
    ending: Ending,
) -> None:
    """Every frame of the upstream to the client, each event recorded as it passes; then the
    client is closed the way the upstream closed.

    Once a frame that ended a turn has gone to the client, the calls of that turn's response
    are checked (door 2) under the config in force then."""
    try:
        async for message in iter_data(upstream, ending):
            if message.type == aiohttp.WSMsgType.TEXT:
                await tap.event(message.data)
                await client.send_str(message.data)
                _check_emitted(app, exchange)
            else:
                await client.send_bytes(message.data)
        await close_as(client, ending)
    finally:
        _check_emitted(app, exchange)


def _check_emitted(app: web.Application, exchange: Exchange) -> None:
    in_force = app[IN_FORCE].current
    exchange.turns_relayed(in_force.config.gate, in_force.caches)


def _error_event(answer: pipeline.Answer) -> str:
    """The spec's WebSocket error event around an API error body."""
    event: Mapping[str, Any] = {"type": "error", "status": answer.status, **answer.body}
    return body.dumps(event).decode()
