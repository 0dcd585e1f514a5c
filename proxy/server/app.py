"""The aiohttp application: gated routes, pass-through for the rest, admin endpoints, serving."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterable, AsyncIterator, Mapping

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler
from multidict import CIMultiDict

from proxy.admission import body, pipeline, routing, targets
from proxy.admission.emitted import EmittedChecks, recording_of
from proxy.admission.ids import new_request_id
from proxy.admission.services import open_audit_log, open_ledger
from proxy.admission.tap import Recording
from proxy.config import Config
from proxy.gate.errors import ProxyError, internal_error
from proxy.server import admin
from proxy.server.access import ACCESS, observe
from proxy.server.clients import tenant_of
from proxy.server.headers import body_headers_named, readable_accept_encoding, upstream_headers
from proxy.server.in_force import InForce, InForceHolder
from proxy.server.keys import (
    AUDIT,
    EMITTED,
    IN_FORCE,
    LEDGER,
    METRICS,
    READINESS,
    REQUEST_ID,
    WORKER,
)
from proxy.server.readiness import Readiness
from proxy.server.tracing import TRACING, Tracing
from proxy.server.upstream import Upstream, UpstreamError, not_utf8, upstream_failure
from proxy.server.websocket import is_websocket, relay_websocket, relay_websocket_ungated
from proxy.state.ledger import LedgerFault
from proxy.state.metrics import CONTENT_TYPE, Metrics
from proxy.state.workers import WorkerSlot

log = logging.getLogger("replay_proxy")

# Methods that never carry a request to create a response; on a gated path they pass through
# only when they have no body.
_BODYLESS = frozenset({"GET", "HEAD", "OPTIONS"})
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
# The request target as the proxy read it, for every handler.
TARGET = web.RequestKey("target", targets.Target)
# The answer a request has begun to send (it is being prepared, its head on its way).
_BEGUN = web.RequestKey("answer_begun", web.StreamResponse)


@web.middleware
async def check_target(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A request target that is not valid origin-form or absolute-form is refused (400) here,
    whatever the path and method, before any handler (an admin one too) runs."""
    try:
        request[TARGET] = targets.read_target(request.raw_path)
    except targets.TargetError as exc:
        request.app[METRICS].count("any", "invalid_target", "-")
        raise ProxyError(400, "invalid_request_target", str(exc)) from None
    return await handler(request)


@web.middleware
async def answer_failures(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one place a failure becomes an answer: a ProxyError in the API's error shape, and
    anything unexpected (a bug) a 500 naming the request id, its traceback in the log."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise  # aiohttp's own answers (none of the proxy's routes raise one)
    except Exception as exc:
        request_id = request[REQUEST_ID]
        if isinstance(exc, ProxyError):
            failure = exc
        else:
            # The path without its query, which may carry a value that is not the log's to keep.
            path = request.raw_path.partition("?")[0]
            log.exception("%s unexpected error: %s %s", request_id, request.method, path)
            failure = internal_error(request_id)
        request[ACCESS].failed(failure.code)
        begun: web.StreamResponse | None = request.get(_BEGUN)
        if begun is not None:
            # No answer can follow one that has begun: the connection is cut, so that the
            # client cannot take what it got for the whole answer.
            log.warning("%s %s after the answer began: connection cut", request_id, failure.code)
            if request.transport is not None:
                request.transport.close()
            return begun
    response = answer(pipeline.answer_to(failure))
    if failure.close:
        response.force_close()
    return response


def answer(decided: pipeline.Answer) -> web.Response:
    """The HTTP answer to a request admission, or a failure, answers here."""
    return web.Response(
        status=decided.status,
        # A finding's expected value may be an integer of a schema's beyond 64 bits.
        body=body.dumps(decided.body),
        content_type="application/json",
        headers=decided.headers,
    )


async def _name_the_request(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer, relayed or the proxy's own, carries the proxy's request id as
    `x-request-id`; an upstream's own id moves to `x-upstream-request-id` (the proxy's
    answers never set `x-request-id` themselves, so one present here is the upstream's)."""
    headers = response.headers
    for theirs in headers.popall("x-request-id", ()):
        headers.add("x-upstream-request-id", theirs)
    headers["x-request-id"] = request.get(REQUEST_ID) or new_request_id()
    request[_BEGUN] = response
    access = request.get(ACCESS)
    if access is not None:  # the status sent, even if the handler is cut short after
        access.status = response.status


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
        # The id, access line and span first, so that every answer, a refused target's too,
        # carries the id; then the place failures become answers, around everything that
        # may fail.
        middlewares=[observe, answer_failures, check_target, admin.guard],
        handler_args={
            "auto_decompress": False,
            "handler_cancellation": True,
            "keepalive_timeout": config.listen.header_timeout_s,
        },
    )
    app.on_response_prepare.append(_name_the_request)
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
    app.cleanup_ctx.append(_audit_ctx)
    app.cleanup_ctx.append(_emitted_ctx)
    app.cleanup_ctx.append(_ledger_ctx)
    app.cleanup_ctx.append(_watch_workers_ctx)
    app.cleanup_ctx.append(_tracing_ctx)
    app.router.add_get("/-/healthy", healthy)
    app.router.add_get("/-/ready", admin.ready)
    app.router.add_get("/-/metrics", metrics)
    app.router.add_route("*", "/{tail:.*}", proxy)
    return app


def make_admin_app(main: web.Application) -> web.Application:
    """The admin endpoints alone, for their own listener (`admin.listen`): the state of the
    started `main` app, no key asked, and nothing else served (a 404 in the API's shape)."""
    app = web.Application(middlewares=[observe, answer_failures, check_target])
    app.on_response_prepare.append(_name_the_request)
    for key, value in main.items():
        app[key] = value
    app.router.add_get("/-/healthy", healthy)
    app.router.add_get("/-/ready", admin.ready)
    app.router.add_get("/-/metrics", metrics)
    app.router.add_route("*", "/{tail:.*}", admin.not_admin)
    return app


async def _watch_workers_ctx(app: web.Application) -> AsyncIterator[None]:
    watch = asyncio.create_task(app[READINESS].watch())
    yield
    watch.cancel()
    await asyncio.gather(watch, return_exceptions=True)


async def _audit_ctx(app: web.Application) -> AsyncIterator[None]:
    worker = app.get(WORKER)
    app[AUDIT] = open_audit_log(
        app[IN_FORCE].current.config.audit,
        # Several workers on stdout: a chain each, named, and written whole.
        chain=None if worker is None else worker.chain,
        lock_path=None if worker is None else worker.stdout_lock,
    )
    yield
    app[AUDIT].close()


async def _emitted_ctx(app: web.Application) -> AsyncIterator[None]:
    app[EMITTED] = EmittedChecks(app[AUDIT], app[METRICS])
    yield
    await app[EMITTED].close()


async def _ledger_ctx(app: web.Application) -> AsyncIterator[None]:
    ledger = app[LEDGER] = open_ledger(app[IN_FORCE].current.config.ledger, app[METRICS])
    yield
    await ledger.store.close()


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
    books.verdict_cache.set(len(app[IN_FORCE].current.caches))
    try:
        books.ledger_responses.set(await app[LEDGER].store.size())
    except LedgerFault as exc:
        app[LEDGER].fault("size", exc)
    # Rendering reads every worker's files: not on the event loop.
    rendered = await asyncio.to_thread(books.render)
    return web.Response(body=rendered, headers={"Content-Type": CONTENT_TYPE})


async def proxy(request: web.Request) -> web.StreamResponse:
    named = body_headers_named(request.headers)
    if named:
        # Dropped as hop-by-hop, such a header would leave the upstream reading the body
        # differently from the proxy.
        request.app[METRICS].count("any", "invalid", "-")
        raise ProxyError(
            400,
            "invalid_connection_header",
            f"Connection names {named[0]}, which gives the body its meaning and is never dropped",
        )
    unreadable = not_utf8(request.headers)
    if unreadable is not None:
        # It could not go upstream as it came (see not_utf8): refused rather than changed.
        request.app[METRICS].count("any", "invalid", "-")
        raise ProxyError(400, "invalid_header", f"the value of {unreadable} is not UTF-8 text")
    current = request.app[IN_FORCE].current
    current.acquire()
    try:
        return await _proxy(request, current)
    finally:
        await current.release()


def _own(request: web.Request, target: targets.Target) -> ProxyError:
    request.app[METRICS].count("any", "not_found", "-")
    message = f"{request.method} {target.path}: no such admin endpoint; /-/ is never forwarded"
    return ProxyError(404, "not_found", message)


async def _proxy(request: web.Request, current: InForce) -> web.StreamResponse:
    target = request[TARGET]
    routes = current.config.routing
    received = target.path
    try:
        # Under a route's prefix, the rest is the request: read, gated and forwarded as such.
        target = routing.mounted(routes, target)
    except targets.TargetError as exc:
        request.app[METRICS].count("any", "invalid_target", "-")
        raise ProxyError(400, "invalid_request_target", str(exc)) from None
    if target.own:
        raise _own(request, target)
    try:
        tenant = tenant_of(request.headers, current.config)
    except ProxyError:
        request.app[METRICS].count("any", "unauthorized", "-")
        raise
    matched = routing.route_headers(routes, lambda name: request.headers.getall(name, ()))
    gated = target.gated
    access = request[ACCESS]
    access.tenant = tenant
    access.route = "passthrough" if gated is None else targets.GATED[gated]
    bodied = request.method not in _BODYLESS or request.body_exists
    if gated is not None and bodied and not is_websocket(request):
        return await gate(request, current, tenant, gated, target.query, received, matched)
    try:
        routed = routing.select(routes, received, matched, None)
    except ProxyError:
        request.app[METRICS].count("any", "invalid", "-")
        raise
    upstream = current.upstreams[routed.upstream]
    if gated is not None and is_websocket(request):
        return await relay_websocket(
            request, current, upstream, tenant, (gated, target.query, received, matched)
        )
    if is_websocket(request):
        return await relay_websocket_ungated(request, current, upstream, target.forward)
    data = request.content.iter_any() if request.body_exists else None
    headers = upstream_headers(request.headers, current.config, _KEEP_ALL, upstream.settings)
    recording = None
    if request.method == "GET" and targets.reads_response(target.path):
        # A response read again (a background one, done by now) is recorded like a POST's
        # answer: its follow-up pairs with the calls it shows.
        limit = current.config.limits.max_body_bytes
        recording = Recording(
            request.app[LEDGER], tenant or "-", limit, request[REQUEST_ID], None, upstream.name
        )
        _readable_encodings(headers)
    return await relay(
        request, upstream, "passthrough", target.forward, data, headers, recording=recording
    )


def _readable_encodings(headers: CIMultiDict[str]) -> None:
    """Leave in the upstream's `Accept-Encoding` only codings the tap can read."""
    if "Accept-Encoding" in headers:
        headers["Accept-Encoding"] = readable_accept_encoding(
            ", ".join(headers.popall("Accept-Encoding"))
        )


async def relay(
    request: web.Request,
    upstream: Upstream,
    route: str,
    target: str,
    data: bytes | AsyncIterable[bytes] | None,
    headers: CIMultiDict[str],
    extra_headers: Mapping[str, str] | None = None,
    outcome: str = "forward",
    recording: Recording | None = None,
) -> web.StreamResponse:
    app = request.app
    books = app[METRICS]
    streams = books.open_streams
    access = request[ACCESS]
    access.outcome = outcome
    if TRACING in app:
        app[TRACING].inject(headers)
    streams.inc()
    sent = time.perf_counter()
    name = access.upstream = upstream.name

    def answered(status: int, seconds: float) -> None:
        books.upstream_answered(name, route, str(status), seconds)

    try:
        response = await upstream.relay(
            request,
            target,
            request_id=request[REQUEST_ID],
            data=data,
            headers=headers,
            extra_headers=extra_headers,
            recording=recording,
            on_head=answered,
            access=access,
        )
    except UpstreamError as exc:
        status = exc.code.removeprefix("upstream_")
        books.upstream_answered(name, route, status, time.perf_counter() - sent)
        books.count(route, "upstream_error", name)
        what = f"{request.method} {target.partition('?')[0]}"  # no query in the log
        raise upstream_failure(request[REQUEST_ID], what, exc) from None
    finally:
        streams.dec()
    books.count(route, outcome, name)
    return response


async def gate(
    request: web.Request,
    current: InForce,
    tenant: str | None,
    path: str,
    query: str,
    received: str | None = None,
    matched: Mapping[str, str] | None = None,
) -> web.StreamResponse:
    """Read a request body and run it through admission: answer it here, or forward it."""
    app = request.app
    config = current.config
    route = targets.GATED[path]
    headers = request.headers
    content_type = ", ".join(headers.getall("Content-Type", ()))
    try:
        # Refused before the body is read: no need to wait for one that will not be read.
        body.check_content_type(content_type)
        raw = await read_raw(request, config.limits.max_body_bytes, config.limits.body_timeout_s)
    except body.BodyError:
        app[METRICS].count(route, "invalid", "-")
        raise
    except TimeoutError:
        app[METRICS].count(route, "invalid", "-")
        timeout_s = config.limits.body_timeout_s
        message = f"the body did not arrive within {timeout_s:g} s"
        raise ProxyError(408, "body_timeout", message, close=True) from None
    # The gate's time starts once the body is here: the client's upload is not the gate's.
    arrived = time.perf_counter()
    request_id = request[REQUEST_ID]
    access = request[ACCESS]
    access.body_bytes = len(raw)
    admitted = pipeline.Request(
        raw,
        path,
        "http",
        request_id,
        tenant,
        content_type,
        ", ".join(headers.getall("Content-Encoding", ())),
        arrived,
        received,
        matched or {},
    )
    decided = await pipeline.admit(
        admitted,
        config,
        ledger=app[LEDGER],
        audit_log=app[AUDIT],
        metrics=app[METRICS],
        caches=current.caches,
    )
    access.gate_s = time.perf_counter() - arrived
    if decided.findings:
        access.findings.update(finding.action for finding in decided.findings)
    if isinstance(decided, pipeline.Answer):
        access.failed(decided.body["error"]["code"])
        return answer(decided)
    recording = None
    upstream = current.upstreams[decided.upstream]
    sent = upstream_headers(headers, config, decided.drop_headers, upstream.settings)
    if decided.record:
        recording = recording_of(admitted, decided, app[LEDGER], config.limits.max_body_bytes)
        _readable_encodings(sent)
    try:
        return await relay(
            request,
            upstream,
            route,
            path + query,
            decided.data,
            sent,
            decided.add_headers or None,
            decided.outcome,
            recording,
        )
    finally:
        if recording is not None:
            app[EMITTED].relayed(recording.emitted, config.gate, current.caches)


async def read_raw(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The body exactly as it arrived; more than `limit` bytes is 413 without reading on, and
    a body that takes longer than `timeout_s` to arrive is a TimeoutError."""
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    content = request.content
    if content.is_eof():
        # Already whole, as small bodies usually are by the time the handler runs.
        whole = content.read_nowait()
        if len(whole) > limit:
            raise _too_large(limit)
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
                raise _too_large(limit)
    return b"".join(chunks)


def _too_large(limit: int) -> body.BodyError:
    return body.BodyError(413, "body_too_large", f"the body exceeds the limit of {limit} bytes")
