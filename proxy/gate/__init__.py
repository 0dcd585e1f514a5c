"""The pure core: items, strict JSON, schemas, the replay gate's checks and verdict."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.gate.arguments import check_arguments, compile_schemas, pending_schemas
    from proxy.gate.budget import TIMEOUTS
    from proxy.gate.caches import CachedVerdict, GateCaches, VerdictKey
    from proxy.gate.failure import failure_output, failure_record
    from proxy.gate.pairing import NOTHING_RECORDED, NothingRecorded, Pairing, Recorded
    from proxy.gate.policy import (
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
        Policy,
    )
    from proxy.gate.verdict import Finding, Verdict, inspect, rejection

# Where each name lives; imported on first use.
_WHERE = {
    "ACTIONS": "proxy.gate.policy",
    "ALL_REASONS": "proxy.gate.policy",
    "AMBIGUOUS_ITEM": "proxy.gate.policy",
    "Action": "proxy.gate.policy",
    "CachedVerdict": "proxy.gate.caches",
    "ENVELOPE": "proxy.gate.policy",
    "FOREIGN_ITEM": "proxy.gate.policy",
    "Finding": "proxy.gate.verdict",
    "GateCaches": "proxy.gate.caches",
    "ITEM_REASONS": "proxy.gate.policy",
    "NOTHING_RECORDED": "proxy.gate.pairing",
    "NOT_REWRITTEN": "proxy.gate.policy",
    "NothingRecorded": "proxy.gate.pairing",
    "Outcome": "proxy.gate.policy",
    "Pairing": "proxy.gate.pairing",
    "Policy": "proxy.gate.policy",
    "REASONS": "proxy.gate.policy",
    "Recorded": "proxy.gate.pairing",
    "TIMEOUTS": "proxy.gate.budget",
    "UNKNOWN_REFERENCE": "proxy.gate.policy",
    "Verdict": "proxy.gate.verdict",
    "VerdictKey": "proxy.gate.caches",
    "check_arguments": "proxy.gate.arguments",
    "compile_schemas": "proxy.gate.arguments",
    "failure_output": "proxy.gate.failure",
    "failure_record": "proxy.gate.failure",
    "inspect": "proxy.gate.verdict",
    "pending_schemas": "proxy.gate.arguments",
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
    "Finding",
    "GateCaches",
    "NothingRecorded",
    "Outcome",
    "Pairing",
    "Policy",
    "Recorded",
    "Verdict",
    "VerdictKey",
    "check_arguments",
    "compile_schemas",
    "failure_output",
    "failure_record",
    "inspect",
    "pending_schemas",
    "rejection",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
