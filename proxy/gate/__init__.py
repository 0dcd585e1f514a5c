"""The pure core: items, strict JSON, schemas, the replay gate's checks and verdict."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.gate.arguments import check_arguments, compile_schemas, pending_schemas
    from proxy.gate.budget import TIMEOUTS
    from proxy.gate.caches import CachedVerdict, GateCaches, VerdictKey
    from proxy.gate.findings import Failed, Finding
    from proxy.gate.pairing import NOTHING_RECORDED, NothingRecorded, Pairing, Recorded
    from proxy.gate.policy import Policy
    from proxy.gate.reasons import (
        ACTIONS,
        ALL_REASONS,
        AMBIGUOUS_ITEM,
        ENVELOPE,
        FOREIGN_ITEM,
        ITEM_REASONS,
        NOT_REWRITTEN,
        REASONS,
        UNKNOWN_REFERENCE,
        Action,
        Outcome,
        Reason,
    )
    from proxy.gate.records import failure_output, failure_record, read_finding
    from proxy.gate.verdict import Verdict, inspect, rejection

# Where each name lives; imported on first use.
_WHERE = {
    "ACTIONS": "proxy.gate.reasons",
    "ALL_REASONS": "proxy.gate.reasons",
    "AMBIGUOUS_ITEM": "proxy.gate.reasons",
    "Action": "proxy.gate.reasons",
    "CachedVerdict": "proxy.gate.caches",
    "ENVELOPE": "proxy.gate.reasons",
    "FOREIGN_ITEM": "proxy.gate.reasons",
    "Failed": "proxy.gate.findings",
    "Finding": "proxy.gate.findings",
    "GateCaches": "proxy.gate.caches",
    "ITEM_REASONS": "proxy.gate.reasons",
    "NOTHING_RECORDED": "proxy.gate.pairing",
    "NOT_REWRITTEN": "proxy.gate.reasons",
    "NothingRecorded": "proxy.gate.pairing",
    "Outcome": "proxy.gate.reasons",
    "Pairing": "proxy.gate.pairing",
    "Policy": "proxy.gate.policy",
    "REASONS": "proxy.gate.reasons",
    "Reason": "proxy.gate.reasons",
    "Recorded": "proxy.gate.pairing",
    "TIMEOUTS": "proxy.gate.budget",
    "UNKNOWN_REFERENCE": "proxy.gate.reasons",
    "Verdict": "proxy.gate.verdict",
    "VerdictKey": "proxy.gate.caches",
    "check_arguments": "proxy.gate.arguments",
    "compile_schemas": "proxy.gate.arguments",
    "failure_output": "proxy.gate.records",
    "failure_record": "proxy.gate.records",
    "inspect": "proxy.gate.verdict",
    "pending_schemas": "proxy.gate.arguments",
    "read_finding": "proxy.gate.records",
    "rejection": "proxy.gate.verdict",
}

__all__ = [
    "ACTIONS",
    "ALL_REASONS",
    "AMBIGUOUS_ITEM",
    "ENVELOPE",
    "FOREIGN_ITEM",
    "ITEM_REASONS",
    "NOTHING_RECORDED",
    "NOT_REWRITTEN",
    "REASONS",
    "TIMEOUTS",
    "UNKNOWN_REFERENCE",
    "Action",
    "CachedVerdict",
    "Failed",
    "Finding",
    "GateCaches",
    "NothingRecorded",
    "Outcome",
    "Pairing",
    "Policy",
    "Reason",
    "Recorded",
    "Verdict",
    "VerdictKey",
    "check_arguments",
    "compile_schemas",
    "failure_output",
    "failure_record",
    "inspect",
    "pending_schemas",
    "read_finding",
    "rejection",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
