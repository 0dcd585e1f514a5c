"""The access log: one line per request at INFO, and the request's id on every log line written
while it is handled."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from contextlib import nullcontext

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.admission.access import Access
from proxy.admission.ids import new_request_id
from proxy.gate.reasons import Outcome
from proxy.server.keys import REQUEST_ID
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
    answered or cut short."""
    request_id = request[REQUEST_ID] = new_request_id()
    access = Access(request_id, request.method, request.raw_path.partition("?")[0])
    request[ACCESS] = access
    token = CURRENT_REQUEST_ID.set(request_id)
    tracing = request.app.get(TRACING)
    try:
        with _NO_SPAN if tracing is None else tracing.span(request, access) as span:
            try:
                response = await handler(request)
                _answered(access, response)
                return response
            except web.HTTPException as exc:  # aiohttp's own answers
                _answered(access, exc)
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
        log_access(access)
        CURRENT_REQUEST_ID.reset(token)


def _answered(access: Access, response: web.StreamResponse) -> None:
    access.status = response.status
    if access.route is None and access.path.startswith("/-/"):
        access.route = "admin"
        access.outcome = access.outcome or Outcome.ADMIN
    if not response.prepared and isinstance(response, web.Response):
        # The proxy's own answer, sent once the handler returns: its body is whole already.
        access.bytes = response.content_length or 0
