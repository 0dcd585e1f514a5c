"""A Chat completion as the ledger and door 2 read it: the `tool_calls` of its choices as the
`function_call` items of a response, whole from a JSON answer or assembled from a stream's
`delta.tool_calls` fragments (by their `index`).

A call's `status` is its choice's end: `completed`, or `incomplete` when the choice was cut
(`finish_reason` `length` or `content_filter`; in a stream, a choice that never said how it
ended). Each call keeps its place in the completion (`choices[0].message.tool_calls[1]`), which
door 2's findings name. A legacy `function_call` has no id to be replayed by, and a `tool_calls`
entry of another type than `function` (a custom tool's) is not a function call: neither is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.gate import items

CHAT_COMPLETION = "chat.completion"
# How a choice ends when its calls may be cut short: not all the model meant to say is there.
CUT = frozenset({"length", "content_filter"})
COMPLETED = "completed"
INCOMPLETE = "incomplete"


@dataclass(frozen=True, slots=True)
class Completion:
    """A completion's calls as a response (`id`, `model`, `output`: function_call items) and,
    for each, its place in the completion."""

    response: dict[str, Any]
    places: tuple[str, ...]

    def recorded_as(self, key: str) -> dict[str, Any]:
        """The response as the ledger records it, under `key`: a completion's own id need not
        be unique (n choices share one, and some servers repeat theirs), the proxy's is."""
        return {**self.response, "id": key}


def status_of(finish_reason: Any) -> str:
    """The status of the calls of a choice that ended so (None: never said)."""
    if not isinstance(finish_reason, str) or finish_reason in CUT:
        return INCOMPLETE
    return COMPLETED


def completion_of(answer: Mapping[str, Any]) -> Completion | None:
    """The calls of a JSON answer (`object: chat.completion`); None when it is not one, or
    holds no function call."""
    if answer.get("object") not in (CHAT_COMPLETION, None):
        return None
    choices = answer.get("choices")
    output: list[dict[str, Any]] = []
    places: list[str] = []
    for c, choice in enumerate(choices if isinstance(choices, list) else ()):
        message = choice.get("message") if isinstance(choice, dict) else None
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if not isinstance(calls, list):
            continue
        status = status_of(choice.get("finish_reason"))
        for j, entry in enumerate(calls):
            if isinstance(entry, dict) and entry.get("type") == "function":
                function = entry.get("function")
                output.append(_call(entry.get("id"), function, status))
                places.append(f"choices[{c}].message.tool_calls[{j}]")
    return _completion(answer.get("id"), answer.get("model"), output, places)


@dataclass
class _StreamedChoice:
    # Each call's fragments so far, by their `index`: id, type, name, arguments.
    calls: dict[Any, dict[str, Any]] = field(default_factory=dict)
    finish_reason: Any = None


class StreamedCompletion:
    """A streamed completion's `chat.completion.chunk`s, assembled as they come; `size` is how
    many characters of arguments it holds (the tap bounds it)."""

    __slots__ = ("choices", "completion_id", "model", "size")

    def __init__(self) -> None:
        self.completion_id: Any = None
        self.model: Any = None
        self.choices: dict[Any, _StreamedChoice] = {}
        self.size = 0

    def add(self, chunk: Mapping[str, Any]) -> None:
        """One chunk's choices: their call fragments, and how they ended."""
        if self.completion_id is None:
            self.completion_id, self.model = chunk.get("id"), chunk.get("model")
        choices = chunk.get("choices")
        for position, choice in enumerate(choices if isinstance(choices, list) else ()):
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", position)
            found = self.choices.setdefault(_key(index), _StreamedChoice())
            if choice.get("finish_reason") is not None:
                found.finish_reason = choice["finish_reason"]
            delta = choice.get("delta")
            fragments = delta.get("tool_calls") if isinstance(delta, dict) else None
            for at, fragment in enumerate(fragments if isinstance(fragments, list) else ()):
                if isinstance(fragment, dict):
                    call = found.calls.setdefault(_key(fragment.get("index", at)), {})
                    self._assemble(call, fragment)

    def _assemble(self, call: dict[str, Any], fragment: Mapping[str, Any]) -> None:
        # The id, type and name come once, in the first fragment; the arguments in pieces.
        for key in ("id", "type"):
            if key in fragment and fragment[key] is not None:
                call.setdefault(key, fragment[key])
        function = fragment.get("function")
        if not isinstance(function, dict):
            return
        if function.get("name") is not None:
            call.setdefault("name", function["name"])
        if "arguments" in function:
            piece, before = function["arguments"], call.get("arguments")
            if isinstance(piece, str) and isinstance(before, str):
                call["arguments"] = before + piece
            elif "arguments" not in call:
                call["arguments"] = piece
            if isinstance(piece, str):
                self.size += len(piece)

    def completion(self) -> Completion | None:
        """The calls assembled so far; None when there are none."""
        output: list[dict[str, Any]] = []
        places: list[str] = []
        for position, (index, choice) in enumerate(sorted(self.choices.items(), key=_order)):
            c = index if _order((index, None))[0] == 0 else position
            status = status_of(choice.finish_reason)
            for j, (_, call) in enumerate(sorted(choice.calls.items(), key=_order)):
                # A stream's later fragments say no type: a call is a function's unless said.
                if call.get("type", "function") == "function":
                    function = {k: call[k] for k in ("name", "arguments") if k in call}
                    output.append(_call(call.get("id"), function, status))
                    places.append(f"choices[{c}].message.tool_calls[{j}]")
        return _completion(self.completion_id, self.model, output, places)


def _call(call_id: Any, function: Any, status: str) -> dict[str, Any]:
    """A `tool_calls` entry as the function_call item the ledger and door 2 read."""
    found: dict[str, Any] = {"type": items.FUNCTION_CALL}
    if call_id is not None:
        found["call_id"] = call_id
    if isinstance(function, dict):
        for key in ("name", "arguments"):
            if key in function:
                found[key] = function[key]
    found["status"] = status
    return found


def _completion(
    completion_id: Any, model: Any, output: list[dict[str, Any]], places: list[str]
) -> Completion | None:
    if not output:
        return None
    response: dict[str, Any] = {"id": completion_id, "output": output}
    if isinstance(model, str):
        response["model"] = model
    return Completion(response, tuple(places))


def _key(index: Any) -> Any:
    """A fragment's `index` as a key: any JSON value, hashable."""
    return index if isinstance(index, str | int | float | bool | None) else repr(index)


def _order(pair: tuple[Any, Any]) -> tuple[int, str]:
    """Choices and calls in the order of their indexes (numbers first), whatever their type."""
    key = pair[0]
    if isinstance(key, int) and not isinstance(key, bool):
        return (0, f"{key:020d}")
    return (1, repr(key))
