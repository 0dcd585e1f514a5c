"""A call's arguments: strict JSON, then every schema of its tool."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from typing import Any

from jsonschema.exceptions import SchemaError

from proxy.gate import items, strictjson
from proxy.gate.budget import TIMEOUTS, Allowance
from proxy.gate.caches import PASSED, GateCaches
from proxy.gate.findings import Failed
from proxy.gate.policy import Policy
from proxy.gate.reasons import Reason
from proxy.gate.schemas import (
    MAX_VIOLATIONS,
    Compiled,
    SchemaLimitError,
    UnusableSchema,
    Violation,
    ViolationTally,
    pointer,
)


def check_arguments(
    arguments: str,
    schemas: list[Compiled | SchemaError],
    allowance: Allowance | None = None,
    max_violations: int | None = None,
) -> Failed | None:
    """None when the arguments are one strict JSON value that every schema of their tool
    accepts; else `arguments_parse`, `unknown_tool`, or `arguments_schema` with its violations,
    the top-level properties that passed, and how many violations past `max_violations` were
    counted and not listed."""
    try:
        instance = strictjson.loads(arguments, exact=True)
    except strictjson.StrictJSONError:
        return Failed(Reason.ARGUMENTS_PARSE)
    if not schemas:
        return Failed(Reason.UNKNOWN_TOOL)
    found = ViolationTally(max_violations)
    with allowance.spend() if allowance is not None else nullcontext(None) as deadline:
        for schema in schemas:
            if isinstance(schema, UnusableSchema):
                found.add([Violation("", "schema_unusable")])
            elif isinstance(schema, SchemaLimitError):
                found.add([Violation("", "invalid_schema", schema.message)])
            elif isinstance(schema, SchemaError):
                found.add([Violation("", "invalid_schema")])
            else:
                schema.tally(instance, found, deadline)
    if allowance is not None and any(found.has_reason(r) for r in TIMEOUTS):
        allowance.run_out()
    if found:
        return Failed(
            Reason.ARGUMENTS_SCHEMA, found.listed, passed(instance, found.seen), found.omitted
        )
    return None


def schemas_key(schemas: Sequence[Compiled | SchemaError]) -> tuple[int, ...]:
    """The key verdicts against these schemas are remembered under (one that could not be
    compiled counts as 0)."""
    return tuple(s.key if isinstance(s, Compiled) else 0 for s in schemas)


def judged_arguments(
    arguments: str,
    schemas: list[Compiled | SchemaError],
    key: tuple[int, ...],
    caches: GateCaches,
    allowance: Allowance,
    max_violations: int = MAX_VIOLATIONS,
) -> Failed | None:
    """`check_arguments`, remembered in `caches` under (`key`, `max_violations`, arguments): a
    replay and the call a model emitted find each other's verdict."""
    cached = caches.verdicts.get((key, max_violations, arguments))
    if cached is PASSED:
        return None
    if cached is not None:
        return cached
    failed = check_arguments(arguments, schemas, allowance, max_violations)
    # A timeout says how busy this request was, not what the arguments are worth.
    if failed is None or not any(v.reason in TIMEOUTS for v in failed.fail):
        caches.verdicts.put((key, max_violations, arguments), PASSED if failed is None else failed)
    return failed


def passed(instance: Any, violations: Iterable[Violation]) -> tuple[str, ...]:
    """The top-level properties of the arguments that no violation is at or under. None when a
    violation is at the root (`anyOf`, a timeout, an unusable schema): it says nothing of which
    property was right."""
    if not isinstance(instance, dict):
        return ()
    failed: set[str] = set()
    for violation in violations:
        if not violation.path:
            return ()
        # The first reference token, still escaped: compared with each name's own pointer.
        failed.add(violation.path.split("/", 2)[1])
    return tuple(name for name in instance if pointer([name])[1:] not in failed)


def pending_schemas(
    body: Any,
    policy: Policy,
    caches: GateCaches,
    declared: list[tuple[str, Any]] | None = None,
) -> list[Any]:
    """The request schemas `inspect` may compile for this body that are not compiled yet
    (`declared`: the body's `items.declared_tools`, if known).

    Compiling one can take long (a schema within the limits may hold thousands of
    subschemas), so the fronts hand these to `compile_schemas` off the event loop first.
    """
    if not isinstance(body, dict) or not isinstance(body.get("input"), list):
        return []
    called = set()
    for item in body["input"]:
        if isinstance(item, dict):
            # `tool_name` only for a call that names a namespace: this runs once per item.
            name = items.tool_name(item) if items.NAMESPACE in item else item.get("name")
            if isinstance(name, str):
                called.add(name)
    return [
        {} if parameters is None else parameters
        for name, parameters in (items.declared_tools(body) if declared is None else declared)
        if name in called
        and policy.pin_for(name) is None
        and caches.schemas.pending({} if parameters is None else parameters, policy.schema_limits)
    ]


def compile_schemas(schemas: Sequence[Any], policy: Policy, caches: GateCaches) -> None:
    """Compile `schemas` into `caches` (where `inspect` finds them); safe to run in a
    worker thread. An invalid schema is remembered as such, and found again by `inspect`."""
    for schema in schemas:
        try:
            caches.schemas.compile(schema, policy.schema_limits)
        except SchemaError:
            continue
