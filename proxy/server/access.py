"""The access log: one line per request at INFO, and the request's id on every log line written
while it is handled."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.admission.ids import new_request_id
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


@dataclass
class Access:
    """What one request did, filled in as it goes; logged once its answer is done. It holds
    no header, query or body value: nothing a client sent beyond its method and path."""

    request_id: str
    method: str
    path: str
    started: float = field(default_factory=time.perf_counter)
    route: str | None = None
    tenant: str | None = None
    upstream: str | None = None
    # forward | strip | rewrite | block | error (`code` says which) | admin | client_gone (it
    # hung up first) | upstream_cut (the upstream failed after the answer began)
    outcome: str | None = None
    code: str | None = None
    status: int | None = None
    bytes: int = 0
    body_bytes: int | None = None
    upstream_s: float | None = None
    gate_s: float | None = None
    # Findings by action (block, strip, rewrite, log); on a WebSocket, over all its frames.
    findings: Counter[str] = field(default_factory=Counter)
    frames: int | None = None

    def failed(self, code: str) -> None:
        """The proxy answered with an error of its own."""
        self.code = code
        self.outcome = "block" if code == "replay_rejected" else "error"

    def fields(self) -> dict[str, Any]:
        """The access line's fields, in the order the text line shows them."""
        elapsed = time.perf_counter() - self.started
        found: dict[str, Any] = {
            "method": self.method,
            "path": self.path,
            "route": self.route,
            "tenant": self.tenant,
            "upstream": self.upstream,
            "outcome": self.outcome,
            "code": self.code,
            "status": self.status,
            "bytes": self.bytes,
            "body_bytes": self.body_bytes,
            "findings": sum(self.findings.values()),
            **{f"findings_{action}": n for action, n in sorted(self.findings.items())},
            "frames": self.frames,
            "upstream_ms": _ms(self.upstream_s),
            "gate_ms": _ms(self.gate_s),
            "duration_ms": _ms(elapsed),
        }
        return {name: value for name, value in found.items() if value is not None}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


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
                    access.outcome = "client_gone"
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
        access.outcome = access.outcome or "admin"
    if not response.prepared and isinstance(response, web.Response):
        # The proxy's own answer, sent once the handler returns: its body is whole already.
        access.bytes = response.content_length or 0
