"""The WebSocket relays: on a gated path every `response.create` frame is gated exactly like a
POST body; on any other path frames pass both ways untouched."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy import body
from proxy.boundary import (
    LEDGER,
    LIVE,
    METRICS,
    REQUEST_ID,
    Current,
    blocked,
    judge,
    new_request_id,
    upstream_failed,
    upstream_headers,
)
from proxy.config import Config
from proxy.tap import ResponseTap
from proxy.upstream import UpstreamError

log = logging.getLogger("replay_proxy")

# Negotiated per hop by aiohttp on each side; never copied from one hop to the other.
_WEBSOCKET_OWN = frozenset(
    {
        "host",
        "content-length",
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-protocol",
        "sec-websocket-accept",
    }
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
    request: web.Request, current: Current, target: str
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
            upstream_headers(request.headers, current.config, _WEBSOCKET_OWN),
            _protocols(request),
            limit,
        )
    except UpstreamError as exc:
        app[METRICS].requests.labels("passthrough", "upstream_error").inc()
        return upstream_failed(connection_id, f"WebSocket {target}", exc)
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
    request: web.Request, current: Current, tenant: str | None, path: str, query: str
) -> web.StreamResponse:
    """Open the same WebSocket upstream, then relay frames both ways until either side ends.

    The upgrade answer's `x-request-id` names the connection; each frame the gate judges gets
    an id of its own (its audit record's, and its error frame's `error.request_id`), logged
    with the connection's when the frame is blocked.
    """
    app = request.app
    connection_id = request[REQUEST_ID]
    limit = current.config.limits.max_body_bytes
    protocols = [
        p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()
    ]
    try:
        upstream = await current.upstream.connect_websocket(
            path + query,
            upstream_headers(request.headers, current.config, _WEBSOCKET_OWN),
            protocols,
            limit,
        )
    except UpstreamError as exc:
        return upstream_failed(connection_id, f"WebSocket {path}", exc)
    client = web.WebSocketResponse(
        protocols=[upstream.protocol] if upstream.protocol else (), max_msg_size=limit
    )
    tasks: list[asyncio.Task[None]] = []
    app[METRICS].open_streams.inc()
    try:
        await client.prepare(request)
        tap = ResponseTap(app[LEDGER], tenant or "-", "", None, limit, request_id=connection_id)
        tasks = [
            asyncio.create_task(_client_frames(app, client, upstream, path, tenant, connection_id)),
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
        await client.close()
    return client


async def _client_frames(
    app: web.Application,
    client: web.WebSocketResponse,
    upstream: aiohttp.ClientWebSocketResponse,
    path: str,
    tenant: str | None,
    connection_id: str,
) -> None:
    async for message in client:
        if message.type == aiohttp.WSMsgType.TEXT:
            # Each frame is gated under the config in force when it arrives (reloads apply).
            config = app[LIVE].current.config
            reply, forward = await _gate_frame(
                app, config, message.data, path, tenant, connection_id
            )
            if reply is not None:
                await client.send_str(reply)
            if forward is not None:
                await upstream.send_str(forward)
        elif message.type == aiohttp.WSMsgType.BINARY:
            # A binary frame could carry a request the upstream parses: it is never relayed.
            error = body.error_body("invalid_frame", "binary frames are not accepted")
            await client.send_str(_error_event(400, error))
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


def _error_event(status: int, error: Mapping[str, Any]) -> str:
    """The spec's WebSocket error event around an API error body."""
    return orjson.dumps({"type": "error", "status": status, **error}).decode()


async def _gate_frame(
    app: web.Application,
    config: Config,
    text: str,
    path: str,
    tenant: str | None,
    connection_id: str,
) -> tuple[str | None, str | None]:
    """(an error event to answer with, the frame to forward): one of them is None.

    Every frame is judged, whatever its `type`: the spec gives `type` the default
    `response.create`, so a frame without one (or with another) may be read upstream as a
    request, and a frame with nothing to gate passes unchanged.
    """
    raw = text.encode("utf-8", "surrogatepass")
    try:
        frame = body.parse(raw)
    except body.BodyError as exc:
        return _error_event(exc.status, body.error_body(exc.code, exc.message)), None
    started = time.perf_counter()
    request_id = new_request_id()
    verdict = await judge(
        app,
        config,
        frame,
        raw,
        request_id=request_id,
        path=path,
        tenant=tenant,
        transport="websocket",
    )
    app[METRICS].gate_seconds.observe(time.perf_counter() - started)
    app[METRICS].requests.labels("websocket", verdict.outcome).inc()
    if verdict.outcome == "block":
        log.info("%s blocked a frame of WebSocket %s", request_id, connection_id)
        return _error_event(400, blocked(verdict, request_id)), None
    if verdict.outcome == "strip":
        assert verdict.input is not None
        return None, body.stripped(frame, verdict.input).decode()
    return None, text
