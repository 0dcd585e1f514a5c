"""The WebSocket relays: on a gated path every `response.create` frame is gated exactly like a
POST body; on any other path frames pass both ways untouched."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.admission import pipeline
from proxy.admission.tap import ResponseTap
from proxy.gate.errors import ProxyError, internal_error
from proxy.server.headers import WEBSOCKET_OWN, upstream_headers
from proxy.server.in_force import InForce
from proxy.server.keys import AUDIT, IN_FORCE, LEDGER, METRICS, REQUEST_ID, new_request_id
from proxy.server.upstream import UpstreamError, upstream_failure

log = logging.getLogger("replay_proxy")

# What a client's upgrade needs (RFC 6455 §4.1); one without it is refused before the upstream
# is asked.
_HANDSHAKE = (
    "the WebSocket handshake is invalid: it needs Connection: Upgrade, Sec-WebSocket-Version: 13 "
    "and a Sec-WebSocket-Key of 16 bytes in base64"
)


def is_websocket(request: web.Request) -> bool:
    return request.method == "GET" and request.headers.get("Upgrade", "").lower() == "websocket"


def _protocols(request: web.Request) -> list[str]:
    return [
        p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()
    ]


# Close codes a peer may receive but no endpoint may send (RFC 6455 §7.4.1): what goes on.
_UNSENDABLE = {1005: 1000, 1006: 1011, 1015: 1011}


def _sendable(code: int | None) -> int:
    if code is None:
        return 1000
    return _UNSENDABLE.get(code, code)


async def relay_websocket_ungated(
    request: web.Request, current: InForce, target: str
) -> web.StreamResponse:
    """A WebSocket on a path that is not gated: open the same one upstream under `target` (the
    normalised path), then pass frames both ways as they are, and the close code of whichever
    side ends first to the other."""
    app = request.app
    connection_id = request[REQUEST_ID]
    limit = current.config.limits.max_body_bytes
    try:
        upstream = await current.upstream.connect_websocket(
            target,
            upstream_headers(request.headers, current.config, WEBSOCKET_OWN),
            _protocols(request),
            limit,
        )
    except UpstreamError as exc:
        app[METRICS].requests.labels("passthrough", "upstream_error").inc()
        raise upstream_failure(connection_id, f"WebSocket {target}", exc) from None
    app[METRICS].requests.labels("passthrough", "forward").inc()
    client = web.WebSocketResponse(
        protocols=[upstream.protocol] if upstream.protocol else (), max_msg_size=limit
    )
    tasks: list[asyncio.Task[None]] = []
    app[METRICS].open_streams.inc()
    try:
        await client.prepare(request)
        tasks = [
            asyncio.create_task(_pass_frames(client, upstream)),
            asyncio.create_task(_pass_frames(upstream, client)),
        ]
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task.exception() is not None:
                log.warning("%s websocket relay ended: %r", connection_id, task.exception())
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        app[METRICS].open_streams.dec()
        await upstream.close(code=_sendable(client.close_code))
        await client.close(code=_sendable(upstream.close_code))
    return client


async def _pass_frames(
    source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
    sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
) -> None:
    """Every data frame of `source` to `sink`, until `source` closes; then `sink` is closed
    with the code `source` was closed with."""
    async for message in source:
        if message.type == aiohttp.WSMsgType.TEXT:
            await sink.send_str(message.data)
        elif message.type == aiohttp.WSMsgType.BINARY:
            await sink.send_bytes(message.data)
        else:
            break
    await sink.close(code=_sendable(source.close_code))


async def relay_websocket(
    request: web.Request, current: InForce, tenant: str | None, path: str, query: str
) -> web.StreamResponse:
    """Open the same WebSocket upstream, then relay frames both ways until either side ends.

    The upgrade answer's `x-request-id` names the connection; each frame the gate judges gets
    an id of its own (its audit record's, and its error frame's `error.request_id`), logged
    with the connection's when the frame is answered here.
    """
    app = request.app
    connection_id = request[REQUEST_ID]
    limit = current.config.limits.max_body_bytes
    protocols = [
        p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()
    ]
    if not web.WebSocketResponse(protocols=protocols).can_prepare(request):
        raise ProxyError(400, "invalid_websocket_handshake", _HANDSHAKE)
    try:
        upstream = await current.upstream.connect_websocket(
            path + query,
            upstream_headers(request.headers, current.config, WEBSOCKET_OWN),
            protocols,
            limit,
        )
    except UpstreamError as exc:
        raise upstream_failure(connection_id, f"WebSocket {path}", exc) from None
    client = web.WebSocketResponse(
        protocols=[upstream.protocol] if upstream.protocol else (), max_msg_size=limit
    )
    tasks: list[asyncio.Task[None]] = []
    app[METRICS].open_streams.inc()
    try:
        await client.prepare(request)
        tap = ResponseTap(app[LEDGER], tenant or "-", "", None, limit, request_id=connection_id)
        tasks = [
            asyncio.create_task(
                _client_frames(app, client, upstream, path, tenant, connection_id, tap)
            ),
            asyncio.create_task(_upstream_frames(upstream, client, tap)),
        ]
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task.exception() is not None:
                log.warning("%s websocket relay ended: %r", connection_id, task.exception())
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        app[METRICS].open_streams.dec()
        await upstream.close()
        if client.prepared:
            await client.close()
    return client


async def _client_frames(
    app: web.Application,
    client: web.WebSocketResponse,
    upstream: aiohttp.ClientWebSocketResponse,
    path: str,
    tenant: str | None,
    connection_id: str,
    tap: ResponseTap | None = None,
) -> None:
    async for message in client:
        if message.type == aiohttp.WSMsgType.TEXT:
            reply, forward = await _gate_frame(app, message.data, path, tenant, connection_id, tap)
            if reply is not None:
                await client.send_str(reply)
            if forward is not None:
                await upstream.send_str(forward)
        elif message.type == aiohttp.WSMsgType.BINARY:
            # A binary frame could carry a request the upstream parses: it is never relayed.
            refused = ProxyError(400, "invalid_frame", "binary frames are not accepted")
            await client.send_str(_error_event(pipeline.answer_to(refused)))
        else:
            break


async def _upstream_frames(
    upstream: aiohttp.ClientWebSocketResponse, client: web.WebSocketResponse, tap: ResponseTap
) -> None:
    async for message in upstream:
        if message.type == aiohttp.WSMsgType.TEXT:
            await tap.event(message.data)
            await client.send_str(message.data)
        elif message.type == aiohttp.WSMsgType.BINARY:
            await client.send_bytes(message.data)
        else:
            break


def _error_event(answer: pipeline.Answer) -> str:
    """The spec's WebSocket error event around an API error body."""
    event: Mapping[str, Any] = {"type": "error", "status": answer.status, **answer.body}
    return orjson.dumps(event).decode()


async def _gate_frame(
    app: web.Application,
    text: str,
    path: str,
    tenant: str | None,
    connection_id: str,
    tap: ResponseTap | None = None,
) -> tuple[str | None, str | None]:
    """(an error event to answer with, the frame to forward): one of them is None.

    Every frame is judged, whatever its `type`: the spec gives `type` the default
    `response.create`, so a frame without one (or with another) may be read upstream as a
    request, and a frame with nothing to gate passes unchanged. A frame the proxy fails on
    (a bug) is answered with a 500 error event naming its id, and the connection carries on.
    """
    request_id = new_request_id()
    # Each frame is gated under the config in force when it arrives (reloads apply).
    in_force = app[IN_FORCE].current
    config = in_force.config
    raw = text.encode("utf-8", "surrogatepass")
    try:
        decided = await pipeline.admit(
            pipeline.Request(raw, path, "websocket", request_id, tenant),
            config,
            ledger=app[LEDGER],
            audit_log=app[AUDIT],
            metrics=app[METRICS],
            caches=in_force.caches,
        )
    except Exception:
        log.exception("%s unexpected error on a frame of WebSocket %s", request_id, connection_id)
        return _error_event(pipeline.answer_to(internal_error(request_id))), None
    if isinstance(decided, pipeline.Answer):
        code = decided.body["error"]["code"]
        log.info("%s answered a frame of WebSocket %s: %s", request_id, connection_id, code)
        return _error_event(decided), None
    app[METRICS].requests.labels("websocket", decided.outcome).inc()
    if tap is not None and decided.record:
        tap.expect(decided.context)  # the turn's response is recorded with its input
    # Unchanged text goes on as it came; a stripped frame as the bytes admission made.
    return None, text if decided.data is raw else decided.data.decode()
