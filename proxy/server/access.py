"""The access log: one line per request at INFO, and the request's id on every log line written
while it is handled and on its answer."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from contextlib import nullcontext

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.admission import targets
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
# The request target as the proxy read it, for every handler.
TARGET = web.RequestKey("target", targets.Target)
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


# How a failure of the handler's becomes an answer (the app's: `app.answer_failure`).
FailureAnswer = Callable[[web.Request, Exception], web.StreamResponse]


async def observe(
    request: web.Request, *, handler: Handler, failed: FailureAnswer
) -> web.StreamResponse:
    """Around every handler, the one frame between aiohttp and it: the request's id (before
    anything is done with it) for its answer and its log lines, its target (a target that is
    not valid origin-form or absolute-form is refused, whatever the path and method), its span
    (with tracing on), its access line once it is done, answered or cut short, and `failed`'s
    answer to anything the handler raises but aiohttp's own answers; meanwhile its task is in
    flight. (A route's handler is `partial(observe, handler=…, failed=…)`, not an aiohttp
    middleware: any middleware adds two coroutines to every request, and a frame that every
    resumption of its task passes through.)"""
    request_id = request[REQUEST_ID] = new_request_id()
    raw_path = request.raw_path
    access = Access(request_id, request.method, raw_path.partition("?")[0])
    request[ACCESS] = access
    token = CURRENT_REQUEST_ID.set(request_id)
    app = request.app
    tracing = app.get(TRACING)
    in_flight = app[IN_FLIGHT]
    task = asyncio.current_task()
    assert task is not None
    in_flight.add(task)
    try:
        with _NO_SPAN if tracing is None else tracing.span(request, access) as span:
            try:
                try:
                    request[TARGET] = targets.read_target(raw_path)
                    response = await handler(request)
                except web.HTTPException:
                    raise  # aiohttp's own answers (none of the proxy's routes raise one)
                except Exception as exc:
                    response = failed(request, exc)
                _answered(request, access, response)
                return response
            except web.HTTPException as exc:
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
