"""Portable pairs: whether a function_call and its output fit the spec's own item schemas.

Any Open Responses server may check a replayed pair against the spec's `FunctionCallItemParam`
and `FunctionCallOutputItemParam` (`call_id` 1-64 characters, `name` `^[a-zA-Z0-9_-]+$` up to 64,
the field types). A pair one provider made can break them (a 94-character `call_id`) and be
refused by the next. The definitions are shipped with the package (`spec_items.json`, copied
unchanged from the spec, with every definition they `$ref`) and compiled once, as tool schemas
are, and built into a quick acceptor (`proxy.gate.acceptor`) that passes most items without
jsonschema.

What the check reads, decided where the spec leaves room:

- Fields a schema does not require (`id`, `status`, on either item) may be absent, or null;
  when present they are checked (`status` one of `in_progress`, `completed`, `incomplete`).
- An output without a `type` (or with a null, empty or false one, which the gate reads the same)
  is read with the spec's default, `function_call_output`, as the gate reads it.
- The call's `arguments` and `status` are left to the reasons checked after this one
  (`arguments_type`, `status`), which say more; the output's are all checked here.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

import orjson

from proxy.gate import acceptor, items
from proxy.gate.acceptor import Check, Steps
from proxy.gate.budget import TIMEOUTS, Allowance
from proxy.gate.items import Item
from proxy.gate.schemas import LRU, Compiled, SchemaLimits, Violation, compile_schema

SCHEMAS_FILE = "spec_items.json"
CALL_SCHEMA = "FunctionCallItemParam"
OUTPUT_SCHEMA = "FunctionCallOutputItemParam"
ROOTS = (CALL_SCHEMA, OUTPUT_SCHEMA)

# The call's fields whose violations a later reason names: `arguments_type`, `status`.
_JUDGED_LATER = frozenset({"/arguments", "/status"})
# Keywords whose value is subschemas: not a value the item could have been.
_COMBINATORS = frozenset({"allOf", "anyOf", "oneOf", "not"})
_RECORDED = frozenset({items.RECORDED_TOOLS, items.RECORDED_SCHEMAS})
# Array elements (an output's content parts) the quick acceptor may check for one request,
# about a µs each: past them, items go to jsonschema, bounded in time.
QUICK_STEPS = 100_000
# Items whose JSON is at most this long are their own cache key; longer ones, a digest.
_EXACT_KEY_BYTES = 256


# What the gate remembers of the items it checked: (schema, key of the item) -> violations.
PortableCache = LRU[tuple[str, bytes], tuple[Violation, ...]]


@dataclass(frozen=True, slots=True)
class ItemSchemas:
    """The spec's function_call and function_call_output item schemas, compiled; and their
    quick acceptors (None when a schema uses a keyword the acceptor does not evaluate)."""

    call: Compiled
    output: Compiled
    quick_call: Check | None = None
    quick_output: Check | None = None

    @classmethod
    def load(cls) -> ItemSchemas:
        text = resources.files(__package__).joinpath(SCHEMAS_FILE).read_text("utf-8")
        components = json.loads(text)["components"]

        definitions = components["schemas"]

        def compiled(name: str) -> Compiled:
            # The spec is OpenAPI 3.1: its schemas are Draft 2020-12, the default dialect. The
            # definition is the root (a `$ref` to it would be resolved on every validation).
            schema = {**definitions[name], "components": components}
            return compile_schema(schema, 0, SchemaLimits())

        def quick(name: str, schema: Compiled) -> Check | None:
            try:
                return acceptor.build(definitions[name], definitions, schema.patterns)
            except acceptor.Unsupported:
                return None

        call, output = compiled(CALL_SCHEMA), compiled(OUTPUT_SCHEMA)
        return cls(call, output, quick(CALL_SCHEMA, call), quick(OUTPUT_SCHEMA, output))

    def check_pair(
        self,
        call: Item,
        output: Item,
        cache: PortableCache | None = None,
        allowance: Allowance | None = None,
        steps: Steps | None = None,
    ) -> tuple[str, tuple[Violation, ...]] | None:
        """The first of the pair that breaks its schema, the call first: its type and its
        violations (JSON Pointers into it, and the failing keywords); None when both fit.

        An item the quick acceptor passes (spending `steps`, the request's allowance of the
        array elements it checks) is done. Any other is validated by jsonschema, some 50-150 µs an
        item: `cache` holds those verdicts (a conversation replays the same history turn after
        turn), and validating spends from `allowance`, the request's validation time, as the
        arguments' schemas do. An item still unchecked when it is spent fails
        (`validation_timeout`), and that verdict is not cached.
        """
        steps = Steps(QUICK_STEPS) if steps is None else steps
        read = read_output(output)
        for item_type, schema, quick, whole in (
            (items.FUNCTION_CALL, CALL_SCHEMA, self.quick_call, call),
            (items.FUNCTION_CALL_OUTPUT, OUTPUT_SCHEMA, self.quick_output, read),
        ):
            # The whole call: what passes it passes the call less the fields judged later.
            if quick is not None and quick(whole, steps):
                continue
            item = judged(call) if schema == CALL_SCHEMA else read
            key = verdict_key(item) if cache is not None else None
            found = cache.get((schema, key)) if cache is not None and key is not None else None
            if found is None:
                with allowance.spend() if allowance is not None else nullcontext(None) as deadline:
                    found = tuple(self.iter_violations(schema, item, deadline))
                timed_out = any(v.reason in TIMEOUTS for v in found)
                if timed_out and allowance is not None:
                    allowance.run_out()
                if cache is not None and key is not None and not timed_out:
                    cache.put((schema, key), found)
            if found:
                return item_type, found
        return None

    def quick_output_passes(self, output: Item, steps: Steps) -> bool:
        """Whether the quick acceptor passes the output as `check_pair` reads it: True only
        when `check_pair` would find nothing wrong with it (False says nothing)."""
        quick = self.quick_output
        return quick is not None and quick(read_output(output), steps)

    def iter_violations(
        self, schema: str, item: Any, deadline: float | None = None
    ) -> Iterator[Violation]:
        """How `item` breaks the schema named `schema` (CALL_SCHEMA or OUTPUT_SCHEMA) by
        `deadline` (`time.monotonic()`); of a call read with `judged`, the `required` of the
        fields it left out are not violations."""
        compiled = self.call if schema == CALL_SCHEMA else self.output
        for violation in compiled.violations(item, deadline):
            if schema == CALL_SCHEMA and violation.path in _JUDGED_LATER:
                continue
            yield replace(violation, expected=()) if violation.reason in _COMBINATORS else violation


def judged(call: Item) -> dict[str, Any]:
    """The call less the fields later reasons judge, and less the keys the ledger adds to a
    call it recorded (never sent upstream): what its verdict here depends on."""
    return {
        key: value
        for key, value in call.items()
        if "/" + key not in _JUDGED_LATER and key not in _RECORDED
    }


def read_output(output: Item) -> Item:
    """The output as the gate reads it: a missing (null, empty, false) `type` is the default."""
    if output.get("type"):
        return output
    return {**output, "type": items.FUNCTION_CALL_OUTPUT}


def verdict_key(item: Item) -> bytes | None:
    """The key of an item's verdict in a cache: its JSON, or a digest of it when long (an
    output's text); None for an item orjson cannot write (an integer beyond 64 bits)."""
    try:
        written = orjson.dumps(item, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return None
    if len(written) <= _EXACT_KEY_BYTES:
        return b"=" + written
    return b"#" + hashlib.sha256(written).digest()


@functools.cache
def item_schemas() -> ItemSchemas:
    """The spec's item schemas, read and compiled on first use, once per process (they are
    constants of the package, like a compiled pattern)."""
    return ItemSchemas.load()
