"""The gate's failure record: what a rewritten output tells the model instead of a tool result."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from proxy.gate.messages import message
from proxy.gate.schemas import Violation

if TYPE_CHECKING:
    from proxy.gate.verdict import Finding


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
