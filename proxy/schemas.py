"""Tool schemas: compiled once each, violations as JSON Pointers, validation bounded in time."""

from __future__ import annotations

import itertools
import json
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import jsonschema
import orjson
import referencing
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.protocols import Validator

from proxy import budget
from proxy.budget import Budget, OutOfTime

# Values so trivial that every usable schema validates them at once (see `check_terminates`).
_PROBES: tuple[Any, ...] = (None, True, 0, "", [], {})
# Keyword evaluations a probe may take. A `$ref` cycle exhausts the interpreter's stack in a few
# hundred; a bound in steps rather than seconds gives the same answer however busy the machine.
_PROBE_STEPS = 10_000

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Violation:
    """One way the arguments fail their schema: where (a JSON Pointer) and which keyword."""

    path: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Compiled:
    """A checked, compiled tool schema; `key` identifies it in the verdict cache."""

    key: int
    validator: Validator

    def violations(self, instance: Any, deadline: float | None = None) -> tuple[Violation, ...]:
        """Every way `instance` fails the schema.

        A validation still running at `deadline` (`time.monotonic()`) stops, and fails with
        `pattern_timeout` (a regex match ran out of time) or `validation_timeout`.
        """
        found: dict[Violation, None] = {}
        with budget.spending(Budget(deadline)) as spent:
            try:
                for error in self.validator.iter_errors(instance):
                    found.update(dict.fromkeys(_explain(error)))
            except OutOfTime:
                pass
            except Exception:
                # A validation that cannot finish (a `$ref` that cannot be resolved, a recursion
                # without end) is a failure of the arguments, never an exception out of the gate.
                found[Violation("", "schema_unusable")] = None
        # A timeout inside `anyOf` or `not` may leave no error of its own: it still fails.
        if spent.spent is not None and not any(v.reason == spent.spent for v in found):
            found[Violation("", spent.spent)] = None
        return tuple(found)


def compile_schema(schema: Any, key: int) -> Compiled:
    """Check and compile a schema in the dialect of its `$schema` (default Draft 2020-12).

    Raises SchemaError for a schema that is not a valid JSON Schema, or whose validation
    could not be bounded in time.
    """
    if not isinstance(schema, dict | bool):
        raise SchemaError(f"a schema is an object or a boolean, not {type(schema).__name__}")
    if isinstance(schema, dict) and not isinstance(schema.get("$schema", ""), str):
        raise SchemaError("$schema is not a string")
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)  # type: ignore[arg-type]  # a boolean is a schema too
    except RecursionError:
        raise SchemaError("schema nested too deep") from None
    why = budget.unbounded(schema, cls)
    if why is not None:
        raise SchemaError(why)
    # An empty registry: a `$ref` to a URL is never fetched (the default would fetch it, and a
    # request's `tools` would make the proxy open any URL a client names).
    return Compiled(key, budget.bounded(cls)(schema, registry=referencing.Registry()))


class UnusableSchema(SchemaError):
    """A valid JSON Schema that no call can pass: its `$ref`s never reach a value."""


def check_terminates(compiled: Compiled) -> None:
    """Raise UnusableSchema when validating a trivial value recurses without end.

    Such a schema has a `$ref` cycle that never reaches a value (`{"$ref": "#"}`): no call can
    ever pass it. A request's schema like that fails its calls (`schema_unusable`) before any
    of them is validated, so the answer never depends on how fast validation runs; a pinned
    one is refused when the config is loaded.
    """
    for value in _PROBES:
        with budget.spending(Budget(None, steps=_PROBE_STEPS)):
            try:
                for _ in compiled.validator.iter_errors(value):
                    pass
            except RecursionError:
                raise UnusableSchema(
                    "a $ref cycle: the schema refers to itself without end"
                ) from None
            except Exception:
                # Out of steps, or a `$ref` that cannot be resolved: found out at validation.
                continue


class LRU(Generic[K, V]):
    """A dict bounded in entries that forgets the least recently used first."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._data: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


class SchemaCache:
    """Compiles each distinct request schema once, keyed by its canonical JSON."""

    def __init__(self, max_schemas: int = 1024) -> None:
        self._serial = itertools.count(1)
        self._compiled: LRU[bytes, Compiled | SchemaError] = LRU(max_schemas)

    def next_key(self) -> int:
        return next(self._serial)

    def compile(self, schema: Any) -> Compiled:
        """The compiled schema; raises SchemaError (remembered too) for an invalid one."""
        canonical = _canonical(schema)
        found = self._compiled.get(canonical)
        if found is None:
            try:
                found = compile_schema(schema, self.next_key())
                check_terminates(found)
            except SchemaError as exc:
                found = exc
            self._compiled.put(canonical, found)
        if isinstance(found, SchemaError):
            raise found
        return found

    def __len__(self) -> int:
        return len(self._compiled)


def _canonical(schema: Any) -> bytes:
    """The schema's JSON with sorted keys: equal for equal schemas, distinct for distinct ones
    (both serialisers write JSON that reads back to the value it came from)."""
    try:
        return orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        pass  # an integer beyond 64 bits, or nesting deeper than orjson writes
    try:
        text = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        raise SchemaError("schema cannot be serialised") from None
    return text.encode("utf-8", "surrogatepass")


def pointer(parts: Iterable[Any]) -> str:
    """RFC 6901 JSON Pointer for a path of keys and indexes."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _explain(error: ValidationError) -> list[Violation]:
    path = list(error.absolute_path)
    keyword = str(error.validator)
    instance = error.instance
    if (
        keyword == "required"
        and isinstance(instance, dict)
        and isinstance(error.validator_value, list)
    ):
        missing = [p for p in error.validator_value if isinstance(p, str) and p not in instance]
        return [Violation(pointer([*path, p]), keyword) for p in missing]
    if keyword == "additionalProperties" and isinstance(instance, dict):
        extras = budget.additional_names(instance, error.schema)
        if extras:
            return [Violation(pointer([*path, p]), keyword) for p in extras]
    return [Violation(pointer(path), keyword)]
