"""The gate's failure record: what a rewritten output tells the model instead of a tool result."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from proxy.gate.schemas import Violation

if TYPE_CHECKING:
    from proxy.gate.verdict import Finding

# What each reason that is not a schema failure says, in one sentence.
_SAID = {
    "provenance": "no upstream response the proxy relayed emitted this call",
    "namespaced": "the call's type is not a portable function_call",
    "not_function_call": "the paired item is not a function_call",
    "not_portable": "the call or its output does not fit the spec's item schema",
    "status": "the call's status is not completed",
    "arguments_type": "the call's arguments are not a string",
    "arguments_parse": "the call's arguments are not one strict JSON value",
    "foreign_item": "the item is another vendor's, not portable to this upstream",
}


def failure_record(finding: Finding) -> dict[str, Any]:
    """The record in the shape of a host check's failure: the call was not executed, and why."""
    return {
        "success": False,
        "execute": False,
        "check": finding.name,
        "reason": finding.reason,
        "pass": list(finding.passed),
        "fail": [_entry(v) for v in finding.fail],
        "error": error_sentence(finding),
    }


def failure_output(finding: Finding) -> str:
    """The failure record as the JSON string a `function_call_output`'s `output` carries."""
    # The standard library writes any integer a schema holds, however large.
    return json.dumps(failure_record(finding), ensure_ascii=False)


def _entry(violation: Violation) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": violation.path, "reason": violation.reason}
    if violation.expected:
        entry["expected"] = violation.expected[0]
    return entry


def error_sentence(finding: Finding) -> str:
    """One readable sentence: every violation, or what the reason means."""
    if finding.reason == "unknown_tool":
        return f"no schema is known for the tool {finding.name or '(unnamed)'}"
    if finding.reason == "not_portable" and finding.fail:
        item = finding.item_type or "call"
        phrases = "; ".join(_phrase(v) for v in finding.fail)
        return f"the {item} does not fit the spec's item schema (a server may refuse it): {phrases}"
    if finding.reason != "arguments_schema":
        return _SAID.get(finding.reason, f"the call failed the replay gate: {finding.reason}")
    return "; ".join(_phrase(v) for v in finding.fail) or "the arguments failed schema"


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
