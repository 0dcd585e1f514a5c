"""The HTTP front's relay: a request the exchange let go, sent upstream, and its answer streamed
back to the client chunk by chunk through the exchange (which records it and adds its headers)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterable

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from proxy.admission.access import Access
from proxy.admission.exchange import Exchange
from proxy.gate.reasons import Outcome
from proxy.server.access import name_answer
from proxy.server.headers import relayed_headers
from proxy.server.tracing import Tracing
from proxy.server.upstream import (
    Upstream,
    UpstreamError,
    cut_of,
    delimited_by_close,
    upstream_failure,
)

log = logging.getLogger("replay_proxy")


async def forward(
    request: web.Request,
    exchange: Exchange,
    upstream: Upstream,
    target: str,
    data: bytes | AsyncIterable[bytes] | None,
    headers: CIMultiDict[str],
    access: Access,
    tracing: Tracing | None = None,
) -> web.StreamResponse:
    """Send the request upstream under `target` and stream its answer back; once the answer
    has started, an upstream failure cuts the client's connection so that it cannot mistake a
    partial answer for a whole one. A ProxyError (502, 504) when no answer could be had."""
    metrics = exchange.services.metrics
    access.outcome = exchange.outcome
    access.upstream = upstream.name
    if tracing is not None:
        tracing.inject(headers)
    metrics.stream_opened()
    sent = time.perf_counter()
    try:
        try:
            answer = await upstream.send(
                request.method,
                target,
                data=data,
                headers=headers,
                content_length=request.content_length,
            )
        except UpstreamError as exc:
            status = exc.code.removeprefix("upstream_")
            metrics.upstream_answered(
                upstream.name, exchange.route, status, time.perf_counter() - sent
            )
            exchange.upstream_failed()
            raise upstream_failure(exchange.request_id, _what(request, target), exc) from None
        # Until the answer's head: one figure for the access line and the metrics.
        waited = access.upstream_s = time.perf_counter() - sent
        metrics.upstream_answered(upstream.name, exchange.route, str(answer.status), waited)
        try:
            response = await _stream(request, exchange, answer, target, access)
        finally:
            answer.release()
            exchange.close()
    finally:
        metrics.stream_closed()
    exchange.counted()
    return response


def _what(request: web.Request, target: str) -> str:
    """The request for the log: the path without its query, which may carry a value that is
    not the log's to keep (a key, an argument)."""
    return f"{request.method} {target.partition('?')[0]}"


async def _stream(
    request: web.Request,
    exchange: Exchange,
    answer: aiohttp.ClientResponse,
    target: str,
    access: Access,
) -> web.StreamResponse:
    """Relay an upstream answer whose head has arrived, chunk by chunk, to the client."""
    request_id = exchange.request_id
    headers = answer.headers
    response = web.StreamResponse(
        status=answer.status, reason=answer.reason, headers=relayed_headers(headers)
    )
    content = answer.content
    if content.total_bytes or content.is_eof():
        # The head goes out with the first chunk, in one write; aiohttp's own Response does
        # this, StreamResponse sends the head on its own unless told not to.
        response._send_headers_immediately = False
    added = exchange.answer_head(
        answer.status,
        headers.get("Content-Type", ""),
        ", ".join(headers.getall("Content-Encoding", ())),
        answer.content_length,
    )
    if added:
        response.headers.update(added)
    # An answer the end of its connection delimits (RFC 9112 §6.3) is whole only if a FIN
    # ended it: aiohttp ends its body the same way on a reset, and keeps the reset on the
    # connection's protocol (never reused after such an answer), held on to here.
    protocol = None
    if delimited_by_close(request.method, answer) and answer.connection is not None:
        protocol = answer.connection.protocol
    try:
        await exchange.begin()
        name_answer(request, response, access)
        await response.prepare(request)
        feed = exchange.feeder()
        async for chunk in content.iter_any():
            if feed is not None and (waiting := feed(chunk)) is not None:
                await waiting
            await response.write(chunk)
            access.bytes += len(chunk)
        cut = cut_of(protocol)
        if cut is not None:
            raise cut
        await exchange.end()
    except ConnectionResetError:
        # The client hung up (aiohttp's ClientConnectionResetError is one): the upstream
        # connection is closed, not reused.
        log.info("%s client went away mid-answer: %s", request_id, _what(request, target))
        access.outcome = Outcome.CLIENT_GONE
        answer.close()
        return response
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        what = _what(request, target)
        log.warning("%s upstream failed mid-answer: %s: %r", request_id, what, exc)
        access.outcome = Outcome.UPSTREAM_CUT
        answer.close()
        if request.transport is not None:
            request.transport.close()
        return response
    await response.write_eof()
    return response
