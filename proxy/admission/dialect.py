"""The seam for dialects: what is specific to one API's body, behind one small interface.

Admission, the tap and door 2 read a body through a `Dialect`: which paths it gates, where its
items live, how an item is classified, and how the gate's strip and rewrite edit the body. The
Open Responses dialect is the first (and for now the only) one; another API (Chat Completions,
MCP) adds a dialect, not a front.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from proxy.admission import targets
from proxy.gate import items
from proxy.gate.verdict import Verdict


class Dialect(Protocol):
    """One API's body, as admission reads and edits it."""

    def gated(self, path: str) -> str | None:
        """The metrics' route of a canonical gated path of this dialect; None: not gated."""
        ...

    def input_items(self, parsed: Mapping[str, Any]) -> list[Any]:
        """The items the body sends, in order."""
        ...

    def kind(self, item: Any) -> str | None:
        """What an item is (a function_call, its output, a reference, ...)."""
        ...

    def sent(self, parsed: dict[str, Any], verdict: Verdict) -> dict[str, Any]:
        """The body as it goes upstream once the gate stripped or rewrote it."""
        ...

    def whole_input(self, parsed: Mapping[str, Any], verdict: Verdict) -> list[Any]:
        """The input items as they go upstream, whole: the gate's when it changed them."""
        ...


class OpenResponses:
    """The Open Responses API: `input` holds the items, a string one user message."""

    def gated(self, path: str) -> str | None:
        return targets.GATED.get(path)

    def input_items(self, parsed: Mapping[str, Any]) -> list[Any]:
        given = parsed.get("input")
        if isinstance(given, str):
            return [{"type": "message", "role": "user", "content": given}]
        return list(given) if isinstance(given, list) else []

    def kind(self, item: Any) -> str | None:
        return items.kind(item)

    def sent(self, parsed: dict[str, Any], verdict: Verdict) -> dict[str, Any]:
        """The gate's input in the body, the members it strips gone."""
        sent = parsed if verdict.input is None else {**parsed, "input": verdict.input}
        if verdict.without:
            sent = {k: v for k, v in sent.items() if k not in verdict.without}
        return sent

    def whole_input(self, parsed: Mapping[str, Any], verdict: Verdict) -> list[Any]:
        return list(verdict.input) if verdict.input is not None else self.input_items(parsed)


OPEN_RESPONSES: Dialect = OpenResponses()
