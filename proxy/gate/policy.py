"""The gate's policy: the action for each reason, and the pinned tool schemas."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jsonschema.exceptions import SchemaError

from proxy.gate.pins import pin_schema
from proxy.gate.reasons import ACTIONS, ALL_REASONS, NOT_REWRITTEN, Action
from proxy.gate.schemas import (
    Compiled,
    SchemaLimits,
    check_terminates,
    compile_schema,
)


class PolicyError(ValueError):
    """Every way a Policy's settings are wrong, each naming its setting."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = tuple(problems)


@dataclass(frozen=True)
class Policy:
    """The gate's settings: actions, and pinned schemas (checked and compiled here). Frozen:
    what the gate learns as it works is kept in `GateCaches`, apart.

    Raises PolicyError (a ValueError) naming every setting that is wrong; a pin may be written
    as a tool, unwrapped to its schema by `pin_schema`.
    """

    action: Action = "block"
    actions: Mapping[str, Action] = field(default_factory=dict)
    allow_missing_status: bool = False
    require_provenance: bool = False
    # the target upstream's slug (items typed `<slug>:...` are its own); None: not judged
    vendor: str | None = None
    tools: Mapping[str, Any] = field(default_factory=dict)
    max_cached_verdicts: int = 65536
    # The time validating one request's arguments against their schemas may take, all calls
    # together; a call still unchecked when it is spent fails (`validation_timeout`).
    validation_timeout_s: float = 1.0
    # How large a schema may be, pinned or sent; a request's schema over a limit fails its calls.
    schema_limits: SchemaLimits = field(default_factory=SchemaLimits)
    pinned: Mapping[str, Compiled] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        problems = list(self._iter_problems())
        if isinstance(self.schema_limits, Mapping):
            object.__setattr__(self, "schema_limits", SchemaLimits(**self.schema_limits))
        pinned = {}
        for serial, (name, pin) in enumerate(self.tools.items(), start=1):
            try:
                # Negative keys: a verdict on a pinned schema never shares its key with one on
                # a request schema, whose keys the caches count up from 1.
                pinned[name] = compile_schema(pin_schema(name, pin), -serial, self.schema_limits)
                check_terminates(pinned[name])
            except SchemaError as exc:
                problems.append(f"tools.{name}: not a valid JSON Schema: {exc.message}")
            except ValueError as exc:
                problems.append(str(exc))
        if problems:
            raise PolicyError(problems)
        object.__setattr__(self, "pinned", pinned)

    def _iter_problems(self) -> Iterator[str]:
        if self.action not in ACTIONS:
            yield f"action: {self.action!r} is not one of {', '.join(ACTIONS)}"
        for reason, action in self.actions.items():
            if reason not in ALL_REASONS:
                yield f"actions.{reason}: unknown reason"
            elif action not in ACTIONS:
                yield f"actions.{reason}: {action!r} is not one of {', '.join(ACTIONS)}"
            elif action == "rewrite" and reason in NOT_REWRITTEN:
                yield (
                    f"actions.{reason}: rewrite is not an action for {reason}: there is no call "
                    "whose failure its output could carry (block, strip or log)"
                )
        if self.vendor is not None and (
            not isinstance(self.vendor, str) or not self.vendor or ":" in self.vendor
        ):
            yield f"vendor: {self.vendor!r} is not a vendor slug (a name without a colon)"
        if not self.validation_timeout_s > 0:
            yield f"validation_timeout_s: {self.validation_timeout_s!r} is not positive"

    def pin_for(self, tool: str) -> Compiled | None:
        """The schema pinned for a tool named as `items.tool_name` names it; a tool inside a
        namespace (`<namespace>/<name>`) pinned by its bare name is held to that pin too: a
        client cannot escape a pin by moving its tool into a namespace."""
        pinned = self.pinned.get(tool)
        if pinned is None and "/" in tool:
            pinned = self.pinned.get(tool.rpartition("/")[2])
        return pinned

    def action_for(self, reason: str) -> Action:
        action = self.actions.get(reason, self.action)
        if action == "rewrite" and reason in NOT_REWRITTEN:
            return "block"
        return action
