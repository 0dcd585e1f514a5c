"""What the gate remembers between requests under one policy: request schemas and verdicts."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from proxy.gate.call_limits import CallLimits
from proxy.gate.findings import Failed
from proxy.gate.policy import Policy
from proxy.gate.portable import ItemSchemas, PortableCache, item_schemas
from proxy.gate.schemas import LRU, SchemaCache


class CachedPass(Enum):
    """What the verdict cache holds for arguments that passed (a miss is None)."""

    PASSED = "passed"


PASSED = CachedPass.PASSED

# The schemas' keys, the violations listed at most, the arguments.
VerdictKey = tuple[tuple[int, ...], int, str]
# A call that passed every check of its own (`verdict.passed_key`): the partner kind its output
# names, the target's vendor, the limits its API adds to the spec's (None: none), the
# violations listed at most, its schemas' keys, and the call's field names and their values in
# the same order, every value a string or null.
PassedKey = tuple[
    str | None,
    str | None,
    CallLimits | None,
    int,
    tuple[int, ...],
    tuple[str, ...],
    tuple[str | None, ...],
]
CachedVerdict = Failed | Literal[CachedPass.PASSED]


class GateCaches:
    """The mutable memory `inspect` fills: each distinct request schema compiled once, the
    verdict on each (schemas, arguments) pair, on each item checked against the spec's item
    schemas (`not_portable`), and the inline calls that passed every check of their own. The
    fronts own one per policy in force (a new policy gets new caches) and pass it down;
    `Policy` itself stays frozen."""

    def __init__(self, max_verdicts: int = 65536, schemas: SchemaCache | None = None) -> None:
        self.schemas = SchemaCache() if schemas is None else schemas
        self.verdicts: LRU[VerdictKey, CachedVerdict] = LRU(max_verdicts)
        self.portable: PortableCache = LRU(max_verdicts)
        # Inline calls that passed: a history re-sent turn after turn skips their checks.
        self.passed_calls: LRU[PassedKey, bool] = LRU(max_verdicts)
        # Compiled once per process; asked for here, so that it is before the first request.
        self.item_schemas: ItemSchemas = item_schemas()

    @classmethod
    def for_policy(cls, policy: Policy, schemas: SchemaCache | None = None) -> GateCaches:
        return cls(policy.max_cached_verdicts, schemas)
