"""A quick acceptor for simple schemas: true only when jsonschema would find no violation.

jsonschema takes some 50-150 µs for one small item and 100-500 µs for one content part of an
output (each keyword is a descent, each `$ref` a look-up): thousands of replayed pairs would
hold the event loop for a second. The spec's item schemas use a handful of keywords, so they
are written here once into Python source, one expression per schema, compiled into functions
that answer in about a µs (as fastjsonschema does; the patterns are the ECMA-262 translations
of `proxy.gate.patterns`). They answer `True` (valid) or `False` (not proven valid: jsonschema
then finds the violations, or finds none, and it is what the gate reports), so they may err
only towards `False`; a keyword they do not know makes the schema refused when built
(`Unsupported`), and the gate uses jsonschema alone.

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
_TYPES = {
    "string": "isinstance({v}, str)",
    "object": "isinstance({v}, dict)",
    "array": "isinstance({v}, list)",
    "null": "{v} is None",
    "boolean": "isinstance({v}, bool)",
}
_REF = "#/components/schemas/"


# What a property that is not there reads as: no JSON value is this object.
_ABSENT = object()


class Unsupported(ValueError):
    """A schema with a keyword (or a keyword value) the acceptor does not evaluate."""


class Steps:
    """What is left of one request's array elements to check in the acceptor."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left


def build(schema: Any, definitions: Mapping[str, Any], patterns: Patterns) -> Check:
    """The acceptor of `schema`, whose `$ref`s name `#/components/schemas/<name>` in
    `definitions`; raises Unsupported for a schema it cannot evaluate."""
    writer = _Writer(definitions, patterns)
    root = writer.function(schema)
    namespace = dict(writer.constants)
    exec(compile("\n".join(writer.functions), "<acceptor>", "exec"), namespace)
    found: Check = namespace[root]
    return found


def _all_items(values: list[Any], check: Check, steps: Steps) -> bool:
    for value in values:
        steps.left -= 1
        if steps.left < 0 or not check(value, steps):
            return False
    return True


class _Writer:
    """The source of one schema's acceptor: a function per schema that a `$ref` or `items`
    names, an expression for every other; values it needs are constants by name."""

    def __init__(self, definitions: Mapping[str, Any], patterns: Patterns) -> None:
        self.definitions = definitions
        self.patterns = patterns
        self.constants: dict[str, Any] = {"_all_items": _all_items, "_absent": _ABSENT}
        self.locals = 0  # the property values read so far, each a local `_v<n>`
        self.functions: list[str] = []
        self.refs: dict[str, str] = {}
        self.building: set[str] = set()

    def constant(self, value: Any) -> str:
        name = f"_c{len(self.constants)}"
        self.constants[name] = value
        return name

    def function(self, schema: Any) -> str:
        index = len(self.functions)
        self.functions.append("")
        name = f"_f{index}"
        self.functions[index] = (
            f"def {name}(v, steps):\n    return {self.expression(schema, 'v')}\n"
        )
        return name

    def ref(self, target: Any) -> str:
        if not isinstance(target, str) or not target.startswith(_REF):
            raise Unsupported(f"$ref {target!r}")
        name = target.removeprefix(_REF)
        if name not in self.definitions:
            raise Unsupported(f"$ref {target!r}: no such definition")
        if name in self.building:
            # Bounding the work of a recursive schema takes more than steps per element.
            raise Unsupported(f"$ref {target!r}: a cycle")
        if name not in self.refs:
            self.building.add(name)
            self.refs[name] = self.function(self.definitions[name])
            self.building.discard(name)
        return self.refs[name]

    def expression(self, schema: Any, v: str) -> str:
        """An expression true only when the value `v` (a name) is valid.

        A schema of one `type` is checked for it first; its other keywords then assert what
        they assert of that type without asking the type again."""
        if schema is True:
            return "True"
        if not isinstance(schema, dict):
            raise Unsupported(f"schema {schema!r}")
        parts = []
        known = None
        if "type" in schema:
            parts.append(self.keyword("type", schema["type"], v, None))
            known = schema["type"]
        parts += [
            self.keyword(k, value, v, known)
            for k, value in schema.items()
            if k != "type" and not _ignored(k)
        ]
        return "(" + " and ".join(parts) + ")" if parts else "True"

    def keyword(self, name: str, value: Any, v: str, known: str | None) -> str:
        """The expression of one keyword of a schema whose `type` is `known` (checked before
        it, so that a keyword of that type's values needs no guard); None: any type."""

        def unless_not(json_type: str, python_type: str, then: str) -> str:
            # A keyword of one type's values holds for a value of any other type.
            return then if known == json_type else f"(not isinstance({v}, {python_type}) or {then})"

        if name == "$ref":
            return f"{self.ref(value)}({v}, steps)"
        if name == "type":
            if not isinstance(value, str) or value not in _TYPES:
                raise Unsupported(f"type {value!r}")
            return _TYPES[value].format(v=v)
        if name == "enum":
            # Strings only: jsonschema's equality differs from Python's for 1, 1.0 and True.
            if not isinstance(value, list) or not all(isinstance(e, str) for e in value):
                raise Unsupported(f"enum {value!r}")
            listed = f"{v} in {self.constant(frozenset(value))}"
            return f"({listed})" if known == "string" else f"(isinstance({v}, str) and {listed})"
        if name in ("maxLength", "minLength"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise Unsupported(f"{name} {value!r}")
            compared = "<=" if name == "maxLength" else ">="
            return unless_not("string", "str", f"len({v}) {compared} {value:d}")
        if name == "pattern":
            if not isinstance(value, str):
                raise Unsupported(f"pattern {value!r}")
            compiled = self.constant(self.patterns.get(value))
            return unless_not("string", "str", f"{compiled}.search({v}) is not None")
        if name == "required":
            if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
                raise Unsupported(f"required {value!r}")
            present = " and ".join(f"{p!r} in {v}" for p in value) or "True"
            return unless_not("object", "dict", f"({present})")
        if name == "properties":
            if not isinstance(value, dict):
                raise Unsupported(f"properties {value!r}")
            each = []
            for p, s in value.items():
                # Each property read once, into a local of its own.
                local = f"_v{self.locals}"
                self.locals += 1
                checked = self.expression(s, local)
                each.append(f"(({local} := {v}.get({p!r}, _absent)) is _absent or {checked})")
            return unless_not("object", "dict", f"({' and '.join(each) or 'True'})")
        if name == "items":
            item = self.function(value)
            return unless_not("array", "list", f"_all_items({v}, {item}, steps)")
        if name in ("anyOf", "allOf", "oneOf"):
            if not isinstance(value, list) or not value:
                raise Unsupported(f"{name} {value!r}")
            branches = [self.expression(s, v) for s in value]
            if name == "anyOf":
                return "(" + " or ".join(branches) + ")"
            if name == "allOf":
                return "(" + " and ".join(branches) + ")"
            # Exactly one: a second match (or an answer cut short by the steps) is not proven.
            return f"(({' + '.join(branches)}) == 1 and steps.left >= 0)"
        raise Unsupported(f"keyword {name!r}")


def _ignored(name: str) -> bool:
    return name in _ANNOTATIONS or name.startswith("x-") or name == "components"
