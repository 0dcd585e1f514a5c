"""What each MCP session's server declared: the tools its `tools/list` results named, each with
its `inputSchema` and `outputSchema`, kept per tenant, server and session.

A list is taken page by page: a `tools/list` without a cursor starts it again, a page asked with
a cursor adds to it. `notifications/tools/list_changed` makes it stale: a stale list names no
tool until the session lists its tools again. A tenant's sessions are its own: the key holds
the tenant, so another tenant that names the same session id finds nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.gate.schemas import LRU

# The sessions whose lists are kept, least recently used forgotten first.
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


@dataclass(slots=True)
class _Session:
    tools: dict[str, Listed] = field(default_factory=dict)
    stale: bool = False


def listed_of(tool: Any) -> tuple[str, Listed] | None:
    """A `tools/list` entry as (name, Listed); None for one without a string name."""
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        return None
    return tool["name"], Listed(tool.get("inputSchema"), tool.get("outputSchema"))


class ToolLists:
    """The tool lists of one process's MCP sessions (in memory, bounded)."""

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self._sessions: LRU[SessionKey, _Session] = LRU(max_sessions)

    def page(self, key: SessionKey, tools: Any, *, first: bool) -> None:
        """A page of a `tools/list` result relayed to the session: the first page (asked with
        no cursor) replaces the list, a later one adds to it."""
        session = self._sessions.get(key)
        if session is None or first:
            session = _Session()
            self._sessions.put(key, session)
        session.stale = False
        for tool in tools if isinstance(tools, list) else ():
            found = listed_of(tool)
            if found is not None and (found[0] in session.tools or len(session.tools) < MAX_TOOLS):
                session.tools[found[0]] = found[1]

    def changed(self, key: SessionKey) -> None:
        """The server said its list changed: stale until the session lists its tools again."""
        session = self._sessions.get(key)
        if session is not None:
            session.stale = True

    def forget(self, key: SessionKey) -> None:
        """The session ended."""
        if self._sessions.get(key) is not None:
            self._sessions.put(key, _Session(stale=True))

    def tools(self, key: SessionKey) -> Mapping[str, Listed]:
        """The tools the session's list names now (none when it never listed or is stale)."""
        session = self._sessions.get(key)
        if session is None or session.stale:
            return {}
        return session.tools
