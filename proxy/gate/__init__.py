"""The pure core: items, strict JSON, schemas, the replay gate's checks and verdict."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.gate.arguments import TIMEOUTS, check_arguments, compile_schemas, pending_schemas
    from proxy.gate.pairing import NOTHING_RECORDED, NothingRecorded, Recorded
    from proxy.gate.policy import (
        ACTIONS,
        ALL_REASONS,
        AMBIGUOUS_ITEM,
        ENVELOPE,
        ITEM_REASONS,
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
    "ENVELOPE": "proxy.gate.policy",
    "Finding": "proxy.gate.verdict",
    "ITEM_REASONS": "proxy.gate.policy",
    "NOTHING_RECORDED": "proxy.gate.pairing",
    "NothingRecorded": "proxy.gate.pairing",
    "Outcome": "proxy.gate.policy",
    "Policy": "proxy.gate.policy",
    "REASONS": "proxy.gate.policy",
    "Recorded": "proxy.gate.pairing",
    "TIMEOUTS": "proxy.gate.arguments",
    "UNKNOWN_REFERENCE": "proxy.gate.policy",
    "Verdict": "proxy.gate.verdict",
    "check_arguments": "proxy.gate.arguments",
    "compile_schemas": "proxy.gate.arguments",
    "inspect": "proxy.gate.verdict",
    "pending_schemas": "proxy.gate.arguments",
    "rejection": "proxy.gate.verdict",
}

__all__ = [
    "ACTIONS",
    "ALL_REASONS",
    "AMBIGUOUS_ITEM",
    "ENVELOPE",
    "ITEM_REASONS",
    "NOTHING_RECORDED",
    "REASONS",
    "TIMEOUTS",
    "UNKNOWN_REFERENCE",
    "Action",
    "Finding",
    "NothingRecorded",
    "Outcome",
    "Policy",
    "Recorded",
    "Verdict",
    "check_arguments",
    "compile_schemas",
    "inspect",
    "pending_schemas",
    "rejection",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
