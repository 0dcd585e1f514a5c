"""The aiohttp application: gated routes, pass-through for the rest, admin endpoints, serving."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy import audit, body, routes
from proxy.audit import AuditLog
from proxy.config import Config
from proxy.gate import NOTHING_RECORDED, Verdict, inspect, rejection
from proxy.ledger import Ledger, ResponseTap, open_store
from proxy.metrics import CONTENT_TYPE, Metrics
from proxy.upstream import Tap, Upstream, UpstreamError, relayed_headers

log = logging.getLogger("replay_proxy")

CONFIG = web.AppKey("config", Config)
UPSTREAM = web.AppKey("upstream", Upstream)
AUDIT = web.AppKey("audit", AuditLog)
METRICS = web.AppKey("metrics", Metrics)
LEDGER = web.AppKey("ledger", Ledger)

# Methods that never carry a request to create a response; on a gated path they pass through
# only when they have no body.
_BODYLESS = frozenset({"GET", "HEAD", "OPTIONS"})
_STRIPPED_DROP = frozenset({"content-encoding", "content-length"})


def make_app(config: Config) -> web.Application:
    # Bodies are read raw (the proxy decodes them itself, under the size limit, and forwards
    # the original bytes); a client that hangs up cancels its handler, which releases the
    # upstream connection at once instead of at the upstream's next chunk.
    app = web.Application(handler_args={"auto_decompress": False, "handler_cancellation": True})
    app[CONFIG] = config
    app[METRICS] = Metrics()
    app.cleanup_ctx.append(_upstream_ctx)
    app.cleanup_ctx.append(_audit_ctx)
    app.cleanup_ctx.append(_ledger_ctx)
    app.router.add_get("/-/healthy", healthy)
    app.router.add_get("/-/metrics", metrics)
    app.router.add_route("*", "/{tail:.*}", proxy)
    return app


async def _upstream_ctx(app: web.Application) -> AsyncIterator[None]:
    upstream = Upstream(app[CONFIG].upstream)
    await upstream.start()
    app[UPSTREAM] = upstream
    yield
    await upstream.close()


async def _audit_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[CONFIG].audit
    app[AUDIT] = AuditLog(settings.path, include_arguments=settings.include_arguments)
    yield
    app[AUDIT].close()


async def _ledger_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[CONFIG].ledger
    metrics = app[METRICS]
    store = open_store(settings)
    app[LEDGER] = Ledger(
        store,
        max_chain=settings.max_chain,
        fail_open=settings.fail_open,
        on_fault=lambda operation: metrics.ledger_faults.labels(operation).inc(),
    )
    metrics.ledger_responses.set_function(lambda: len(store))
    yield
    await store.close()


def tenant_of(request: web.Request) -> str | None:
    """The tenant of a request: a fingerprint of its credential (None without one)."""
    return audit.tenant_of(request.headers.get("Authorization") or request.headers.get("api-key"))


async def healthy(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "pid": os.getpid()})


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[METRICS].render(), headers={"Content-Type": CONTENT_TYPE})


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    """Every answer the proxy makes itself: the API's `{"error": {...}}` shape."""
    return web.Response(
        status=status,
        body=orjson.dumps(body.error_body(code, message)),
        content_type="application/json",
        headers=headers,
    )


async def proxy(request: web.Request) -> web.StreamResponse:
    raw_path, query = routes.split_target(request.raw_path)
    gated = routes.gated_path(raw_path)
    if gated is not None and _is_websocket(request):
        return await websocket(request, gated, query)
    if gated is not None and (request.method not in _BODYLESS or request.body_exists):
        return await gate(request, gated, query)
    data = request.content if request.body_exists else None
    headers = relayed_headers(request.headers, drop=frozenset({"host"}))
    return await relay(request, "passthrough", raw_path + query, data, headers)


async def relay(
    request: web.Request,
    route: str,
    target: str,
    data: Any,
    headers: CIMultiDict[str],
    extra_headers: Mapping[str, str] | None = None,
    outcome: str = "forward",
    tap_for: Callable[[aiohttp.ClientResponse], Tap | None] | None = None,
) -> web.StreamResponse:
    app = request.app
    streams = app[METRICS].open_streams
    streams.inc()
    try:
        response = await app[UPSTREAM].relay(
            request,
            target,
            data=data,
            headers=headers,
            extra_headers=extra_headers,
            tap_for=tap_for,
        )
    except UpstreamError as exc:
        log.warning("%s %s: %s", request.method, target, exc.message)
        app[METRICS].requests.labels(route, "upstream_error").inc()
        return error_response(exc.status, exc.code, exc.message)
    finally:
        streams.dec()
    app[METRICS].requests.labels(route, outcome).inc()
    return response


async def gate(request: web.Request, path: str, query: str) -> web.StreamResponse:
    """Read, parse and gate a request body; block it, or forward it whole or stripped."""
    app = request.app
    config = app[CONFIG]
    route = routes.GATED[path]
    started = time.perf_counter()
    try:
        body.check_content_type(", ".join(request.headers.getall("Content-Type", ())))
        applied = body.codings(", ".join(request.headers.getall("Content-Encoding", ())))
        raw = await read_raw(request, config.limits.max_body_bytes)
        decoded = body.decode(raw, applied, config.limits.max_body_bytes) if applied else raw
        parsed = body.parse(decoded)
    except body.BodyError as exc:
        app[METRICS].requests.labels(route, "invalid").inc()
        return error_response(exc.status, exc.code, exc.message)
    tenant = tenant_of(request)
    verdict = await judge(app, parsed, raw, path=path, tenant=tenant, transport="http")
    app[METRICS].gate_seconds.observe(time.perf_counter() - started)
    if verdict.outcome == "block":
        app[METRICS].requests.labels(route, "block").inc()
        return web.Response(
            status=400,
            body=orjson.dumps(rejection(verdict)),
            content_type="application/json",
            headers={"x-should-retry": "false"},
        )
    header = verdict.header()
    extra = {"x-replay-gate": header} if header else None
    tap_for = None
    if route == "responses":
        tap_for = _tap_for(app[LEDGER], tenant or "-", config.limits.max_body_bytes)
    if verdict.outcome == "strip":
        stripped = body.dumps({**parsed, "input": verdict.input})
        headers = relayed_headers(request.headers, drop=_STRIPPED_DROP | {"host"})
        return await relay(request, route, path + query, stripped, headers, extra, "strip", tap_for)
    headers = relayed_headers(request.headers, drop=frozenset({"host", "content-length"}))
    return await relay(request, route, path + query, raw, headers, extra, tap_for=tap_for)


def _tap_for(
    ledger: Ledger, tenant: str, limit: int
) -> Callable[[aiohttp.ClientResponse], Tap | None]:
    def tap(upstream: aiohttp.ClientResponse) -> Tap | None:
        if upstream.status != 200:
            return None
        content_type = upstream.headers.get("Content-Type", "")
        return ResponseTap(ledger, tenant, content_type, upstream.content_length, limit)

    return tap


async def read_raw(request: web.Request, limit: int) -> bytes:
    """The body exactly as it arrived; more than `limit` bytes is 413 without reading on."""
    if request.content_length is not None and request.content_length > limit:
        raise body.BodyError(413, "body_too_large", f"the body exceeds the limit of {limit} bytes")
    chunks = bytearray()
    async for chunk in request.content.iter_any():
        chunks += chunk
        if len(chunks) > limit:
            raise body.BodyError(
                413, "body_too_large", f"the body exceeds the limit of {limit} bytes"
            )
    return bytes(chunks)


async def judge(
    app: web.Application,
    parsed: dict[str, Any],
    raw: bytes,
    *,
    path: str,
    tenant: str | None,
    transport: str,
) -> Verdict:
    """Gate a parsed body against its recorded history; count and audit what it finds."""
    config = app[CONFIG]
    view = await app[LEDGER].view(tenant or "-", parsed, provenance=config.gate.require_provenance)
    verdict = inspect(parsed, config.gate, view or NOTHING_RECORDED)
    if verdict.findings:
        for finding in verdict.findings:
            app[METRICS].findings.labels(finding.reason, finding.action).inc()
        app[AUDIT].write(
            audit.Request(
                request_id="req_" + uuid.uuid4().hex,
                transport=transport,
                path=path,
                body=parsed,
                raw=raw,
                tenant=tenant,
            ),
            verdict,
        )
    return verdict


def _is_websocket(request: web.Request) -> bool:
    return request.method == "GET" and request.headers.get("Upgrade", "").lower() == "websocket"


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


async def websocket(request: web.Request, path: str, query: str) -> web.StreamResponse:
    """Relay a WebSocket; every `response.create` frame is gated exactly like a POST body."""
    app = request.app
    limit = app[CONFIG].limits.max_body_bytes
    protocols = [
        p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()
    ]
    try:
        upstream = await app[UPSTREAM].session.ws_connect(
            app[UPSTREAM].url(path + query),
            headers=relayed_headers(request.headers, drop=_WEBSOCKET_OWN),
            protocols=protocols,
            max_msg_size=limit,
            autoping=True,
        )
    except aiohttp.WSServerHandshakeError as exc:
        return error_response(
            exc.status, "upstream_refused", f"the upstream refused: {exc.message}"
        )
    except (aiohttp.ClientError, TimeoutError) as exc:
        return error_response(502, "upstream_unreachable", f"cannot connect to the upstream: {exc}")
    client = web.WebSocketResponse(
        protocols=[upstream.protocol] if upstream.protocol else (), max_msg_size=limit
    )
    await client.prepare(request)
    tenant = tenant_of(request)
    tap = ResponseTap(app[LEDGER], tenant or "-", "", None, limit)
    app[METRICS].open_streams.inc()
    try:
        to_upstream = asyncio.create_task(_client_frames(app, client, upstream, path, tenant))
        to_client = asyncio.create_task(_upstream_frames(upstream, client, tap))
        done, pending = await asyncio.wait(
            (to_upstream, to_client), return_when=asyncio.FIRST_COMPLETED
        )
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            if task.exception() is not None:
                log.warning("websocket relay ended: %r", task.exception())
    finally:
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
) -> None:
    async for message in client:
        if message.type == aiohttp.WSMsgType.TEXT:
            reply, forward = await _gate_frame(app, message.data, path, tenant)
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
    app: web.Application, text: str, path: str, tenant: str | None
) -> tuple[str | None, str | None]:
    """(an error event to answer with, the frame to forward): one of them is None."""
    raw = text.encode("utf-8", "surrogatepass")
    try:
        frame = body.parse(raw)
    except body.BodyError as exc:
        return _error_event(exc.status, body.error_body(exc.code, exc.message)), None
    if frame.get("type") != "response.create":
        return None, text
    started = time.perf_counter()
    verdict = await judge(app, frame, raw, path=path, tenant=tenant, transport="websocket")
    app[METRICS].gate_seconds.observe(time.perf_counter() - started)
    app[METRICS].requests.labels("websocket", verdict.outcome).inc()
    if verdict.outcome == "block":
        return _error_event(400, rejection(verdict)), None
    if verdict.outcome == "strip":
        return None, body.dumps({**frame, "input": verdict.input}).decode()
    return None, text


async def serve(config: Config, *, reuse_port: bool = False) -> None:
    """Serve until SIGTERM or SIGINT, then stop accepting and let requests in flight finish."""
    grace_s = config.listen.shutdown_grace_s
    runner = web.AppRunner(
        make_app(config), handle_signals=False, access_log=None, shutdown_timeout=grace_s
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.listen.host, config.listen.port, reuse_port=reuse_port)
        await site.start()
        port = _bound_port(runner)
        log.info(
            "listening on http://%s:%d, upstream %s", config.listen.host, port, config.upstream.url
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        log.info("stopping: no new connections, %.0f s for requests in flight", grace_s)
    finally:
        await runner.cleanup()


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    raise RuntimeError("the server is not bound to a TCP port")
