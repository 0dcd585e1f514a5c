"""The access log: one line per request at INFO, and the request's id on every log line written
while it is handled and on its answer."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from contextlib import nullcontext

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.admission.access import Access
from proxy.admission.exchange import REQUEST_ID_HEADER, request_ids
from proxy.admission.ids import new_request_id
from proxy.gate.reasons import Outcome
from proxy.server.keys import IN_FLIGHT, REQUEST_ID
from proxy.server.tracing import TRACING

access_log = logging.getLogger("replay_proxy.access")

# The id of the request being handled in this task (and the tasks it starts), for the log
# records written meanwhile, whoever writes them.
CURRENT_REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "replay_proxy_request_id", default=None
)


class RequestIdFilter(logging.Filter):
    """Stamps every record with `request_id`: the id of the request it was written for, or
    None outside of one. A handler's filter: it sees the records of every logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = CURRENT_REQUEST_ID.get()
        return True


ACCESS = web.RequestKey("access", Access)
# The answer a request has begun to send (named, its head on its way).
BEGUN = web.RequestKey("answer_begun", web.StreamResponse)
# The span of a request with tracing off.
_NO_SPAN = nullcontext(None)


def log_access(access: Access) -> None:
    """The request's access line: the message `access`, its fields in `record.access` (the
    formatter writes them as `key=value` words or as JSON keys). Its fields are not gathered
    when the logger would drop the line."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    access_log.info("access", extra={"access": access.fields(), "request_id": access.request_id})


@web.middleware
async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Around everything: the request's id (before anything is done with it) for its answer
    and its log lines, its span (with tracing on), and its access line once it is done,
    answered or cut short; meanwhile its task is in flight."""
    request_id = request[REQUEST_ID] = new_request_id()
    access = Access(request_id, request.method, request.raw_path.partition("?")[0])
    request[ACCESS] = access
    token = CURRENT_REQUEST_ID.set(request_id)
    app = request.app
    tracing = app.get(TRACING)
    # Kept here rather than by a middleware of its own: one coroutine less on every request.
    in_flight = app[IN_FLIGHT]
    task = asyncio.current_task()
    assert task is not None
    in_flight.add(task)
    try:
        with _NO_SPAN if tracing is None else tracing.span(request, access) as span:
            try:
                response = await handler(request)
                _answered(request, access, response)
                return response
            except web.HTTPException as exc:  # aiohttp's own answers
                _answered(request, access, exc)
                raise
            except asyncio.CancelledError:
                # The client hung up before its answer was whole (a WebSocket's end, once
                # upgraded, is its close, however it comes).
                if access.status != 101:
                    access.outcome = Outcome.CLIENT_GONE
                raise
            finally:
                if span is not None and tracing is not None:
                    tracing.describe(span, access)
    finally:
        in_flight.discard(task)
        log_access(access)
        CURRENT_REQUEST_ID.reset(token)


def name_answer(request: web.Request, response: web.StreamResponse, access: Access) -> None:
    """Every answer, relayed or the proxy's own, carries the proxy's request id as
    `x-request-id`; an upstream's own id moves to `x-upstream-request-id` (the proxy's
    answers never set `x-request-id` themselves, so one present here is the upstream's).

    Called as its head is about to go: by the handler that prepares the answer itself, and by
    `observe` for one aiohttp sends once the handler is done. (Not aiohttp's
    `on_response_prepare` signal, which costs a dispatch and two coroutines on every answer.)"""
    headers = response.headers
    headers.extend(request_ids(access.request_id, headers.popall(REQUEST_ID_HEADER, ())))
    request[BEGUN] = response
    access.status = response.status  # the status sent, even if the handler is cut short after


def _answered(request: web.Request, access: Access, response: web.StreamResponse) -> None:
    if response.prepared:  # named by the handler that prepared it
        access.status = response.status
    else:
        name_answer(request, response, access)
        if isinstance(response, web.Response):
            # The proxy's own answer, sent once the handler returns: its body is whole already.
            access.bytes = response.content_length or 0
    if access.route is None and access.path.startswith("/-/"):
        access.route = "admin"
        access.outcome = access.outcome or Outcome.ADMIN
