"""The aiohttp application: gated routes, pass-through for the rest, admin endpoints, serving."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from functools import partial

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler
from aiohttp.web_urldispatcher import _default_expect_handler
from multidict import CIMultiDict

from proxy.admission import body, pipeline, targets
from proxy.admission.exchange import Exchange, Head, refused_target, request_ids, too_large
from proxy.admission.ids import new_request_id
from proxy.admission.mcp import server_of
from proxy.admission.services import open_services
from proxy.config import Config
from proxy.gate.errors import ProxyError, internal_error
from proxy.server import admin
from proxy.server.access import ACCESS, BEGUN, TARGET, observe
from proxy.server.forward import forward
from proxy.server.headers import body_headers_named, mcp_headers, upstream_headers
from proxy.server.in_force import InForce, InForceHolder
from proxy.server.keys import (
    IN_FLIGHT,
    IN_FORCE,
    METRICS,
    READINESS,
    REQUEST_ID,
    SERVICES,
    WORKER,
)
from proxy.server.readiness import Readiness
from proxy.server.tracing import TRACING, Tracing
from proxy.server.upstream import not_utf8
from proxy.server.websocket import relay_websocket, relay_websocket_ungated
from proxy.state.ledger import LedgerFault
from proxy.state.metrics import CONTENT_TYPE, Metrics
from proxy.state.workers import WorkerSlot

log = logging.getLogger("replay_proxy")

# Headers of the client's not to relay, beyond those the upstream hop sets itself.
_KEEP_ALL: frozenset[str] = frozenset()


class _ClientFaults(logging.Filter):
    """A request aiohttp's parser refused (bad framing, a line too long) is the client's fault,
    answered 400 before any handler runs: one line at INFO, not an ERROR with a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        fault = record.exc_info[1] if record.exc_info else None
        if isinstance(fault, HttpProcessingError) and record.levelno > logging.INFO:
            try:
                said = record.getMessage()
            except (TypeError, ValueError):  # a logger filter that raises breaks the request
                return True
            record.msg, record.args = "%s: %s", (said, fault.message or type(fault).__name__)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


_CLIENT_FAULTS = _ClientFaults()
# Read once: an Enum class's attribute is a slow lookup on Python 3.11 (see exchange.py).
_GATE, _SOCKET = Head.GATE, Head.SOCKET


def answer_failure(request: web.Request, exc: Exception) -> web.StreamResponse:
    """The one place a failure becomes an answer: a ProxyError (a refused request target
    too) in the API's error shape, and anything unexpected (a bug) a 500 naming the request
    id, its traceback in the log. After an answer has begun, none can follow: the connection
    is cut instead."""
    request_id = request[REQUEST_ID]
    if isinstance(exc, targets.TargetError) and TARGET not in request:
        # The target could not be read (once read, a TargetError is a bug's, a 500). The
        # metrics looked up only now: on every request it is two aiohttp properties more.
        failure = refused_target(exc, request.app[METRICS])
    elif isinstance(exc, ProxyError):
        failure = exc
    else:
        # The path without its query, which may carry a value that is not the log's to keep.
        path = request.raw_path.partition("?")[0]
        log.exception("%s unexpected error: %s %s", request_id, request.method, path)
        failure = internal_error(request_id)
    request[ACCESS].failed(failure.code)
    begun: web.StreamResponse | None = request.get(BEGUN)
    if begun is not None:
        # No answer can follow one that has begun: the connection is cut, so that the client
        # cannot take what it got for the whole answer.
        log.warning("%s %s after the answer began: connection cut", request_id, failure.code)
        if request.transport is not None:
            request.transport.close()
        return begun
    response = answer(pipeline.answer_to(failure))
    if failure.close:
        response.force_close()
    return response


def observed(handler: Handler) -> Handler:
    """`handler` with what is around every request (`access.observe`), failures answered."""
    return partial(observe, handler=handler, failed=answer_failure)


def answer(decided: pipeline.Answer) -> web.Response:
    """The HTTP answer to a request admission, or a failure, answers here."""
    return web.Response(
        status=decided.status,
        # A finding's expected value may be an integer of a schema's beyond 64 bits.
        body=body.dumps(decided.body),
        content_type="application/json",
        headers=decided.headers,
    )


async def _expect(request: web.Request) -> None:
    """aiohttp's answer to an `Expect` header: 100 Continue, or 417 for any other value. That
    one is raised before any middleware runs: it is named here, like every answer."""
    try:
        await _default_expect_handler(request)
    except web.HTTPException as exc:
        exc.headers.extend(request_ids(new_request_id(), ()))
        raise


def make_app(
    config: Config, worker: WorkerSlot | None = None, *, metrics_dir: str | None = None
) -> web.Application:
    """The proxy for `config`; `worker` is the slot this process fills under a supervisor,
    `metrics_dir` the multiprocess directory its workers share (PROMETHEUS_MULTIPROC_DIR),
    where a scrape reads the whole service."""
    # Bodies are read raw (the proxy decodes them itself, under the size limit, and forwards
    # the decoded bytes it judged); a client that hangs up cancels its handler, which releases the
    # upstream connection at once instead of at the upstream's next chunk. A client too slow
    # to send its head is cut off by the keep-alive timer (`listen.header_timeout_s`).
    app = web.Application(
        # No middleware: every handler is `observed` (see `access.observe`).
        handler_args={
            "auto_decompress": False,
            "handler_cancellation": True,
            "keepalive_timeout": config.listen.header_timeout_s,
        },
    )
    books = app[METRICS] = Metrics(
        body_timeout_s=config.limits.body_timeout_s,
        upstream_timeout_s=config.upstream.connect_timeout_s + config.upstream.read_timeout_s,
        shared_ledger=config.ledger.backend == "redis",
        multiprocess_dir=metrics_dir,
    )
    app[IN_FORCE] = InForceHolder(
        on_reload=lambda applied: books.reloads.labels("applied" if applied else "rejected").inc()
    )
    app[READINESS] = Readiness(config.ledger, books, worker)
    app[IN_FLIGHT] = set()
    if worker is not None:
        app[WORKER] = worker
    logging.getLogger("aiohttp.server").addFilter(_CLIENT_FAULTS)  # added once, however many apps

    async def in_force_ctx(app: web.Application) -> AsyncIterator[None]:
        await app[IN_FORCE].start(config)
        yield
        await app[IN_FORCE].close()

    app.cleanup_ctx.append(in_force_ctx)
    if books.process is not None:
        app.cleanup_ctx.append(_worker_process_ctx)
    app.cleanup_ctx.append(_services_ctx)
    app.cleanup_ctx.append(_watch_workers_ctx)
    app.cleanup_ctx.append(_tracing_ctx)
    # On the data listener an admin endpoint is guarded (see `admin.guarded`).
    app.router.add_get("/-/healthy", observed(admin.guarded(healthy)), expect_handler=_expect)
    app.router.add_get("/-/ready", observed(admin.guarded(admin.ready)), expect_handler=_expect)
    app.router.add_get("/-/metrics", observed(admin.guarded(metrics)), expect_handler=_expect)
    _serve_every_target(app, observed(proxy))
    return app


class _EveryTarget(web.DynamicResource):
    """`/{tail:.*}`, and the targets no path matches (the asterisk-form of `OPTIONS *`): every
    request reaches a handler, which reads its target and refuses one that is not its to
    serve. (aiohttp answers an unmatched target itself, a plain-text 404, unless a middleware
    wraps it; the proxy has none, see `access.observe`.)"""

    def __init__(self, handler: Handler) -> None:
        super().__init__("/{tail:.*}")
        self.every = self.add_route("*", handler, expect_handler=_expect)

    async def resolve(
        self, request: web.Request
    ) -> tuple[web.UrlMappingMatchInfo | None, set[str]]:
        found, allowed = await super().resolve(request)
        if found is None:
            return web.UrlMappingMatchInfo({"tail": ""}, self.every), allowed
        return found, allowed


def _serve_every_target(app: web.Application, handler: Handler) -> None:
    """`handler` answers every request no other route takes."""
    app.router.register_resource(_EveryTarget(handler))


def make_admin_app(main: web.Application) -> web.Application:
    """The admin endpoints alone, for their own listener (`admin.listen`): the state of the
    started `main` app, no key asked, and nothing else served (a 404 in the API's shape)."""
    app = web.Application()
    for key, value in main.items():
        app[key] = value
    app[IN_FLIGHT] = set()  # a stop waits for the data listener's requests, not these
    app.router.add_get("/-/healthy", observed(healthy), expect_handler=_expect)
    app.router.add_get("/-/ready", observed(admin.ready), expect_handler=_expect)
    app.router.add_get("/-/metrics", observed(metrics), expect_handler=_expect)
    _serve_every_target(app, observed(admin.not_admin))
    return app


async def _watch_workers_ctx(app: web.Application) -> AsyncIterator[None]:
    watch = asyncio.create_task(app[READINESS].watch())
    yield
    watch.cancel()
    await asyncio.gather(watch, return_exceptions=True)


async def _services_ctx(app: web.Application) -> AsyncIterator[None]:
    worker = app.get(WORKER)
    config = app[IN_FORCE].current.config
    async with open_services(
        config.audit,
        config.ledger,
        app[METRICS],
        # Several workers on stdout: a chain each, named, and written whole.
        chain=None if worker is None else worker.chain,
        lock_path=None if worker is None else worker.stdout_lock,
    ) as services:
        app[SERVICES] = services
        yield


async def _worker_process_ctx(app: web.Application) -> AsyncIterator[None]:
    """Write this worker's process figures now and every few seconds, for the scrapes that
    land on the other workers."""
    process = app[METRICS].process
    assert process is not None
    task = asyncio.create_task(process.keep_refreshed())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _tracing_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[IN_FORCE].current.config.tracing
    if settings.enabled and TRACING not in app:  # a test may have given it an exporter
        app[TRACING] = Tracing(settings)
    yield
    if TRACING in app:
        await app[TRACING].close()


async def healthy(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "pid": os.getpid()})


async def metrics(request: web.Request) -> web.Response:
    app = request.app
    books = app[METRICS]
    # The gauges of what is held now, read when asked (in multiprocess mode, a gauge is what
    # its worker last set: there is no reading another worker's memory).
    caches = app[IN_FORCE].current.caches
    books.verdicts_held(len(caches))
    held = caches.prefixes.held()
    books.prefix_sessions.set(len(held))
    books.prefix_bytes.set(sum(held))
    # Readiness too, so that a Prometheus sees it where nothing probes /-/ready (its network
    # checks are cached and bounded in time: a scrape adds a connect every few seconds at most).
    await admin.check_readiness(app)
    try:
        books.ledger_responses.set(await app[SERVICES].ledger.store.size())
    except LedgerFault as exc:
        app[SERVICES].ledger.fault("size", exc)
    # Rendering reads every worker's files: not on the event loop. One process's registry is
    # read on it: what its requests counted since the last scrape is added to it there.
    if books.multiprocess_dir is None:
        rendered = books.render()
    else:
        rendered = await asyncio.to_thread(books.render)
    return web.Response(body=rendered, headers={"Content-Type": CONTENT_TYPE})


async def proxy(request: web.Request) -> web.StreamResponse:
    app = request.app
    current = app[IN_FORCE].current
    exchange = Exchange(app[SERVICES], current.config, current.caches, "http", request[REQUEST_ID])
    named = body_headers_named(request.headers)
    if named:
        # Dropped as hop-by-hop, such a header would leave the upstream reading the body
        # differently from the proxy.
        raise exchange.refuse(
            ProxyError(
                400,
                "invalid_connection_header",
                f"Connection names {named[0]}, which gives the body its meaning and is never "
                "dropped",
            )
        )
    unreadable = not_utf8(request.headers)
    if unreadable is not None:
        # It could not go upstream as it came (see not_utf8): refused rather than changed.
        failure = ProxyError(400, "invalid_header", f"the value of {unreadable} is not UTF-8 text")
        raise exchange.refuse(failure)
    current.acquire()
    try:
        return await _proxy(request, current, exchange, app.get(TRACING))
    finally:
        closing = current.release()
        if closing is not None:
            await closing


async def _proxy(
    request: web.Request, current: InForce, exchange: Exchange, tracing: Tracing | None
) -> web.StreamResponse:
    target = request[TARGET]
    headers = request.headers

    def values(name: str) -> list[str]:
        return headers.getall(name, [])

    server = server_of(target.path)
    if server is not None and server in current.config.mcp.servers:
        decided = exchange.mcp_head(
            request.method, server, target, values, has_body=request.body_exists
        )
    else:
        decided = exchange.head(request.method, target, values, has_body=request.body_exists)
    access = request[ACCESS]
    access.tenant = exchange.tenant
    assert exchange.target is not None
    gated = exchange.target.gated
    access.route = exchange.route if gated is None else targets.GATED[gated]
    if decided is _GATE:
        return await gate(request, current, exchange, tracing)
    if exchange.mcp is not None:
        # The server's stream (GET) or the session's end (DELETE), watched by the MCP tap.
        upstream = current.upstreams[exchange.upstream or ""]
        sent = mcp_headers(headers, current.config, exchange.mcp.server, _KEEP_ALL)
        data = request.content.iter_any() if request.body_exists else None
        target_sent = exchange.forward_target()
        return await forward(request, exchange, upstream, target_sent, data, sent, access, tracing)
    if decided is _SOCKET:
        upstream = current.upstreams[exchange.passthrough(request.method)]
        return await relay_websocket(request, current, upstream, exchange)
    upstream = current.upstreams[exchange.passthrough(request.method)]
    if request.method == "GET" and headers.get("Upgrade", "").lower() == "websocket":
        return await relay_websocket_ungated(
            request, current, upstream, exchange.target.forward, exchange
        )
    data = request.content.iter_any() if request.body_exists else None
    sent = upstream_headers(headers, current.config, _KEEP_ALL, upstream.settings)
    if "Accept-Encoding" in sent:
        _ask_readable(exchange, sent)
    return await forward(
        request,
        exchange,
        upstream,
        exchange.target.forward,
        data,
        sent,
        access,
        tracing,
    )


def _ask_readable(exchange: Exchange, headers: CIMultiDict[str]) -> None:
    """Leave in the upstream's `Accept-Encoding` only codings the tap can read."""
    readable = exchange.accept_encoding(lambda name: headers.getall(name, []))
    if readable is not None:
        headers.popall("Accept-Encoding", None)
        headers["Accept-Encoding"] = readable


async def gate(
    request: web.Request, current: InForce, exchange: Exchange, tracing: Tracing | None = None
) -> web.StreamResponse:
    """Read a request body and hand it to its exchange: answer it here, or forward it."""
    config = current.config
    headers = request.headers
    try:
        raw = await read_raw(request, config.limits.max_body_bytes, config.limits.body_timeout_s)
    except body.BodyError as exc:
        raise exchange.invalid(exc) from None
    except TimeoutError:
        timeout_s = config.limits.body_timeout_s
        message = f"the body did not arrive within {timeout_s:g} s"
        raise exchange.invalid(ProxyError(408, "body_timeout", message, close=True)) from None
    # The gate's time starts once the body is here: the client's upload is not the gate's.
    arrived = time.perf_counter()
    access = request[ACCESS]
    access.body_bytes = len(raw)
    coding = ", ".join(headers.getall("Content-Encoding", ()))
    decided = await exchange.body(raw, content_encoding=coding, started=arrived)
    access.gate_s = time.perf_counter() - arrived
    if decided.findings:
        access.found(finding.action for finding in decided.findings)
    if isinstance(decided, pipeline.Answer):
        error = decided.body.get("error")
        if decided.status >= 400 and isinstance(error, dict):
            # A JSON-RPC error (MCP) holds the proxy's own code in its data.
            data = error.get("data")
            access.failed(data["code"] if isinstance(data, dict) else error["code"])
        return answer(decided)
    upstream = current.upstreams[decided.upstream]
    if exchange.mcp is not None:
        sent = mcp_headers(headers, config, exchange.mcp.server, decided.drop_headers)
    else:
        sent = upstream_headers(headers, config, decided.drop_headers, upstream.settings)
        if "Accept-Encoding" in sent:
            _ask_readable(exchange, sent)
    return await forward(
        request,
        exchange,
        upstream,
        exchange.forward_target(),
        decided.data,
        sent,
        access,
        tracing,
    )


async def read_raw(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The body exactly as it arrived; more than `limit` bytes is 413 without reading on, and
    a body that takes longer than `timeout_s` to arrive is a TimeoutError. (A larger declared
    `Content-Length` was refused with its head, by `Exchange.head`.)"""
    content = request.content
    if content.is_eof():
        # Already whole, as small bodies usually are by the time the handler runs.
        whole = content.read_nowait()
        if len(whole) > limit:
            raise too_large(limit)
        return whole
    # Joined once at the end: growing one buffer chunk by chunk copied and faulted in a 1 MB
    # body several times over (1.2 ms of its 12 ms under load).
    chunks: list[bytes] = []
    size = 0
    async with asyncio.timeout(timeout_s):
        async for chunk in content.iter_any():
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
    return b"".join(chunks)
