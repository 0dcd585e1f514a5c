"""The MCP tap: watches an MCP server's answers go by (JSON or SSE) for what the session's
tool list must know, and door 2 on the tool results it saw.

A `tools/list` result is recorded for the session (page by page); a
`notifications/tools/list_changed` makes its list stale; a `tools/call` result is kept, and once
the answer has been relayed its `structuredContent` is checked against the tool's
`outputSchema`: a failure is counted (`replay_proxy_emitted_calls_total{verdict="result_schema"}`)
and audited (`event: emitted_result_rejected`). Nothing is changed: the answer went as it came.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.admission import body
from proxy.admission.emitted import EmittedChecks
from proxy.admission.mcp import LIST_CHANGED, TOOLS_LIST, Asked
from proxy.admission.tap import event_data, take_events
from proxy.config import Route
from proxy.gate.arguments import check_arguments
from proxy.gate.budget import Allowance
from proxy.gate.caches import GateCaches
from proxy.gate.errors import ProxyError
from proxy.gate.findings import Finding
from proxy.gate.reasons import Reason
from proxy.gate.verdict import Bounds
from proxy.state.audit import AuditLog, Relayed, emitted_record
from proxy.state.tool_lists import Listed, SessionKey, ToolLists

log = logging.getLogger("replay_proxy")

RESULT_REJECTED = "emitted_result_rejected"
RESULT_SCHEMA = "result_schema"
# Where a result's finding is: what it checks.
_STRUCTURED = "result.structuredContent"


@dataclass
class McpSession:
    """What an exchange knows of the MCP session a request belongs to: its server, its
    `Mcp-Session-Id`, where its tool list is kept, the route of its server, and (once its body
    was admitted) the requests whose answers the tap watches and the body as received."""

    server: str
    session: str | None
    key: SessionKey
    route: Route
    ends: bool = False  # a DELETE: the session's end, its list forgotten once the server agrees
    asked: Mapping[Any, Asked] = field(default_factory=dict)
    raw: bytes | None = None
    # The called tools as the session's list named them when the body was judged (None: not
    # read, the ledger failing open).
    listed: Mapping[str, Listed] | None = None

    @property
    def path(self) -> str:
        return f"/mcp/{self.server}"


class McpTap:
    """Reads one answer of an MCP server as it goes by, never past `limit` bytes."""

    def __init__(
        self,
        lists: ToolLists,
        session: McpSession,
        content_type: str,
        content_encoding: str,
        limit: int,
        request_id: str,
        content_length: int | None = None,
    ) -> None:
        self.lists = lists
        self.session = session
        self.limit = limit
        # A JSON answer is read at its last byte, before that chunk goes on: a request sent the
        # moment the client has it (to another worker too) finds the list it recorded.
        self.expected = content_length
        self.sse = content_type.split(";")[0].strip().lower() == "text/event-stream"
        self.pending = bytearray()
        self.results: list[tuple[str, Any]] = []  # (tool, result) of each tools/call answered
        # An answer in a content coding goes by unread (servers of MCP send none unasked).
        self.done = bool(content_encoding.strip()) and content_encoding.strip() != "identity"
        if self.done:
            log.warning("%s an encoded MCP answer goes by unread", request_id)

    async def feed(self, chunk: bytes) -> None:
        if self.done:
            return
        self.pending += chunk
        if self.sse:
            await self._events()
        if len(self.pending) > self.limit:
            self.done = True  # too large to keep a copy of: it goes by unread
            self.pending.clear()
        elif self.expected is not None and len(self.pending) >= self.expected:
            await self.finish()

    async def begin(self) -> None:
        """The answer's head is about to go to the client: a DELETE's success (the server
        ended the session) forgets the session's list first."""
        if self.session.ends:
            await self.lists.forget(self.session.key)

    async def finish(self) -> None:
        """The answer ended whole: a JSON one is read now."""
        if self.done or self.sse:
            return
        self.done = True
        await self._read(bytes(self.pending))
        self.pending.clear()

    async def _events(self) -> None:
        for block in take_events(self.pending):
            data = event_data(block)
            if data:
                await self._read(data)

    async def _read(self, data: bytes) -> None:
        try:
            found = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        for message in found if isinstance(found, list) else [found]:
            if isinstance(message, dict):
                await self._message(message)

    async def _message(self, message: Mapping[str, Any]) -> None:
        key = self.session.key
        if message.get("method") == LIST_CHANGED:
            await self.lists.changed(key)
            return
        result = message.get("result")
        ident = message.get("id")
        if not isinstance(result, dict) or not isinstance(ident, str | int):
            return
        asked = self.session.asked.get(ident)
        if asked is None:
            return
        if asked.method == TOOLS_LIST:
            await self.lists.page(key, result.get("tools"), first=asked.first)
        elif asked.name is not None:
            self.results.append((asked.name, result))


def check_results(
    tap: McpTap,
    policy_caches: GateCaches,
    bounds: Bounds,
    relayed: Relayed,
    audit_log: AuditLog,
    emitted: EmittedChecks,
) -> None:
    """Door 2 for MCP: each tool result the tap saw, its `structuredContent` against the
    `outputSchema` the session's list gives its tool (a pin holds no output schema). A tool
    error (`isError`) is the tool's own answer, not checked. The list is the one the call was
    judged against (read when its body was admitted)."""
    session = tap.session
    listed = session.listed or {}
    policy = session.route.gate
    # The results of one answer share one validation time, as the calls of one request do:
    # the server's schema and its result are no more trusted than a client's.
    allowance = Allowance(policy.validation_timeout_s)
    for name, result in tap.results:
        tool = listed.get(name)
        if tool is None or tool.output_schema is None or result.get("isError") is True:
            continue
        try:
            schema = policy_caches.schemas.compile(tool.output_schema, policy.schema_limits)
        except Exception:  # an outputSchema that is no schema: nothing to hold the result to
            log.warning("%s the outputSchema of %s is unusable", relayed.request_id, name)
            continue
        content = result.get("structuredContent")
        try:
            text = body.dumps(content).decode()
        except ProxyError:
            continue
        failed = check_arguments(text, [schema], allowance, bounds.max_violations)
        verdict = "ok" if failed is None else RESULT_SCHEMA
        if failed is not None:
            finding = Finding(
                0,
                Reason.ARGUMENTS_SCHEMA,
                "log",
                name=name,
                fail=failed.fail,
                passed=failed.passed,
                fail_omitted=failed.fail_omitted,
                param=_STRUCTURED,
            )
            entry = emitted_record(
                relayed,
                {},
                [finding],
                include_arguments=audit_log.include_arguments,
                max_findings=bounds.max_findings,
            )
            entry["event"] = RESULT_REJECTED
            entry["server"], entry["session"] = session.server, session.session
            audit_log.append(entry)
        emitted.count(name, verdict, relayed.dialect, known=True)
