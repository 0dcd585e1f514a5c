"""The seam for dialects: what is specific to one API's body, behind one small interface.

Admission reads and edits a gated body through the `Dialect` of its path: which paths it gates,
where the body's items live, how an item is classified, how the gate's strip and rewrite edit
the body, and how a recorded conversation is inlined into it. The gate judges items in the
Open Responses vocabulary (`function_call`, `function_call_output`, `item_reference`); a dialect
of another API (Chat Completions, MCP) shows its body's items in it, and adds no front.

This module imports nothing of the transport or of the schema machinery: the request targets
read the gated paths from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from proxy.admission import body
from proxy.admission.chat import ChatCompletions
from proxy.gate import items
from proxy.gate.call_limits import CallLimits
from proxy.gate.errors import ProxyError

if TYPE_CHECKING:
    from proxy.gate.pairing import Recorded
    from proxy.gate.verdict import Verdict


class View(Protocol):
    """A body as the gate reads it, in the Open Responses vocabulary, and the way back."""

    @property
    def body(self) -> Mapping[str, Any]:
        """What the gate and the ledger read: `input` items, `tools`, `previous_response_id`."""
        ...

    def settle(self, recorded: Recorded | None) -> None:
        """What the ledger holds for `body` (None: it names nothing there) is known, before
        the gate reads it: what a dialect's items leave to the ledger is settled in it."""
        ...

    def located(self, verdict: Verdict) -> Verdict:
        """The gate's verdict on `body` in the dialect's terms: its findings placed in the
        body, and `input` the dialect's items as they go upstream (what `sent` puts back)."""
        ...


class Dialect(Protocol):
    """One API's body, as admission reads and edits it."""

    @property
    def label(self) -> str:
        """Its name in the metrics' `dialect` label."""
        ...

    @property
    def paths(self) -> Mapping[str, str]:
        """The canonical paths it gates, each with its metrics' `route` label."""
        ...

    @property
    def records(self) -> bool:
        """Whether its answers are responses the ledger records (and door 2 checks)."""
        ...

    def parse(self, decoded: bytes) -> dict[str, Any]:
        """The body read (strict JSON); BodyError when it is not one of this API's bodies."""

    @property
    def websocket(self) -> bool:
        """Whether the API has a WebSocket mode on its paths (one request a frame)."""
        ...

    @property
    def continues(self) -> bool:
        """Whether a body may continue a recorded response (`previous_response_id`): then
        its input is recorded whole with `ledger.whole_items`, to be inlined for another
        upstream."""
        ...

    def view(self, parsed: Mapping[str, Any]) -> View:
        """The body as the gate reads it."""
        ...

    async def load(self, parsed: Mapping[str, Any]) -> None:
        """Read, before the body is shown to the gate, what the store holds that it is judged
        against beyond the ledger's view (MCP: the tools its session listed). Raises
        LedgerFault."""

    def answer(self, parsed: Mapping[str, Any], verdict: Verdict) -> dict[str, Any] | None:
        """The answer the proxy gives in the API's own terms instead of forwarding (an MCP
        call refused: a tool error, a JSON-RPC error), or None: the verdict goes the usual way
        (forwarded, or blocked with a 400)."""

    def unavailable(self, error: ProxyError) -> dict[str, Any]:
        """The body of the answer to a request the proxy could not judge for a fault of its
        own (`error`, a 503): the API's error shape."""
        ...

    def call_limits(self, vendor: str | None) -> CallLimits | None:
        """What this API of `vendor` refuses in a replayed call beyond the spec's item
        schema (`not_portable`); None: nothing more."""
        ...

    def compacts(self, path: str) -> bool:
        """Whether a request to this gated path compacts a conversation (its answer stands for
        the calls it compacted)."""
        ...

    def input_items(self, parsed: Mapping[str, Any]) -> Sequence[Any]:
        """The items the body sends, in order (not a copy: do not edit it)."""
        ...

    def kind(self, item: Any) -> str | None:
        """What an item is (a function_call, its output, a reference, ...), or None."""
        ...

    def sent(self, parsed: dict[str, Any], verdict: Verdict) -> dict[str, Any]:
        """The body as it goes upstream once the gate stripped or rewrote its items."""
        ...

    def inlined(self, parsed: Mapping[str, Any], history: Sequence[Any]) -> dict[str, Any]:
        """The body continuing a recorded conversation with that conversation's items
        (`history`) before its own, the reference to it gone."""
        ...


class OpenResponses:
    """The Open Responses API: `input` holds the items, a string one user message;
    `previous_response_id` continues a recorded response."""

    paths: Mapping[str, str] = {
        "/v1/responses": "responses",
        "/v1/responses/compact": "responses_compact",
        "/responses": "responses",
        "/responses/compact": "responses_compact",
    }
    label = "responses"
    records = True
    parse = staticmethod(body.parse)
    continues = True
    websocket = True

    def view(self, parsed: Mapping[str, Any]) -> View:
        # The gate's own vocabulary: read as it is, and its verdict already in the body's terms.
        return _Whole(parsed)

    async def load(self, parsed: Mapping[str, Any]) -> None:
        return None

    def answer(self, parsed: Mapping[str, Any], verdict: Verdict) -> dict[str, Any] | None:
        return None

    unavailable = staticmethod(ProxyError.document)

    def call_limits(self, vendor: str | None) -> CallLimits | None:
        return None  # the spec's item schema is the Responses API's

    def compacts(self, path: str) -> bool:
        return self.paths.get(path) == "responses_compact"

    def input_items(self, parsed: Mapping[str, Any]) -> Sequence[Any]:
        given = parsed.get("input")
        if isinstance(given, list):
            return given
        if isinstance(given, str):
            return ({"type": "message", "role": "user", "content": given},)
        return ()

    # The gate's own vocabulary: called as it is, with no step between.
    kind = staticmethod(items.kind)

    def sent(self, parsed: dict[str, Any], verdict: Verdict) -> dict[str, Any]:
        """The gate's input in the body, the members it strips gone."""
        sent = parsed if verdict.input is None else {**parsed, "input": verdict.input}
        if verdict.without:
            sent = {k: v for k, v in sent.items() if k not in verdict.without}
        return sent

    def inlined(self, parsed: Mapping[str, Any], history: Sequence[Any]) -> dict[str, Any]:
        inlined = {k: v for k, v in parsed.items() if k != "previous_response_id"}
        inlined["input"] = [*history, *self.input_items(parsed)]
        return inlined


class _Whole:
    """A body the gate reads as it is."""

    __slots__ = ("body",)

    def __init__(self, body: Mapping[str, Any]) -> None:
        self.body = body

    def settle(self, recorded: Recorded | None) -> None:
        return None

    def located(self, verdict: Verdict) -> Verdict:
        return verdict


# The metrics' `dialect` of a request no dialect reads (passed through, or refused before).
NO_DIALECT = "-"
OPEN_RESPONSES: Dialect = OpenResponses()
CHAT_COMPLETIONS: Dialect = ChatCompletions()
# Every dialect the proxy speaks; a gated path belongs to exactly one.
DIALECTS: tuple[Dialect, ...] = (OPEN_RESPONSES, CHAT_COMPLETIONS)
# The metrics' route of every gated path, and the dialect that reads its bodies.
GATED: Mapping[str, str] = {path: route for d in DIALECTS for path, route in d.paths.items()}
_BY_PATH: Mapping[str, Dialect] = {path: d for d in DIALECTS for path in d.paths}


def dialect_of(path: str) -> Dialect:
    """The dialect of a canonical gated path; KeyError if no dialect gates it."""
    return _BY_PATH[path]


def whole_input(dialect: Dialect, parsed: Mapping[str, Any], verdict: Verdict) -> list[Any]:
    """The input items as they go upstream, whole: the gate's when it changed them."""
    return list(verdict.input) if verdict.input is not None else list(dialect.input_items(parsed))


def label_of(path: Any) -> str | None:
    """The `label` of the dialect a canonical gated path (an audit record's `path`) is spoken
    in: `responses` or `chat`; None for any other path (an MCP server's too: its dialect is
    made per server, and this module stays free of it)."""
    found = _BY_PATH.get(path) if isinstance(path, str) else None
    return None if found is None else found.label
