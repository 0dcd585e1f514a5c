"""Every finding in one readable sentence: what a rewrite tells the model and `check` prints."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from proxy.gate import strictjson
from proxy.gate.schemas import Violation

if TYPE_CHECKING:
    from proxy.gate.verdict import Finding


def message(finding: Finding) -> str:
    """The finding's sentence: the reason in words, with what this item shows of it (the
    status found, the duplicate key and where, every schema violation)."""
    say = _SAY.get(finding.reason)
    if say is None:
        return f"the call failed the replay gate: {finding.reason}"
    return say(finding)


def detail_of(reason: str, call: Any, emitted: Sequence[Any] = ()) -> str | None:
    """What the paired item shows of `reason` that its finding keeps (`Finding.detail`): the
    status it has (or that the proxy relayed it with), its type, or that it has no arguments."""
    if not isinstance(call, dict):
        return None
    if reason == "status":
        if "status" in call and call["status"] is not None:
            return f"status is {_shown(call['status'])}"
        said = "status is missing" if "status" not in call else "status is null"
        if len(set(map(_shown, emitted))) > 1:
            relayed = ", ".join(sorted(set(map(_shown, emitted))))
            return f"{said}, and the proxy relayed this call with several statuses ({relayed})"
        if emitted:
            return f"{said}, and the proxy relayed this call as {_shown(emitted[0])}"
        return said
    if reason == "arguments_type" and "arguments" not in call:
        return "arguments is missing"
    if reason in ("namespaced", "not_function_call"):
        return f"its type is {_shown(call.get('type')) if 'type' in call else 'missing'}"
    return None


def _orphan(f: Finding) -> str:
    named = f"call_id {f.call_id}" if f.call_id is not None else "no string call_id"
    return (
        f"no function_call with {named} precedes this output: not inline, not behind an "
        "item_reference, not in the previous_response_id chain the proxy recorded"
    )


def _duplicate(f: Finding) -> str:
    return (
        f"more than one function_call, or more than one output, has call_id {f.call_id}: "
        "which one was answered is ambiguous"
    )


def _status(f: Finding) -> str:
    said = f.detail or "status is not completed"
    return f"{said}: a replayed function_call must be completed"


def _namespaced(f: Finding) -> str:
    shown = f" ({f.detail})" if f.detail else ""
    return f"the paired item is a vendor extension, not a portable function_call{shown}"


def _not_function_call(f: Finding) -> str:
    shown = f" ({f.detail})" if f.detail else ""
    return f"the paired item is not a function_call{shown}"


def _arguments_type(f: Finding) -> str:
    if f.detail:
        return f"{f.detail}: a function_call carries its arguments as a string of JSON"
    kind = _json_type(f.arguments)
    shown = f" but {kind}" if kind is not None else ""
    return f"arguments must be a string of JSON{shown}"


def _arguments_parse(f: Finding) -> str:
    said = "arguments are not one strict JSON value"
    if not isinstance(f.arguments, str):
        return said
    try:
        strictjson.loads(f.arguments, exact=True)
    except strictjson.StrictJSONError as exc:
        return f"{said}: {exc}"
    return said


def _unknown_tool(f: Finding) -> str:
    return (
        f"no schema for tool {f.name or '(unnamed)'}: pin one under tools: or send it in the "
        "request's tools"
    )


def _arguments_schema(f: Finding) -> str:
    return _phrases(f) or "the arguments failed schema"


def _phrases(f: Finding) -> str:
    """Each violation the finding lists in words, and how many more it has."""
    said = "; ".join(_phrase(v) for v in f.fail)
    if f.fail_omitted:
        more = f"{f.fail_omitted} more violation{'s' if f.fail_omitted > 1 else ''}"
        said += f"; and {more}"
    return said


# A Chat Completions body on a Responses path: `check` says it of such a document too.
CHAT_BODY = (
    "a Chat Completions body (messages, not input): the proxy gates Open Responses requests, "
    "and sent as input its tool calls and tool results are envelope items"
)


def _envelope(f: Finding) -> str:
    if f.param == "messages":
        return CHAT_BODY
    return (
        "a Chat Completions message (role: tool, tool_calls or tool_call_id) inside input: "
        "Open Responses carries function_call and function_call_output items instead"
    )


def _ambiguous(f: Finding) -> str:
    return (
        "an item without a type that the spec's defaults read as more than one kind: give it a type"
    )


def _unknown_reference(f: Finding) -> str:
    named = f" {f.reference}" if f.reference is not None else ""
    return f"item_reference{named} names no item the proxy relayed"


def _provenance(f: Finding) -> str:
    return (
        "no upstream response the proxy relayed to this client emitted this call (its call_id, "
        "name and arguments)"
    )


def _foreign_item(f: Finding) -> str:
    shown = f" ({f.item_type})" if f.item_type else ""
    return (
        f"the item's type carries another vendor's slug than the upstream's{shown}: it is not "
        "portable"
    )


def _not_portable(f: Finding) -> str:
    said = "the call or its output breaks the spec's item schema (call_id, name, field types)"
    if not f.fail:
        return said
    item = f.item_type or "call"
    phrases = _phrases(f)
    return f"the {item} breaks the spec's item schema (a server may refuse it): {phrases}"


_SAY: dict[str, Callable[[Finding], str]] = {
    "orphan": _orphan,
    "duplicate_call_id": _duplicate,
    "provenance": _provenance,
    "namespaced": _namespaced,
    "not_function_call": _not_function_call,
    "status": _status,
    "arguments_type": _arguments_type,
    "arguments_parse": _arguments_parse,
    "unknown_tool": _unknown_tool,
    "arguments_schema": _arguments_schema,
    "envelope": _envelope,
    "ambiguous_item": _ambiguous,
    "unknown_reference": _unknown_reference,
    "foreign_item": _foreign_item,
    "not_portable": _not_portable,
}


def _phrase(violation: Violation) -> str:
    subject = violation.path[1:] if violation.path else "the arguments"
    keyword = violation.reason
    if keyword in ("additionalProperties", "unevaluatedProperties"):
        return f"{subject} is not allowed ({keyword}: false)"
    if keyword == "required":
        return f"{subject} is required"
    if not violation.expected:
        detail = f": {violation.message}" if violation.message else ""
        return f"{subject} failed schema ({keyword}{detail})"
    value = violation.expected[0]
    if keyword == "pattern" and isinstance(value, str):
        wanted = value
    elif keyword == "enum" and isinstance(value, list):
        wanted = "one of " + ", ".join(_shown(v) for v in value)
    elif keyword == "type":
        wanted = "type " + (" or ".join(map(str, value)) if isinstance(value, list) else str(value))
    elif keyword == "const":
        wanted = _shown(value)
    else:
        wanted = f"{keyword} {_shown(value)}"
    return f"{subject} failed schema: expected {wanted}"


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _json_type(value: Any) -> str | None:
    if value is None:
        return "null"
    for kind, name in ((bool, "a boolean"), (dict, "an object"), (list, "an array")):
        if isinstance(value, kind):
            return name
    if isinstance(value, int | float):
        return "a number"
    return None
