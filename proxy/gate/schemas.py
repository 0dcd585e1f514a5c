"""Tool schemas: bounded in size, compiled once each, violations as JSON Pointers."""

from __future__ import annotations

import itertools
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Generic, TypeVar

import jsonschema
import orjson
import referencing
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.protocols import Validator

from proxy.gate import budget
from proxy.gate.budget import Budget, OutOfTime
from proxy.gate.patterns import PatternError, Patterns

# Values so trivial that every usable schema validates them at once (see `check_terminates`).
_PROBES: tuple[Any, ...] = (None, True, 0, "", [], {})
# Keyword evaluations a probe may take. A `$ref` cycle exhausts the interpreter's stack in a few
# hundred; a bound in steps rather than seconds gives the same answer however busy the machine.
_PROBE_STEPS = 10_000

# An expected value larger than this as JSON is left out of a violation: an enum of thousands
# of values would make every finding (and every failure record) that large.
MAX_EXPECTED_BYTES = 1024
# Violations listed per finding by default (`limits.max_violations`); the others are counted.
MAX_VIOLATIONS = 20

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Violation:
    """One way the arguments fail their schema: where (a JSON Pointer) and which keyword;
    `message` says more where the keyword alone would not (a schema over a limit); `expected`
    holds the keyword's value as plain JSON (one value, or none where there is nothing to
    say: a timeout, an unusable schema, a value over MAX_EXPECTED_BYTES)."""

    path: str
    reason: str
    message: str | None = field(default=None, compare=False)
    expected: tuple[Any, ...] = field(default=(), compare=False)

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"path": self.path, "reason": self.reason}
        if self.expected:
            found["expected"] = self.expected[0]
        if self.message is not None:
            found["message"] = self.message
        return found


class SchemaLimitError(SchemaError):
    """A schema over one of its SchemaLimits, refused before any work is done on it."""


@dataclass(frozen=True, slots=True)
class SchemaLimits:
    """How large a tool schema may be: checked by one cheap walk before the schema is checked,
    compiled or serialised, so that no schema a client sends holds the event loop for long.

    `max_bytes`: its JSON; `max_depth`: nesting of objects and arrays; `max_subschemas`: objects
    in it (every subschema is one); `max_pattern_length`: characters of one `pattern` or
    `patternProperties` name. Raises ValueError naming a limit that is not a positive integer.
    """

    max_bytes: int = 256 * 1024
    max_depth: int = 64
    max_subschemas: int = 5_000
    max_pattern_length: int = 1_000

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_depth", "max_subschemas", "max_pattern_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"schema_limits.{name}: {value!r} is not a positive integer")

    def check(self, schema: Any) -> None:
        """Raise SchemaLimitError naming the first limit `schema` is over, all but the exact
        size of its JSON (see `check_size`)."""
        # A lower bound of the JSON's size, counted as the walk goes so that it can stop early.
        size = 0
        objects = 0
        stack: list[tuple[Any, int]] = [(schema, 0)]
        while stack:
            node, depth = stack.pop()
            if isinstance(node, dict | list):
                if depth >= self.max_depth:
                    raise self._over("max_depth", f"nested deeper than {self.max_depth}")
                # Every member takes at least a byte: counted here, before it is read.
                size += 2 + len(node)
                if size > self.max_bytes:
                    raise self._over("max_bytes", f"more than {self.max_bytes} bytes of JSON")
            if isinstance(node, dict):
                objects += 1
                if objects > self.max_subschemas:
                    raise self._over("max_subschemas", f"more than {self.max_subschemas} objects")
                for key, value in node.items():
                    size += len(key) + 3 if isinstance(key, str) else 3
                    if size > self.max_bytes:
                        raise self._over("max_bytes", f"more than {self.max_bytes} bytes of JSON")
                    if key == "pattern" and isinstance(value, str):
                        self._check_pattern(value)
                    elif key == "patternProperties" and isinstance(value, dict):
                        for name in value:
                            if isinstance(name, str):
                                self._check_pattern(name)
                    stack.append((value, depth + 1))
            elif isinstance(node, list):
                stack.extend((value, depth + 1) for value in node)
            elif isinstance(node, str):
                size += len(node) + 1
            if size > self.max_bytes:
                raise self._over("max_bytes", f"more than {self.max_bytes} bytes of JSON")

    def _check_pattern(self, pattern: str) -> None:
        if len(pattern) > self.max_pattern_length:
            raise self._over(
                "max_pattern_length",
                f"a pattern of {len(pattern)} characters, over {self.max_pattern_length}",
            )

    def check_size(self, canonical: bytes) -> None:
        """Raise SchemaLimitError when the schema's JSON is over `max_bytes`."""
        if len(canonical) > self.max_bytes:
            raise self._over("max_bytes", f"{len(canonical)} bytes of JSON, over {self.max_bytes}")

    @staticmethod
    def _over(limit: str, detail: str) -> SchemaLimitError:
        return SchemaLimitError(f"schema over schema_limits.{limit}: {detail}")


@dataclass(frozen=True, slots=True)
class Compiled:
    """A checked, compiled tool schema; `key` identifies it in the verdict cache, `patterns`
    holds its regexes compiled with their ECMA-262 meaning."""

    key: int
    validator: Validator
    patterns: Patterns = field(default_factory=Patterns, compare=False)

    def violations(self, instance: Any, deadline: float | None = None) -> tuple[Violation, ...]:
        """Every way `instance` fails the schema (see `tally`)."""
        found = ViolationTally()
        self.tally(instance, found, deadline)
        return found.listed

    def tally(self, instance: Any, found: ViolationTally, deadline: float | None = None) -> None:
        """Add every way `instance` fails the schema to `found`.

        A validation still running at `deadline` (`time.monotonic()`) stops, and fails with
        `pattern_timeout` (a regex match ran out of time) or `validation_timeout`.
        """
        with budget.spending(Budget(deadline, patterns=self.patterns)) as spent:
            try:
                for error in self.validator.iter_errors(instance):
                    found.add(_explain(error, said=found.room))
            except OutOfTime:
                pass
            except Exception:
                # A validation that cannot finish (a `$ref` that cannot be resolved, a recursion
                # without end) is a failure of the arguments, never an exception out of the gate.
                found.add([Violation("", "schema_unusable")])
        # A timeout inside `anyOf` or `not` may leave no error of its own: it still fails.
        if spent.spent is not None and not found.has_reason(spent.spent):
            found.add([Violation("", spent.spent)])


class ViolationTally:
    """Violations as they are found, each distinct one (by path and keyword) once: the first
    `limit` listed whole, every later one only counted, never rendered (its `expected` is not
    read: an enum of a kilobyte failed by thousands of values costs a count each).

    The count is exact, not a lower bound: the validation goes on to its end (or its deadline),
    since `passed` and the verdict need every path that failed.
    """

    __slots__ = ("_listed", "_seen", "limit")

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self._listed: list[Violation] = []
        self._seen: dict[Violation, None] = {}

    @property
    def room(self) -> bool:
        """Whether the next violation found is listed (and so worth rendering)."""
        return self.limit is None or len(self._listed) < self.limit

    def add(self, violations: Iterable[Violation]) -> None:
        for violation in violations:
            if violation in self._seen:
                continue
            self._seen[violation] = None
            if self.room:
                self._listed.append(violation)
            elif violation.reason in budget.TIMEOUTS and self._listed:
                # That the validation did not finish is always said (in place of the last one
                # listed): a verdict with a timeout in it is never remembered.
                self._listed[-1] = violation

    def has_reason(self, reason: str) -> bool:
        return any(v.reason == reason for v in self._seen)

    @property
    def listed(self) -> tuple[Violation, ...]:
        return tuple(self._listed)

    @property
    def seen(self) -> Iterable[Violation]:
        """Every distinct violation found, listed or only counted (without `expected`)."""
        return self._seen.keys()

    @property
    def omitted(self) -> int:
        return len(self._seen) - len(self._listed)

    def __bool__(self) -> bool:
        return bool(self._seen)


def compile_schema(schema: Any, key: int, limits: SchemaLimits | None = None) -> Compiled:
    """Check and compile a schema in the dialect of its `$schema` (default Draft 2020-12).

    Raises SchemaLimitError for a schema over `limits` (checked first, default SchemaLimits()),
    SchemaError for one that is not a valid JSON Schema (its patterns ECMA-262), or whose
    validation could not be bounded in time.
    """
    limits = SchemaLimits() if limits is None else limits
    limits.check_size(_bounded_canonical(schema, limits))
    return _compile(schema, key)


def _bounded_canonical(schema: Any, limits: SchemaLimits) -> bytes:
    """The schema's canonical JSON, once its walk found it within `limits`."""
    if not isinstance(schema, dict | bool):
        raise SchemaError(f"a schema is an object or a boolean, not {type(schema).__name__}")
    limits.check(schema)
    return _canonical(schema)


def _compile(schema: Any, key: int) -> Compiled:
    if isinstance(schema, dict) and not isinstance(schema.get("$schema", ""), str):
        raise SchemaError("$schema is not a string")
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    patterns = Patterns()
    try:
        # Typed loosely: a boolean is a schema too, and the protocol omits `format_checker`.
        checking: Any = cls
        checking.check_schema(schema, format_checker=_format_checker(cls, patterns))
    except RecursionError:
        raise SchemaError("schema nested too deep") from None
    except SchemaError as exc:
        if isinstance(exc.cause, PatternError):
            raise SchemaError(f"pattern {exc.instance!r}: {exc.cause}") from None
        raise
    why = budget.unbounded(schema, cls)
    if why is not None:
        raise SchemaError(why)
    # An empty registry: a `$ref` to a URL is never fetched (the default would fetch it, and a
    # request's `tools` would make the proxy open any URL a client names).
    # Numbers as Decimals: the arguments are read exactly, and compared with what was written.
    validator = budget.bounded(cls)(_exact_numbers(schema), registry=referencing.Registry())
    return Compiled(key, validator, patterns)


def _exact_numbers(schema: Any) -> Any:
    """`schema` with each float replaced by the Decimal of its shortest repr (its literal)."""
    if isinstance(schema, float):
        return budget.exact(schema)
    if isinstance(schema, dict):
        return {key: _exact_numbers(value) for key, value in schema.items()}
    if isinstance(schema, list):
        return [_exact_numbers(value) for value in schema]
    return schema


def _format_checker(cls: type[Validator], patterns: Patterns) -> Any:
    """The dialect's own format checker, with `regex` read as ECMA-262: each pattern the
    metaschema finds is compiled once, into `patterns`."""

    def is_regex(instance: object) -> bool:
        if isinstance(instance, str):
            patterns.get(instance)
        return True

    checker = jsonschema.FormatChecker(())
    checker.checkers = {**cls.FORMAT_CHECKER.checkers, "regex": (is_regex, PatternError)}
    return checker


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
        with budget.spending(Budget(None, steps=_PROBE_STEPS, patterns=compiled.patterns)):
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
        # By canonical JSON: the limits its walk found it within, and what it compiled to.
        self._compiled: LRU[bytes, tuple[SchemaLimits, Compiled | SchemaError]] = LRU(max_schemas)
        # Schemas may be compiled in a worker thread while the event loop looks others up.
        self._lock = threading.Lock()

    def next_key(self) -> int:
        return next(self._serial)

    def compile(self, schema: Any, limits: SchemaLimits | None = None) -> Compiled:
        """The compiled schema; raises SchemaError (remembered too) for an invalid one.

        A schema over `limits` is refused by their walk alone, before any check or compile.
        """
        limits = SchemaLimits() if limits is None else limits
        canonical, found = self._known(schema, limits)
        if found is None:
            try:
                limits.check_size(canonical)
                found = _compile(schema, self.next_key())
                check_terminates(found)
            except SchemaError as exc:
                found = exc
            with self._lock:
                self._compiled.put(canonical, (limits, found))
        if isinstance(found, SchemaError):
            raise found
        return found

    def pending(self, schema: Any, limits: SchemaLimits | None = None) -> bool:
        """Whether compiling `schema` would take work: it is within `limits` and not cached.

        Cheap: a serialisation, and the limits' walk for a schema not compiled under them;
        never a check or a compile.
        """
        try:
            _, found = self._known(schema, SchemaLimits() if limits is None else limits)
        except SchemaError:
            return False  # refused by the walk alone, at once
        return found is None

    def _known(
        self, schema: Any, limits: SchemaLimits
    ) -> tuple[bytes, Compiled | SchemaError | None]:
        """The schema's canonical JSON and what it compiled to (None: not compiled yet).

        A schema compiled after a walk under the same limits is not walked again (a client
        offers its tools' schemas with every request): the walk costs some 25 times orjson's
        serialisation, which finds it. Any other schema is walked before its canonical JSON
        is made, and refused by the walk before any check or compile.
        """
        if isinstance(schema, dict):
            try:
                seen = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
            except orjson.JSONEncodeError:
                pass  # serialised the careful way, after the walk
            else:
                with self._lock:
                    cached = self._compiled.get(seen)
                if cached is not None and cached[0] == limits:
                    return seen, cached[1]
        canonical = _bounded_canonical(schema, limits)
        with self._lock:
            cached = self._compiled.get(canonical)
        return canonical, cached[1] if cached is not None else None

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


class _Unsayable(Exception):
    """A keyword value that is not worth repeating: too large, or not a JSON value."""


def expected_value(value: Any, limit: int = MAX_EXPECTED_BYTES) -> tuple[Any, ...]:
    """`(value,)` as plain JSON (a Decimal as the number it is), or `()` when its JSON would
    be over `limit` bytes or it is no JSON value (a YAML `.inf`). Stops as soon as it is over:
    the cost is bounded by `limit`, not by the value."""
    left = [limit]

    def spend(size: int) -> None:
        left[0] -= size
        if left[0] < 0:
            raise _Unsayable

    def plain(node: Any) -> Any:
        if node is None or isinstance(node, bool):
            spend(5)
            return node
        if isinstance(node, str):
            spend(len(node) + 2)
            return node
        if isinstance(node, int):
            # Four bits a digit or more: longer than `limit` digits, whatever its value.
            spend(len(str(node)) if node.bit_length() <= 4 * limit else limit + 1)
            return node
        if isinstance(node, float | Decimal):
            if not math.isfinite(node):
                raise _Unsayable
            spend(len(str(node)))
            if isinstance(node, Decimal):
                # Written as an integer: an int, exact at any size; else the float it came from
                # (a schema's decimals are read from floats, so the float is exact).
                exponent = node.as_tuple().exponent
                return int(node) if isinstance(exponent, int) and exponent >= 0 else float(node)
            return node
        if isinstance(node, list | tuple):
            spend(2)
            return [plain(child) for child in node]
        if isinstance(node, dict):
            spend(2)
            found = {}
            for key, child in node.items():
                spend(len(str(key)) + 4)
                found[str(key)] = plain(child)
            return found
        raise _Unsayable

    try:
        return (plain(value),)
    except (_Unsayable, RecursionError):
        return ()


def _explain(error: ValidationError, *, said: bool = True) -> list[Violation]:
    """The violations one error stands for; `said`: with the keyword's value as `expected`
    (else only where and which keyword: what a violation that is only counted needs)."""
    path = list(error.absolute_path)
    keyword = str(error.validator)
    instance = error.instance
    # A timeout's keyword value (the pattern) is not what the arguments failed to be, and a
    # `false` schema has no keyword whose value could say it.
    timed_out = keyword in (budget.PATTERN_TIMEOUT, budget.VALIDATION_TIMEOUT)
    unsaid = timed_out or error.validator is None or not said
    expected = () if unsaid else expected_value(error.validator_value)
    if (
        keyword == "required"
        and isinstance(instance, dict)
        and isinstance(error.validator_value, list)
    ):
        missing = [p for p in error.validator_value if isinstance(p, str) and p not in instance]
        return [Violation(pointer([*path, p]), keyword, expected=expected) for p in missing]
    if keyword == "additionalProperties" and isinstance(instance, dict):
        extras = budget.additional_names(instance, error.schema)
        if extras:
            return [Violation(pointer([*path, p]), keyword, expected=expected) for p in extras]
    return [Violation(pointer(path), keyword, expected=expected)]
