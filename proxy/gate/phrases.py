"""The words a finding's sentence is built from that need no finding: a violation, a value, and
what a paired item shows of a reason."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from proxy.gate.reasons import Reason
from proxy.gate.schemas import Violation

# A Chat Completions body on a Responses path: `check` says it of such a document too.
CHAT_BODY = (
    "a Chat Completions body (messages, not input): the proxy gates Open Responses requests, "
    "and sent as input its tool calls and tool results are envelope items"
)


def detail_of(reason: Reason, call: Any, emitted: Sequence[Any] = ()) -> str | None:
    """What the paired item shows of `reason` that its finding keeps (`Finding.detail`): the
    status it has (or that the proxy relayed it with), its type, or that it has no arguments."""
    if not isinstance(call, dict):
        return None
    if reason == Reason.STATUS:
        if "status" in call and call["status"] is not None:
            return f"status is {shown(call['status'])}"
        said = "status is missing" if "status" not in call else "status is null"
        if len(set(map(shown, emitted))) > 1:
            relayed = ", ".join(sorted(set(map(shown, emitted))))
            return f"{said}, and the proxy relayed this call with several statuses ({relayed})"
        if emitted:
            return f"{said}, and the proxy relayed this call as {shown(emitted[0])}"
        return said
    if reason == Reason.ARGUMENTS_TYPE and "arguments" not in call:
        return "arguments is missing"
    if reason in (Reason.NAMESPACED, Reason.NOT_FUNCTION_CALL):
        return f"its type is {shown(call.get('type')) if 'type' in call else 'missing'}"
    return None


def violations(fail: Sequence[Violation], omitted: int) -> str:
    """Each violation in words, and how many more were counted."""
    said = "; ".join(phrase(v) for v in fail)
    if omitted:
        said += f"; and {omitted} more violation{'s' if omitted > 1 else ''}"
    return said


def phrase(violation: Violation) -> str:
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
        wanted = "one of " + ", ".join(shown(v) for v in value)
    elif keyword == "type":
        wanted = "type " + (" or ".join(map(str, value)) if isinstance(value, list) else str(value))
    elif keyword == "const":
        wanted = shown(value)
    else:
        wanted = f"{keyword} {shown(value)}"
    return f"{subject} failed schema: expected {wanted}"


def shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def json_type(value: Any) -> str | None:
    """A JSON value's type in words ("an object"); None for a string."""
    if value is None:
        return "null"
    for kind, name in ((bool, "a boolean"), (dict, "an object"), (list, "an array")):
        if isinstance(value, kind):
            return name
    if isinstance(value, int | float):
        return "a number"
    return None
