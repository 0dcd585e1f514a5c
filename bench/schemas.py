"""What bounds schema work: regress against translated `regex` patterns, and compile times.

Run from the repository root: `python bench/schemas.py`. Every loop is bounded in count and
in time; nothing here is asserted, it is read (the numbers behind proxy/gate/patterns.py and the
defaults of gate.schema_limits).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

import regress
from jsonschema.exceptions import SchemaError

from proxy.gate.patterns import compile_pattern
from proxy.gate.schemas import SchemaLimits, compile_schema

# One regress match longer than this ends its row: the next length would take twice as long.
STOP_S = 1.0


def timed(run: Callable[[], Any]) -> tuple[float, str]:
    started = time.perf_counter()
    try:
        run()
        outcome = "ok"
    except (SchemaError, TimeoutError) as exc:
        outcome = f"{type(exc).__name__}: {str(exc)[:60]}"
    return time.perf_counter() - started, outcome


def backtracking() -> None:
    """Catastrophic patterns: regress has no timeout; the translated pattern stops at 0.1 s."""
    sys.stdout.write("pattern            n   regress_s  regex_s (timeout 0.1 s)\n")
    for pattern in ("^(a+)+$", "^(a|a)*$"):
        ecma = regress.Regex(pattern, "u")
        translated = compile_pattern(pattern)
        for n in range(16, 31, 2):
            subject = "a" * n + "!"
            ecma_s, _ = timed(functools.partial(ecma.find, subject))
            regex_s, _ = timed(functools.partial(translated.search, subject, timeout=0.1))
            sys.stdout.write(f"{pattern:16s} {n:3d} {ecma_s:10.3f} {regex_s:9.3f}\n")
            if ecma_s > STOP_S:
                break


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {}
    for _ in range(depth - 1):
        schema = {"if": schema}
    return schema


def schemas() -> None:
    """Compile time of schemas refused by the limits' walk, and of the worst within them."""
    limits = SchemaLimits()
    # Each pattern takes about 1.15 bytes of JSON per character (its backslashes are escaped).
    per_pattern = limits.max_bytes // (limits.max_pattern_length * 13 // 10)
    cases: list[tuple[str, Any]] = [
        (
            "200k properties (refused)",
            {"properties": {f"p{i}": {"type": "string"} for i in range(200_000)}},
        ),
        ("3.5 MB pattern (refused)", {"properties": {"q": {"pattern": "a" * 3_500_000}}}),
        (
            f"{limits.max_subschemas - 2} anyOf objects",
            {"anyOf": [{"minLength": i} for i in range(limits.max_subschemas - 2)]},
        ),
        (
            f"{per_pattern} patterns of {limits.max_pattern_length} characters",
            {
                "properties": {
                    # distinct, so that none is compiled once for all
                    f"p{i}": {
                        "pattern": "[a-z]\\d" * (limits.max_pattern_length // 7 - 1) + f"{i:07d}"
                    }
                    for i in range(per_pattern)
                }
            },
        ),
        ("one pattern unrolling to 9,999 nodes", {"pattern": "a{10000}"}),
        (
            "patterns unrolling to 10,001 (refused)",
            {"anyOf": [{"pattern": "a{5001}"}, {"pattern": "a{5002}"}]},
        ),
        (f"{limits.max_depth} deep", nested(limits.max_depth)),
    ]
    sys.stdout.write("\nschema                                       compile_s  outcome\n")
    for name, schema in cases:
        seconds, outcome = timed(functools.partial(compile_schema, schema, 1, limits))
        sys.stdout.write(f"{name:44s} {seconds:9.3f}  {outcome}\n")


if __name__ == "__main__":
    backtracking()
    schemas()
