"""The Chat Completions dialect: a body's `messages` shown to the gate as Open Responses items,
and the gate's findings and edits taken back to messages.

Each `tool_calls` entry of an assistant message is a `function_call` (its `id` the `call_id`),
each `role: "tool"` message a `function_call_output` of its `tool_call_id`; the legacy form (an
assistant's `function_call`, answered by the next `role: "function"` message of its name) pairs
the same way, under a call id of its place. `tools[].function` and the legacy `functions` are
the function tools. Other messages are not shown: the gate has nothing to say of them. A finding
comes back with `index` the message's and `param` its place (`messages[4]`,
`messages[3].tool_calls[1]`); a strip or a rewrite comes back as the messages that go upstream.

It imports only the gate's vocabulary: the request targets read its paths.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

from proxy.admission import body
from proxy.gate import items
from proxy.gate.call_limits import CHAT_LIMITS, CallLimits
from proxy.gate.errors import ProxyError
from proxy.gate.vocabulary import CORE

if TYPE_CHECKING:
    from proxy.gate.findings import Finding
    from proxy.gate.pairing import Recorded
    from proxy.gate.verdict import Verdict

MESSAGES = "messages"
# What a Chat tool call's `status` is when the proxy never relayed it: the message says nothing
# of it, and the completion that made it ended. One the proxy relayed is shown without one,
# and judged by the status it was relayed with (cut: `incomplete`).
_COMPLETED = "completed"
# Shown for a tool_calls entry with no string type: not a function call, and typed so that no
# reading of the spec's defaults takes it for one.
_UNTYPED_CALL = "tool_call"
# The members by which a typeless item reads as another kind than a message (`items.readings`).
_OTHER_READINGS = frozenset({"id", "call_id", "summary", "encrypted_content"})


class Place(NamedTuple):
    """Where a shown item lives: its message, the `tool_calls` entry (`call`), or the legacy
    `function_call` of an assistant message (`legacy`). A tuple, its `param` said only when a
    finding names it: a body's every call has a place, few a finding."""

    message: int
    call: int | None = None
    legacy: bool = False

    @property
    def param(self) -> str:
        """The place as an error's `param`: `messages[3].tool_calls[1]`."""
        where = f"{MESSAGES}[{self.message}]"
        if self.legacy:
            return f"{where}.function_call"
        return where if self.call is None else f"{where}.tool_calls[{self.call}]"


class ChatView:
    """One body's messages as the gate reads them (`body`), and the way back (`located`)."""

    __slots__ = ("_by_message", "_shown", "_unsettled", "body", "messages", "places")

    def __init__(self, parsed: Mapping[str, Any]) -> None:
        given = parsed.get(MESSAGES)
        self.messages: Sequence[Any] = given if isinstance(given, list) else ()
        shown: list[dict[str, Any]] = []
        places: list[Place] = []
        by_message: dict[int, list[int]] = {}
        # The calls shown without a status: those the ledger's answer settles.
        unsettled: list[dict[str, Any]] = []
        legacy: dict[Any, str] = {}  # a legacy call's function name → its call id

        for m, message in enumerate(self.messages):
            if not isinstance(message, dict):
                continue
            role = message.get("role")
            if message.get("type") is not None and _is_item(message):
                # Another dialect's item where a message belongs: the gate's envelope.
                stand_in: dict[str, Any] = {"type": items.MESSAGE, "role": "tool"}
                stand_in["tool_call_id"] = message.get("call_id")
                by_message[m] = [len(shown)]
                shown.append(stand_in)
                places.append(Place(m))
            elif role == "tool":
                by_message[m] = [len(shown)]
                paired = "tool_call_id" in message
                shown.append(_output(message, paired, message.get("tool_call_id")))
                places.append(Place(m))
            elif role == "function":
                call_id = legacy.get(message.get("name"))
                by_message[m] = [len(shown)]
                shown.append(_output(message, call_id is not None, call_id))
                places.append(Place(m))
            elif role == "assistant":
                own: list[int] = []
                calls = message.get("tool_calls")
                for j, entry in enumerate(calls if isinstance(calls, list) else ()):
                    if isinstance(entry, dict):
                        call = _call(entry)
                        if "status" not in call:
                            unsettled.append(call)
                        own.append(len(shown))
                        shown.append(call)
                        places.append(Place(m, j))
                function_call = message.get("function_call")
                if isinstance(function_call, dict):
                    call_id = f"{MESSAGES}[{m}].function_call"
                    legacy[_hashable(function_call.get("name"))] = call_id
                    own.append(len(shown))
                    shown.append(_function(function_call, call_id))
                    places.append(Place(m, legacy=True))
                if own:
                    by_message[m] = own
        tools = parsed.get("tools")
        functions = parsed.get("functions")
        declared = list(tools) if isinstance(tools, list) else []
        if isinstance(functions, list):
            declared += [{"type": "function", "function": f} for f in functions]
        self.body: dict[str, Any] = {"input": shown, "tools": declared}
        self.places = places
        self._shown = shown
        self._by_message = by_message
        self._unsettled = unsettled

    def settle(self, recorded: Recorded | None) -> None:
        """The ledger has been read for this body (`recorded`; None: it names nothing there):
        a call the proxy never relayed is `completed`; one it relayed keeps no status of its
        own, so that the gate judges it by the status it was relayed with."""
        for call in self._unsettled:
            if "status" not in call and (recorded is None or not recorded.emitted_statuses(call)):
                call["status"] = _COMPLETED

    def located(self, verdict: Verdict) -> Verdict:
        """The verdict in the body's terms: each finding at its message, and the messages as
        they go upstream when the gate stripped or rewrote some."""
        if not verdict.findings:
            return verdict
        findings = tuple(self._locate(f) for f in verdict.findings)
        edited = None if verdict.input is None else self._edited(verdict.input)
        return replace(verdict, findings=findings, input=edited)

    def _locate(self, finding: Finding) -> Finding:
        if finding.index is None:
            return finding
        place = self.places[finding.index]
        paired = finding.paired_index
        return replace(
            finding,
            index=place.message,
            paired_index=None if paired is None else self.places[paired].message,
            param=place.param,
        )

    def _edited(self, sent: list[Any]) -> list[Any]:
        """The messages as they go upstream, from the shown items the gate kept (the same
        objects) or rebuilt around a failure record (a rewritten output keeps its call id:
        outputs of one call id are never rewritten, as a duplicate is never rewritten)."""
        kept = {id(item) for item in sent}
        shown = {id(item) for item in self._shown}
        rewritten = {
            item.get("call_id"): item.get("output")
            for item in sent
            if isinstance(item, dict) and id(item) not in shown
        }
        edited: list[Any] = []
        for m, message in enumerate(self.messages):
            own = self._by_message.get(m)
            if not own:
                edited.append(message)
                continue
            first = own[0]
            place = self.places[first]
            if place.call is None and not place.legacy:
                # A tool, function or stand-in message: one shown item.
                item = self._shown[first]
                if id(item) in kept:
                    edited.append(message)
                elif item.get("call_id") in rewritten and item["type"] != items.MESSAGE:
                    edited.append({**message, "content": rewritten[item.get("call_id")]})
                continue
            gone = [self.places[i] for i in own if id(self._shown[i]) not in kept]
            if not gone:
                edited.append(message)
                continue
            left = _without_calls(message, gone)
            if left is not None:
                edited.append(left)
        return edited


class ChatCompletions:
    """The Chat Completions API: `messages` holds the conversation; nothing continues a
    recorded response. Its answers' tool calls are recorded (`proxy.admission.completions`)."""

    paths: Mapping[str, str] = {
        "/v1/chat/completions": "chat_completions",
        "/chat/completions": "chat_completions",
    }
    label = "chat"
    records = True
    continues = False
    websocket = False

    def compacts(self, path: str) -> bool:
        return False

    def call_limits(self, vendor: str | None) -> CallLimits | None:
        """The Chat API's own limits of the upstream's vendor (OpenAI's 40-character id)."""
        return None if vendor is None else CHAT_LIMITS.get(vendor)

    def input_items(self, parsed: Mapping[str, Any]) -> Sequence[Any]:
        given = parsed.get(MESSAGES)
        return given if isinstance(given, list) else ()

    @staticmethod
    def kind(message: Any) -> str | None:
        """`items.kind`, without building the readings of a plain message (typeless, with a
        role and none of the members another reading takes): most of a Chat body is such."""
        if (
            isinstance(message, dict)
            and not message.get("type")
            and "role" in message
            and _OTHER_READINGS.isdisjoint(message)
        ):
            return items.MESSAGE
        return items.kind(message)

    def parse(self, decoded: bytes) -> dict[str, Any]:
        """The body read as any gated body is; its `messages`, when present, an array (as an
        Open Responses body's `input` is held to its own forms)."""
        parsed = body.parse(decoded)
        if MESSAGES in parsed and not isinstance(parsed[MESSAGES], list):
            raise body.BodyError(
                400, "invalid_messages", "`messages` must be an array of messages", param=MESSAGES
            )
        return parsed

    def view(self, parsed: Mapping[str, Any]) -> ChatView:
        return ChatView(parsed)

    async def load(self, parsed: Mapping[str, Any]) -> None:
        return None

    def answer(self, parsed: Mapping[str, Any], verdict: Verdict) -> dict[str, Any] | None:
        return None

    unavailable = staticmethod(ProxyError.document)

    def sent(self, parsed: dict[str, Any], verdict: Verdict) -> dict[str, Any]:
        """The messages the verdict located (`ChatView.located`) in the body."""
        return parsed if verdict.input is None else {**parsed, MESSAGES: verdict.input}

    def inlined(self, parsed: Mapping[str, Any], history: Sequence[Any]) -> dict[str, Any]:
        # A Chat body names no recorded response, so nothing is ever inlined into one.
        return dict(parsed)


def _is_item(message: Mapping[str, Any]) -> bool:
    """An Open Responses item (a call, an output, a reference) where a message belongs."""
    item_type = message.get("type")
    if not isinstance(item_type, str) or item_type == items.MESSAGE:
        return False
    return item_type == items.ITEM_REFERENCE or CORE.of(item_type) is not None


def _output(message: Mapping[str, Any], paired: bool, call_id: Any) -> dict[str, Any]:
    """A tool (or function) message as the output of `call_id`; without one, an orphan."""
    content = message.get("content")
    shown: dict[str, Any] = {"type": items.FUNCTION_CALL_OUTPUT}
    if paired:
        shown["call_id"] = call_id
    # Its content is the tool's result, which the gate does not judge: a list of parts is
    # shown as no text rather than as an output of another shape.
    shown["output"] = content if isinstance(content, str) else ""
    return shown


def _call(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A `tool_calls` entry as a call: a function_call when its type is `function`."""
    entry_type = entry.get("type")
    if entry_type == "function":
        shown_type = items.FUNCTION_CALL
    else:
        shown_type = entry_type if isinstance(entry_type, str) and entry_type else _UNTYPED_CALL
    spec = entry.get("function") if entry_type == "function" else entry.get(str(entry_type))
    shown: dict[str, Any] = {"type": shown_type}
    if "id" in entry:
        shown["call_id"] = entry["id"]
    if isinstance(spec, dict):
        for key in ("name", "arguments"):
            if key in spec:
                shown[key] = spec[key]
    if shown_type != items.FUNCTION_CALL:
        shown["status"] = _COMPLETED  # not a call the ledger may know: nothing to settle
    return shown


def _function(function_call: Mapping[str, Any], call_id: str) -> dict[str, Any]:
    """A legacy assistant `function_call` as a function_call of `call_id`."""
    shown: dict[str, Any] = {"type": items.FUNCTION_CALL, "call_id": call_id}
    for key in ("name", "arguments"):
        if key in function_call:
            shown[key] = function_call[key]
    # Its call id is its place: no completion the proxy relayed made it.
    shown["status"] = _COMPLETED
    return shown


def _hashable(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool | None) else repr(value)


def _without_calls(message: Mapping[str, Any], gone: Sequence[Place]) -> dict[str, Any] | None:
    """An assistant message without the calls the gate stripped; None when nothing is left in
    it (no content, no other call), so that no empty assistant turn goes upstream."""
    left = dict(message)
    dropped = {p.call for p in gone if p.call is not None}
    if dropped:
        calls = [c for j, c in enumerate(message["tool_calls"]) if j not in dropped]
        if calls:
            left["tool_calls"] = calls
        else:
            # An empty `tool_calls` is refused by a strict server: the member goes.
            del left["tool_calls"]
    if any(p.legacy for p in gone):
        del left["function_call"]
    if "tool_calls" in left or "function_call" in left or _said(left.get("content")):
        return left
    return None


def _said(content: Any) -> bool:
    return content not in (None, "", [])
