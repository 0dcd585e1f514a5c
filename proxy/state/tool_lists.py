"""What each MCP session's server declared: the tools its `tools/list` results named, each with
its `inputSchema` and `outputSchema`, kept per tenant, server and session in the ledger's store
(this process's memory, or Redis, which every worker and machine shares).

A list is taken page by page: a `tools/list` without a cursor starts it again, a page asked with
a cursor adds to it. `notifications/tools/list_changed` makes it stale: a stale list names no
tool until the session lists its tools again. A tenant's sessions are its own: the key holds
the tenant, so another tenant that names the same session id finds nothing. A list is kept as
long as the ledger keeps a response (`ledger.ttl_s`), counted from when it was last used.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from proxy.gate.schemas import LRU
from proxy.state.ledger import LedgerFault

if TYPE_CHECKING:
    from proxy.state.ledger import Ledger

# The sessions whose lists one process keeps in memory, least recently used forgotten first.
MAX_SESSIONS = 10_000
# The most tools one session's list keeps (a server's pages past it are not recorded).
MAX_TOOLS = 4096

# (tenant, server, session id or "" for a server that gives none)
SessionKey = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class Listed:
    """One tool as its server listed it: its `inputSchema`, and its `outputSchema` (None when
    it declares none)."""

    input_schema: Any
    output_schema: Any = None

    def encoded(self) -> str:
        """As a store keeps it."""
        return json.dumps([self.input_schema, self.output_schema])

    @classmethod
    def decoded(cls, value: bytes | str) -> Listed | None:
        """Read back from a store; None for a value that is not one."""
        try:
            found = json.loads(value)
        except (ValueError, RecursionError):
            return None
        if not isinstance(found, list) or len(found) != 2:
            return None
        return cls(found[0], found[1])


def listed_of(tool: Any) -> tuple[str, Listed] | None:
    """A `tools/list` entry as (name, Listed); None for one without a string name."""
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        return None
    return tool["name"], Listed(tool.get("inputSchema"), tool.get("outputSchema"))


def page_of(tools: Any) -> list[tuple[str, Listed]]:
    """The tools of a `tools/list` result's page, in order (entries without a name skipped)."""
    return (
        [found for tool in tools if (found := listed_of(tool))] if isinstance(tools, list) else []
    )


class ListStore(Protocol):
    """Where the lists are kept. Every method may raise LedgerFault."""

    async def listed(self, key: SessionKey, names: Collection[str]) -> dict[str, Listed]:
        """Those of `names` the session's list names now (none when it never listed, or its
        list is stale); the list is kept for another TTL."""
        ...

    async def page(self, key: SessionKey, tools: Sequence[tuple[str, Listed]], first: bool) -> None:
        """A page of a `tools/list` result: the first (asked with no cursor) replaces the list,
        a later one adds to it; either makes it fresh."""
        ...

    async def changed(self, key: SessionKey) -> None:
        """The server said its list changed: stale until the session lists its tools again."""
        ...

    async def forget(self, key: SessionKey) -> None:
        """The session ended: its list is gone."""
        ...


@dataclass(slots=True)
class _Session:
    expires: float
    tools: dict[str, Listed] = field(default_factory=dict)
    stale: bool = False


class MemoryLists:
    """One process's lists, in memory: at most `max_sessions`, each for `ttl_s` after its use."""

    def __init__(self, *, ttl_s: float, max_sessions: int = MAX_SESSIONS) -> None:
        self.ttl_s = ttl_s
        self._sessions: LRU[SessionKey, _Session] = LRU(max_sessions)

    def _get(self, key: SessionKey) -> _Session | None:
        session = self._sessions.get(key)
        now = time.monotonic()
        if session is None or session.expires <= now:
            return None
        session.expires = now + self.ttl_s
        return session

    async def listed(self, key: SessionKey, names: Collection[str]) -> dict[str, Listed]:
        session = self._get(key)
        if session is None or session.stale:
            return {}
        return {n: tool for n in names if (tool := session.tools.get(n)) is not None}

    async def page(self, key: SessionKey, tools: Sequence[tuple[str, Listed]], first: bool) -> None:
        session = self._get(key)
        if session is None or first:
            session = _Session(time.monotonic() + self.ttl_s)
            self._sessions.put(key, session)
        session.stale = False
        for name, tool in tools:
            if name in session.tools or len(session.tools) < MAX_TOOLS:
                session.tools[name] = tool

    async def changed(self, key: SessionKey) -> None:
        session = self._get(key)
        if session is not None:
            session.stale = True

    async def forget(self, key: SessionKey) -> None:
        if self._get(key) is not None:
            # Made stale and empty: the LRU forgets it in its turn.
            self._sessions.put(key, _Session(0.0, stale=True))


class ToolLists:
    """The lists of the MCP sessions, in the ledger's store, its faults the ledger's: a list
    that cannot be read is the proxy's fault (LedgerFault, or None when the ledger fails open:
    the calls go unjudged); one that cannot be written is logged and counted, and the relay
    goes on."""

    def __init__(self, store: ListStore, ledger: Ledger) -> None:
        self.store = store
        self.ledger = ledger

    async def tools(self, key: SessionKey, names: Collection[str]) -> Mapping[str, Listed] | None:
        """Those of `names` the session's list names now; None when it cannot be read and the
        ledger fails open. Raises LedgerFault (logged and counted) when it fails closed."""
        try:
            return await self.store.listed(key, names)
        except LedgerFault as exc:
            self.ledger.fault("read", exc)
            if self.ledger.fail_open:
                return None
            raise

    async def page(self, key: SessionKey, tools: Any, *, first: bool) -> None:
        await self._write(self.store.page(key, page_of(tools), first))

    async def changed(self, key: SessionKey) -> None:
        await self._write(self.store.changed(key))

    async def forget(self, key: SessionKey) -> None:
        await self._write(self.store.forget(key))

    async def _write(self, operation: Any) -> None:
        try:
            await operation
        except LedgerFault as exc:
            self.ledger.fault("tool_list", exc)
