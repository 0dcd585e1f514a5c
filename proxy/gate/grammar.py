"""A custom tool's `input`, checked against the tool's `format`: any text, or a grammar.

A custom tool is declared as `{"type": "custom", "name", "format"}`; its `format` is
`{"type": "text"}` (any string, as is a tool without one) or `{"type": "grammar", "syntax":
"regex" | "lark", "definition"}`. A regex is ECMA-262, matched whole by the gate's own pattern
engine within the request's validation time; a Lark grammar is parsed by `lark`'s LALR(1)
parser, bounded in the size of the grammar and of the input (Lark's parse cannot be stopped
once started, so its time is bounded by what it is given). A grammar that is not LALR(1) fails
closed: Earley parsing is cubic at worst, and a client's ambiguous grammar over 256 characters
held the event loop for 12 s.
"""

from __future__ import annotations

import functools
import time
from contextlib import nullcontext
from typing import Any

import lark
from lark.exceptions import GrammarError, LarkError

from proxy.gate.budget import PATTERN_TIMEOUT, Allowance
from proxy.gate.findings import Failed
from proxy.gate.patterns import PatternError, Patterns
from proxy.gate.reasons import Reason
from proxy.gate.schemas import Violation

# A grammar's definition past this many characters is not compiled: building Lark's LALR(1)
# tables grows about as the square of the grammar (13 KB of chained rules took 0.33 s, 40 KB
# about 3 s), on the event loop, for a grammar each request may vary.
MAX_DEFINITION = 8_192
# The input a Lark grammar parses at most: LALR(1) is linear, about 1 µs a character, so this
# holds the event loop for tens of milliseconds at most.
MAX_LARK_INPUT = 65_536


def custom_formats(tools: Any) -> list[tuple[str, Any]]:
    """(name, format) of each custom tool in a request's `tools` (or an item's), a custom tool
    inside a `namespace` tool named `<namespace>/<name>` as its calls name it."""
    found: list[tuple[str, Any]] = []
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "namespace" and isinstance(tool.get("name"), str):
            found.extend((f"{tool['name']}/{n}", f) for n, f in custom_formats(tool.get("tools")))
        elif tool.get("type") == "custom" and isinstance(tool.get("name"), str):
            found.append((tool["name"], tool.get("format")))
    return found


def check_input(
    value: Any, formats: list[Any], allowance: Allowance | None = None
) -> Failed | None:
    """None when `value` is a string every declared `format` of its tool accepts; else
    `unknown_tool` (no tool declares it) or `input_grammar`, its violation naming the grammar's
    syntax (`regex`, `lark`) or why the grammar could not judge (`invalid_grammar`,
    `pattern_timeout`, `input_too_long`)."""
    if not formats:
        return Failed(Reason.UNKNOWN_TOOL)
    if not isinstance(value, str):
        return Failed(Reason.INPUT_GRAMMAR, (Violation("", "type", "input is not a string"),))
    for declared in formats:
        violation = _violation(value, declared, allowance)
        if violation is not None:
            return Failed(Reason.INPUT_GRAMMAR, (violation,))
    return None


def _violation(value: str, declared: Any, allowance: Allowance | None) -> Violation | None:
    if not isinstance(declared, dict) or declared.get("type", "text") == "text":
        return None
    syntax, definition = declared.get("syntax"), declared.get("definition")
    if declared.get("type") != "grammar" or not isinstance(definition, str):
        return Violation("", "invalid_grammar", "a format is text, or a grammar with a definition")
    if len(definition) > MAX_DEFINITION:
        return Violation("", "invalid_grammar", f"definition over {MAX_DEFINITION} characters")
    if syntax == "regex":
        return _regex(value, definition, allowance)
    if syntax == "lark":
        return _lark(value, definition)
    return Violation("", "invalid_grammar", f"syntax {syntax!r} is neither regex nor lark")


def _regex(value: str, definition: str, allowance: Allowance | None) -> Violation | None:
    try:
        pattern = Patterns().get(definition)
    except PatternError as exc:
        return Violation("", "invalid_grammar", str(exc))
    spending = allowance.spend() if allowance is not None else nullcontext(None)
    with spending as deadline:
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            matched = pattern.fullmatch(value, timeout=timeout) is not None
        except TimeoutError:
            if allowance is not None:
                allowance.run_out()
            return Violation("", PATTERN_TIMEOUT)
    return None if matched else Violation("", "regex", "the input does not match the pattern")


def _lark(value: str, definition: str) -> Violation | None:
    try:
        parser = _parser(definition)
    except GrammarError as exc:
        return Violation(
            "",
            "invalid_grammar",
            f"not an LALR(1) grammar, the only kind parsed: {_first_line(exc)}",
        )
    except Exception as exc:  # a client's grammar: Lark raises more than LarkError on some
        return Violation("", "invalid_grammar", _first_line(exc))
    if len(value) > MAX_LARK_INPUT:
        return Violation("", "input_too_long", f"over {MAX_LARK_INPUT} characters")
    try:
        parser.parse(value)
    except LarkError as exc:
        return Violation("", "lark", _first_line(exc))
    except RecursionError:
        return Violation("", "input_too_long", "nested too deep to parse")
    return None


@functools.lru_cache(maxsize=64)
def _parser(definition: str) -> lark.Lark:
    """The grammar compiled once, as LALR(1); GrammarError when it is not one."""
    return lark.Lark(definition, parser="lalr")


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
