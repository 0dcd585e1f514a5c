"""A quick acceptor for simple schemas: true only when jsonschema would find no violation.

jsonschema takes some 50-150 µs for one small item and 100-500 µs for one content part of an
output (each keyword is a descent, each `$ref` a look-up): thousands of replayed pairs would
hold the event loop for a second. The spec's item schemas use a handful of keywords, so they
are built here once into plain functions that answer in a few µs. They answer `True` (valid)
or `False` (not proven valid: jsonschema then finds the violations, or finds none, and it is
what the gate reports), so they may err only towards `False`; a keyword they do not know makes
the schema refused when built (`Unsupported`), and the gate uses jsonschema alone.

A schema with a `$ref` cycle is refused, so the work for one value is bounded by the schema's
size, but for the elements of its arrays: each element spends a step of a `Steps`
allowance, and once it is spent the acceptor answers `False` (the work goes to jsonschema,
bounded in time). A bound in steps gives the same verdict however busy the machine is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from proxy.gate.patterns import Patterns

Check = Callable[[Any, "Steps"], bool]

# Keywords that assert nothing (OpenAPI's `discriminator` and `example` are annotations in 3.1).
_ANNOTATIONS = frozenset(
    {"description", "title", "default", "example", "examples", "discriminator", "$comment"}
)
_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
}


class Unsupported(ValueError):
    """A schema with a keyword (or a keyword value) the acceptor does not evaluate."""


class Steps:
    """What is left of one request's keyword evaluations in the acceptor."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left


def build(schema: Any, definitions: Mapping[str, Any], patterns: Patterns) -> Check:
    """The acceptor of `schema`, whose `$ref`s name `#/components/schemas/<name>` in
    `definitions`; raises Unsupported for a schema it cannot evaluate."""
    built: dict[str, Check] = {}
    building: set[str] = set()

    def ref(target: Any) -> Check:
        if not isinstance(target, str) or not target.startswith("#/components/schemas/"):
            raise Unsupported(f"$ref {target!r}")
        name = target.removeprefix("#/components/schemas/")
        if name not in definitions:
            raise Unsupported(f"$ref {target!r}: no such definition")
        if name in building:
            # Bounding the work of a recursive schema takes more than steps per element.
            raise Unsupported(f"$ref {target!r}: a cycle")
        if name not in built:
            building.add(name)
            built[name] = node(definitions[name])
            building.discard(name)
        return built[name]

    def node(sub: Any) -> Check:
        if sub is True:
            return _always
        if not isinstance(sub, dict):
            raise Unsupported(f"schema {sub!r}")
        checks = tuple(keyword(k, v) for k, v in sub.items() if not _ignored(k))
        if not checks:
            return _always
        if len(checks) == 1:
            return checks[0]

        # Loops rather than all() or any(), here and below: a generator per keyword doubles
        # the cost.
        def check(value: Any, steps: Steps) -> bool:
            for one in checks:  # noqa: SIM110
                if not one(value, steps):
                    return False
            return True

        return check

    def keyword(name: str, value: Any) -> Check:
        if name == "$ref":
            return ref(value)
        if name == "type":
            if not isinstance(value, str) or value not in _TYPES:
                raise Unsupported(f"type {value!r}")
            is_type = _TYPES[value]
            return lambda v, _: is_type(v)
        if name == "enum":
            # Strings only: jsonschema's equality differs from Python's for 1, 1.0 and True.
            if not isinstance(value, list) or not all(isinstance(e, str) for e in value):
                raise Unsupported(f"enum {value!r}")
            allowed = frozenset(value)
            return lambda v, _: isinstance(v, str) and v in allowed
        if name in ("maxLength", "minLength"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise Unsupported(f"{name} {value!r}")
            if name == "maxLength":
                return lambda v, _: not isinstance(v, str) or len(v) <= value
            return lambda v, _: not isinstance(v, str) or len(v) >= value
        if name == "pattern":
            if not isinstance(value, str):
                raise Unsupported(f"pattern {value!r}")
            compiled = patterns.get(value)
            return lambda v, _: not isinstance(v, str) or compiled.search(v) is not None
        if name == "required":
            if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
                raise Unsupported(f"required {value!r}")
            return lambda v, _: not isinstance(v, dict) or all(p in v for p in value)
        if name == "properties":
            if not isinstance(value, dict):
                raise Unsupported(f"properties {value!r}")
            properties = tuple((p, node(s)) for p, s in value.items())

            def each_property(v: Any, steps: Steps) -> bool:
                if isinstance(v, dict):
                    for p, one in properties:
                        if p in v and not one(v[p], steps):
                            return False
                return True

            return each_property
        if name == "items":
            item = node(value)

            def each_item(v: Any, steps: Steps) -> bool:
                if isinstance(v, list):
                    for e in v:
                        steps.left -= 1
                        if steps.left < 0 or not item(e, steps):
                            return False
                return True

            return each_item
        if name in ("anyOf", "allOf", "oneOf"):
            if not isinstance(value, list) or not value:
                raise Unsupported(f"{name} {value!r}")
            branches = tuple(node(s) for s in value)

            def any_of(v: Any, steps: Steps) -> bool:
                for branch in branches:  # noqa: SIM110
                    if branch(v, steps):
                        return True
                return False

            def all_of(v: Any, steps: Steps) -> bool:
                for branch in branches:  # noqa: SIM110
                    if not branch(v, steps):
                        return False
                return True

            def one_of(v: Any, steps: Steps) -> bool:
                # A second match (or an answer cut short by the steps) is not proven valid.
                matched = 0
                for branch in branches:
                    matched += branch(v, steps)
                return matched == 1 and steps.left >= 0

            return {"anyOf": any_of, "allOf": all_of, "oneOf": one_of}[name]
        raise Unsupported(f"keyword {name!r}")

    return node(schema)


def _ignored(name: str) -> bool:
    return name in _ANNOTATIONS or name.startswith("x-") or name == "components"


def _always(value: Any, steps: Steps) -> bool:
    return True
