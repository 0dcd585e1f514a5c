"""JSON Schema validation under a time budget: regexes with a timeout, keywords that stop,
numbers compared exactly (Decimal, as written)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from decimal import Decimal
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

from proxy.gate.patterns import Patterns

PATTERN_TIMEOUT = "pattern_timeout"
VALIDATION_TIMEOUT = "validation_timeout"
# How a validation can run out of time; a verdict with one of them is never cached.
TIMEOUTS = frozenset({PATTERN_TIMEOUT, VALIDATION_TIMEOUT})

Keyword = Callable[[Any, Any, Any, Any], Any]


class OutOfTime(Exception):
    """Raised through jsonschema to stop a validation whose budget is spent."""


class Budget:
    """What one validation may spend: time until `deadline` (`time.monotonic()`, None = no
    bound), and at most `steps` keyword evaluations (None = no bound).

    `spent` says how it ran out: `pattern_timeout` (a regex match) or `validation_timeout`.
    A bound in steps, unlike one in time, ends in the same place on every run. `patterns` holds
    the schema's patterns, compiled with their ECMA-262 meaning (see proxy.gate.patterns).
    """

    __slots__ = ("deadline", "patterns", "spent", "steps")

    def __init__(
        self,
        deadline: float | None,
        steps: int | None = None,
        patterns: Patterns | None = None,
    ) -> None:
        self.deadline = deadline
        self.steps = steps
        self.patterns = Patterns() if patterns is None else patterns
        self.spent: str | None = None

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def expire(self, reason: str) -> None:
        if self.spent is None:
            self.spent = reason

    def check(self) -> None:
        """Count one step; raise OutOfTime once the budget is spent."""
        if self.steps is not None:
            self.steps -= 1
            if self.steps < 0:
                self.expire(VALIDATION_TIMEOUT)
        remaining = self.remaining()
        if self.spent is not None or (remaining is not None and remaining <= 0):
            self.expire(VALIDATION_TIMEOUT)
            raise OutOfTime


class Allowance:
    """What is left of one request's validation time; each validation spends from it."""

    def __init__(self, seconds: float) -> None:
        self.left = seconds

    @contextmanager
    def spend(self) -> Iterator[float]:
        """The deadline (`time.monotonic()`) of one validation; its time comes off what is left."""
        started = time.monotonic()
        try:
            yield started + self.left
        finally:
            self.left -= time.monotonic() - started

    def run_out(self) -> None:
        """A validation stopped at its deadline: nothing is left for the request's others. A
        regex's own timer may stop it a little before the deadline by this clock, which would
        otherwise leave a sliver that the next validation starts on and times out in."""
        self.left = min(self.left, 0.0)


# The budget of the validation running in this context. Validation is synchronous, so a
# context holds at most one; the keywords below find it here because jsonschema passes them
# nothing of their own.
_current: ContextVar[Budget | None] = ContextVar("validation_budget", default=None)


@contextmanager
def spending(budget: Budget) -> Iterator[Budget]:
    """Run the validations inside the block under `budget`."""
    token = _current.set(budget)
    try:
        yield budget
    finally:
        _current.reset(token)


def search(pattern: str, string: str) -> bool | None:
    """Whether the ECMA-262 `pattern` matches anywhere in `string`; None when the budget ran out
    first. Raises PatternError for a pattern that cannot be matched with that meaning.

    The `regex` module's matcher takes a timeout (it overshoots by up to about twice the time
    left); the standard library's cannot be stopped once a pattern starts to backtrack.
    """
    budget = _current.get()
    timeout = None if budget is None else budget.remaining()
    if budget is not None and (budget.spent is not None or (timeout is not None and timeout <= 0)):
        budget.expire(PATTERN_TIMEOUT)
        return None
    # Compiled when the schema was checked; else (a pattern a `$ref` reaches outside the places
    # where the metaschema expects a schema) now, within the same bounds.
    compiled = (Patterns() if budget is None else budget.patterns).get(pattern)
    try:
        return compiled.search(string, timeout=timeout) is not None
    except TimeoutError:
        if budget is not None:
            budget.expire(PATTERN_TIMEOUT)
        return None


def additional_names(instance: Mapping[str, Any], schema: Any) -> list[str]:
    """The property names of `instance` that neither `properties` nor `patternProperties` cover.

    A name whose match ran out of time counts as covered: the validation fails regardless.
    """
    if not isinstance(schema, Mapping):
        return []
    properties = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    return [
        name
        for name in instance
        if name not in properties and not any(search(p, name) is not False for p in patterns)
    ]


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string"):
        found = search(pattern, instance)
        if found is None:
            yield ValidationError(
                f"matching {pattern!r} ran out of time", validator=PATTERN_TIMEOUT
            )
        elif not found:
            # Not the instance in the message: it may be megabytes.
            yield ValidationError(f"the string does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for name, value in instance.items():
            found = search(pattern, name)
            if found is None:
                yield ValidationError(
                    f"matching {pattern!r} ran out of time", validator=PATTERN_TIMEOUT, path=[name]
                )
                return
            if found:
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    extras = additional_names(instance, schema)
    if validator.is_type(additional, "object"):
        for name in extras:
            yield from validator.descend(instance[name], additional, path=name)
    elif not additional and extras:
        yield ValidationError(f"additional properties are not allowed: {extras[:10]!r}")


def _unique_items(
    validator: Any, unique: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    # jsonschema compares unsortable items (objects) pairwise: quadratic in the array's length.
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    for item in instance:
        key = _canonical(item)
        if key in seen:
            yield ValidationError("the array has non-unique items")
            return
        seen.add(key)


def _multiple_of(
    validator: Any, divisor: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    # jsonschema divides in floating point (and cannot divide a Decimal by a float).
    if not validator.is_type(instance, "number") or not validator.is_type(divisor, "number"):
        return
    if divisor > 0 and not is_multiple(instance, divisor):
        yield ValidationError(f"{instance} is not a multiple of {divisor}")


def exact(number: int | float | Decimal) -> Decimal:
    """A JSON number as a Decimal; a float by its shortest decimal (the literal it came from)."""
    return Decimal(repr(number)) if isinstance(number, float) else Decimal(number)


def is_multiple(number: int | float | Decimal, divisor: int | float | Decimal) -> bool:
    """Whether `number` is an integer multiple of `divisor` (> 0), exactly, in time linear in
    their digits whatever their exponents (1e999999999 is a multiple of 0.01)."""
    _, digits, exponent = exact(number).as_tuple()
    _, divisor_digits, divisor_exponent = exact(divisor).as_tuple()
    if not isinstance(exponent, int) or not isinstance(divisor_exponent, int):
        return False  # NaN or infinity: strict JSON has neither
    a = int("".join(map(str, digits)) or "0")
    b = int("".join(map(str, divisor_digits)) or "0")
    if a == 0:
        return True
    if exponent >= divisor_exponent:
        # a * 10^e / b is an integer iff b divides a * 10^e; pow keeps the power modulo b.
        return a * pow(10, exponent - divisor_exponent, b) % b == 0
    shift = divisor_exponent - exponent
    # a / (b * 10^shift) with a shorter than 10^shift is a nonzero fraction.
    return shift <= len(digits) and a % (b * 10**shift) == 0


def _is_integer(checker: Any, instance: Any) -> bool:
    """JSON Schema's integer from draft 6 on: a number with no fraction (1.0 is one)."""
    if isinstance(instance, bool):
        return False
    if isinstance(instance, Decimal):
        return instance == instance.to_integral_value()
    return isinstance(instance, int) or (isinstance(instance, float) and instance.is_integer())


def _canonical(value: Any) -> Any:
    """A hashable value equal for JSON values jsonschema deems equal (1 == 1.0, True != 1)."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, int | float | Decimal):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, list):
        return ("array", tuple(_canonical(v) for v in value))
    if isinstance(value, dict):
        return ("object", frozenset((k, _canonical(v)) for k, v in value.items()))
    return ("other", id(value))


_OWN: dict[str, Keyword] = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
    "multipleOf": _multiple_of,
    "divisibleBy": _multiple_of,  # draft 3's name
}


def _checked(keyword: Keyword) -> Keyword:
    def checked(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        budget = _current.get()
        if budget is not None:
            budget.check()
        return keyword(validator, value, instance, schema)

    return checked


@functools.cache
def bounded(cls: type[Validator]) -> type[Validator]:
    """`cls` with every keyword checking the budget first, and regexes matched under it."""
    keywords: dict[str, Keyword] = {
        name: _checked(_OWN.get(name) or keyword) for name, keyword in cls.VALIDATORS.items()
    }
    types = cls.TYPE_CHECKER
    if types.is_type(1.0, "integer"):  # draft 6 on; drafts 3 and 4 say 1.0 is not an integer
        types = types.redefine("integer", _is_integer)
    extend: Callable[..., type[Validator]] = jsonschema.validators.extend
    return extend(cls, keywords, type_checker=types)


def unbounded(schema: Any, cls: type[Validator]) -> str | None:
    """Why validating against `schema` could not be bounded in time, or None.

    jsonschema's `unevaluatedProperties` matches `patternProperties` with the standard
    library's regexes, which no timeout stops.
    """
    if "unevaluatedProperties" not in cls.VALIDATORS:
        return None
    found: set[str] = set()
    stack = [schema]
    while stack and len(found) < 2:
        node = stack.pop()
        if isinstance(node, dict):
            found.update(k for k in ("unevaluatedProperties", "patternProperties") if k in node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    if len(found) == 2:
        return "unevaluatedProperties beside patternProperties cannot be validated in bounded time"
    return None
