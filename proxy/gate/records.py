"""A finding as records keep it: the failure record a rewritten output tells the model instead
of a tool result, and a finding read back from an audit record."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from proxy.gate.findings import Finding, message
from proxy.gate.reasons import Action, Reason
from proxy.gate.schemas import Violation

_REASONS = frozenset(Reason)


def failure_record(finding: Finding) -> dict[str, Any]:
    """The record in the shape of a host check's failure: the call was not executed, and why.
    It lists the violations the finding lists, and with `fail_omitted` how many more it has."""
    record: dict[str, Any] = {
        "success": False,
        "execute": False,
        "check": finding.name,
        "reason": finding.reason,
        "pass": list(finding.passed),
        "fail": [_entry(v) for v in finding.fail],
    }
    if finding.fail_omitted:
        record["fail_omitted"] = finding.fail_omitted
    record["error"] = error_sentence(finding)
    return record


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
    """One readable sentence: every violation, or what the reason means (`check` prints it too)."""
    return message(finding)


def read_finding(recorded: Any, action_for: Callable[[str], Action]) -> Finding | None:
    """A finding as an audit record keeps it (`Finding.as_dict`), its action the one
    `action_for` gives its reason; None for what is not a finding the proxy writes."""
    if not isinstance(recorded, dict):
        return None
    index, reason = recorded.get("index"), recorded.get("reason")
    param = recorded.get("param")
    # A finding about the body itself (`messages`) has no index, and says where in `param`.
    placed = isinstance(index, int) or (index is None and isinstance(param, str))
    if not placed or isinstance(index, bool) or not isinstance(reason, str):
        return None
    if reason not in _REASONS:
        return None
    call_id, name = recorded.get("call_id"), recorded.get("name")
    paired = recorded.get("paired_index")
    fail = recorded.get("fail")
    violations = tuple(
        Violation(
            v["path"],
            v["reason"],
            v.get("message") if isinstance(v.get("message"), str) else None,
            (v["expected"],) if "expected" in v else (),
        )
        for v in (fail if isinstance(fail, list) else [])
        if isinstance(v, dict)
        and isinstance(v.get("path"), str)
        and isinstance(v.get("reason"), str)
    )
    passed = recorded.get("pass")
    reference = recorded.get("id")
    omitted = recorded.get("fail_omitted")
    return Finding(
        index,
        Reason(reason),
        action_for(reason),
        call_id if isinstance(call_id, str) else None,
        paired if isinstance(paired, int) and not isinstance(paired, bool) else None,
        name if isinstance(name, str) else None,
        violations,
        recorded.get("arguments"),
        reference if isinstance(reference, str) else None,
        tuple(p for p in passed if isinstance(p, str)) if isinstance(passed, list) else (),
        fail_omitted=omitted if isinstance(omitted, int) and not isinstance(omitted, bool) else 0,
        param=param if isinstance(param, str) else None,
    )
