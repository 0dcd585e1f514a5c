"""The gate's policy: its reasons, their actions, and the pinned tool schemas."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from jsonschema.exceptions import SchemaError

from proxy.gate.schemas import (
    LRU,
    Compiled,
    SchemaCache,
    SchemaLimits,
    Violation,
    check_terminates,
    compile_schema,
)

Action = Literal["block", "strip", "log"]

Outcome = Literal["forward", "strip", "block"]

ACTIONS: tuple[Action, ...] = ("block", "strip", "log")

# Checked in this order; the first that applies wins.
REASONS = (
    "orphan",
    "duplicate_call_id",
    "provenance",
    "namespaced",
    "not_function_call",
    "status",
    "arguments_type",
    "arguments_parse",
    "unknown_tool",
    "arguments_schema",
)

# Item-level reasons: about one item of `input` itself, found beside any output's reason.
ENVELOPE = "envelope"

AMBIGUOUS_ITEM = "ambiguous_item"

UNKNOWN_REFERENCE = "unknown_reference"

ITEM_REASONS = (ENVELOPE, AMBIGUOUS_ITEM, UNKNOWN_REFERENCE)

ALL_REASONS = (*REASONS, *ITEM_REASONS)


@dataclass(frozen=True)
class Policy:
    """The gate's settings: actions, pinned schemas (checked and compiled here), and its caches.

    Raises ValueError naming the setting when one is wrong.
    """

    action: Action = "block"
    actions: Mapping[str, Action] = field(default_factory=dict)
    allow_missing_status: bool = False
    require_provenance: bool = False
    tools: Mapping[str, Any] = field(default_factory=dict)
    max_cached_verdicts: int = 65536
    # The time validating one request's arguments against their schemas may take, all calls
    # together; a call still unchecked when it is spent fails (`validation_timeout`).
    validation_timeout_s: float = 1.0
    # How large a schema may be, pinned or sent; a request's schema over a limit fails its calls.
    schema_limits: SchemaLimits = field(default_factory=SchemaLimits)
    schemas: SchemaCache = field(default_factory=SchemaCache, compare=False, repr=False)
    pinned: Mapping[str, Compiled] = field(init=False, compare=False, repr=False)
    verdicts: LRU[tuple[tuple[int, ...], str], tuple[str, tuple[Violation, ...]] | str] = field(
        init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action: {self.action!r} is not one of {', '.join(ACTIONS)}")
        for reason, action in self.actions.items():
            if reason not in ALL_REASONS:
                raise ValueError(f"actions.{reason}: unknown reason")
            if action not in ACTIONS:
                raise ValueError(f"actions.{reason}: {action!r} is not one of {', '.join(ACTIONS)}")
        if not self.validation_timeout_s > 0:
            raise ValueError(f"validation_timeout_s: {self.validation_timeout_s!r} is not positive")
        if isinstance(self.schema_limits, Mapping):
            object.__setattr__(self, "schema_limits", SchemaLimits(**self.schema_limits))
        pinned = {}
        for name, schema in self.tools.items():
            try:
                pinned[name] = compile_schema(schema, self.schemas.next_key(), self.schema_limits)
                check_terminates(pinned[name])
            except SchemaError as exc:
                raise ValueError(f"tools.{name}: not a valid JSON Schema: {exc.message}") from None
        object.__setattr__(self, "pinned", pinned)
        object.__setattr__(self, "verdicts", LRU(self.max_cached_verdicts))

    def action_for(self, reason: str) -> Action:
        return self.actions.get(reason, self.action)
