"""Schema patterns mean what ECMA-262 says, pinned or sent, and stay bounded in time."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.gate.patterns import MAX_UNROLLED, PatternError, compile_pattern
from proxy.gate.policy import Policy
from proxy.gate.reasons import Outcome
from proxy.gate.verdict import Verdict, inspect
from proxy.running.config_file import parse_config
from proxy.settings import ConfigError

# (pattern, string, whether ECMA-262 with the `u` flag finds a match)
MEANING = [
    pytest.param(r"^[a-z0-9_/]+$", "etc/passwd", True, id="dollar-at-the-end"),
    pytest.param(r"^[a-z0-9_/]+$", "etc/passwd\n", False, id="dollar-not-before-a-final-newline"),
    pytest.param(r"^a$", "a\n", False, id="dollar-not-before-newline-short"),
    pytest.param(r"^\d{4}$", "2024", True, id="digit-ascii"),
    pytest.param(r"^\d{4}$", "\u0662\u0660\u0662\u0664", False, id="digit-not-arabic-indic"),
    pytest.param(r"^\d$", "\uff11", False, id="digit-not-fullwidth"),
    pytest.param(r"^\D$", "\u0661", True, id="non-digit-arabic-indic"),
    pytest.param(r"^.$", "x", True, id="dot-a-letter"),
    pytest.param(r"^.$", "\n", False, id="dot-not-newline"),
    pytest.param(r"^.$", "\r", False, id="dot-not-carriage-return"),
    pytest.param(r"^.$", "\u2028", False, id="dot-not-line-separator"),
    pytest.param(r"^.$", "\u2029", False, id="dot-not-paragraph-separator"),
    pytest.param(r"^.$", "\x85", True, id="dot-nel-is-no-line-terminator"),
    pytest.param(r"^.$", "\U0001f600", True, id="dot-one-code-point"),
    pytest.param(r"^\w+$", "caf\u00e9", False, id="word-ascii-only"),
    pytest.param(r"^\W$", "\u00e9", True, id="non-word-accented"),
    pytest.param(r"\bfoo\b", "\u00e9foo\u00e9", True, id="boundary-ascii-words"),
    pytest.param(r"\bfoo\b", "afoo", False, id="boundary-inside-a-word"),
    pytest.param(r"\Bfoo", "afoo", True, id="not-boundary"),
    pytest.param(r"^\s$", "\ufeff", True, id="space-bom"),
    pytest.param(r"^\s$", "\u00a0", True, id="space-nbsp"),
    pytest.param(r"^\s$", "\x1c", False, id="space-not-file-separator"),
    pytest.param(r"^\s$", "\x85", False, id="space-not-nel"),
    pytest.param(r"^[^\s]$", "\x85", True, id="negated-space-class-nel"),
    pytest.param(r"^[\d-]+$", "12-3", True, id="class-digit-and-dash"),
    pytest.param(r"^[\D]$", "5", False, id="class-non-digit"),
    pytest.param(r"^[^]$", "\n", True, id="class-anything"),
    pytest.param(r"[]", "", False, id="class-nothing"),
    pytest.param(r"^[\b]$", "\b", True, id="class-backspace"),
    pytest.param(r"^[\-a]+$", "-a", True, id="class-escaped-dash"),
    pytest.param(r"^(?<year>\d{4})-\d\d$", "2024-01", True, id="named-group"),
    pytest.param(r"^\p{Lu}+$", "\u00c9T\u00c9", True, id="property-uppercase"),
    pytest.param(r"^\P{L}$", "1", True, id="property-negated"),
    pytest.param(r"^[\p{L}\d_]+$", "\u00e91_", True, id="property-in-a-class"),
    pytest.param(r"^\p{Script=Greek}$", "\u03b1", True, id="property-script"),
    pytest.param(r"^\u{1F600}$", "\U0001f600", True, id="braced-escape"),
    pytest.param(r"^\ud83d\ude00$", "\U0001f600", True, id="surrogate-pair-escape"),
    pytest.param(r"^\x41\cJ\0$", "A\n\x00", True, id="hex-control-null-escapes"),
    pytest.param(r"(?<=a)b", "ab", True, id="lookbehind"),
    pytest.param(r"(?<!a)b", "ab", False, id="negative-lookbehind"),
    pytest.param(r"^a{2,3}$", "aaaa", False, id="counted-repeat"),
    pytest.param(r"^\/\.\*$", "/.*", True, id="identity-escapes"),
]


@pytest.mark.parametrize(("pattern", "string", "matches"), MEANING)
def test_pattern_has_its_ecma_meaning(pattern: str, string: str, matches: bool) -> None:
    assert (compile_pattern(pattern).search(string) is not None) is matches


def replayed(arguments: Any, schema: Any, *, pinned: bool) -> Verdict:
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "lookup",
        "status": "completed",
        "arguments": json.dumps(arguments),
    }
    body = {
        "tools": [] if pinned else [{"type": "function", "name": "lookup", "parameters": schema}],
        "input": [call, {"type": "function_call_output", "call_id": "call_1", "output": "x"}],
    }
    return inspect(body, Policy(tools={"lookup": schema} if pinned else {}))


# What the findings of the review showed: patterns read as Python's let these through.
GATED = [
    pytest.param(
        {"properties": {"path": {"pattern": "^[a-z0-9_/]+$"}}},
        {"path": "etc/passwd\n"},
        [("/path", "pattern")],
        id="dollar-before-newline",
    ),
    pytest.param(
        {"properties": {"pin": {"pattern": r"^\d{4}$"}}},
        {"pin": "\u0661\u0662\u0663\u0664"},
        [("/pin", "pattern")],
        id="arabic-indic-digits",
    ),
    pytest.param(
        {"properties": {"line": {"pattern": "^.+$"}}},
        {"line": "a\u2028b"},
        [("/line", "pattern")],
        id="dot-across-line-separator",
    ),
    pytest.param(
        {"properties": {"line": {"pattern": "^.+$"}}},
        {"line": "a\rb"},
        [("/line", "pattern")],
        id="dot-across-carriage-return",
    ),
    pytest.param(
        {"patternProperties": {r"^\d+$": {"type": "integer"}}},
        {"\u0663": "three"},
        [],
        id="pattern-properties-arabic-digit-not-matched",
    ),
    pytest.param(
        {"patternProperties": {r"^\d+$": {"type": "integer"}}},
        {"3": "three"},
        [("/3", "type")],
        id="pattern-properties-ascii-digit-matched",
    ),
    pytest.param(
        {"additionalProperties": False, "patternProperties": {"^[a-z]+$": {}}},
        {"name\n": 1},
        [("/name\n", "additionalProperties")],
        id="additional-properties-name-with-newline",
    ),
    pytest.param(
        {"properties": {"path": {"pattern": "^[a-z0-9_/]+$"}}},
        {"path": "etc/passwd"},
        [],
        id="clean-passes",
    ),
]


@pytest.mark.parametrize("pinned", [False, True], ids=["request", "pinned"])
@pytest.mark.parametrize(("schema", "arguments", "fail"), GATED)
def test_gate_reads_patterns_as_ecma(
    schema: Any, arguments: Any, fail: list[tuple[str, str]], pinned: bool
) -> None:
    verdict = replayed(arguments, schema, pinned=pinned)
    if not fail:
        assert verdict == Verdict(Outcome.FORWARD)
        return
    [finding] = verdict.findings
    assert finding.reason == "arguments_schema"
    assert [(v.path, v.reason) for v in finding.fail] == fail


INVALID = [
    pytest.param("(?P<x>a)", "not an ECMA-262 pattern", id="python-named-group"),
    pytest.param(r"\-", "not an ECMA-262 pattern", id="identity-escape-outside-u"),
    pytest.param(r"\z", "not an ECMA-262 pattern", id="python-end-anchor"),
    pytest.param("a{2,1}", "not an ECMA-262 pattern", id="repeat-out-of-order"),
    pytest.param("(", "not an ECMA-262 pattern", id="unbalanced"),
    pytest.param(r"\p{Greek}", "not an ECMA-262 pattern", id="script-without-its-key"),
    pytest.param(r"(a)\1", "backreferences are not supported", id="backreference"),
    pytest.param(r"\k<x>(?<x>a)", "backreferences are not supported", id="named-backreference"),
    pytest.param("(?i:a)", "group modifiers are not supported", id="modifier"),
    pytest.param(f"a{{{MAX_UNROLLED + 1}}}", "repeat count over", id="repeat-too-large"),
    pytest.param("(?:a{100}){101}", "unroll to over 10000", id="nested-repeats-unroll"),
    pytest.param(r"\S{1000}", "unroll to over 10000", id="class-repeats-unroll"),
]


@pytest.mark.parametrize(("pattern", "message"), INVALID)
def test_pattern_refused(pattern: str, message: str) -> None:
    with pytest.raises(PatternError, match=message):
        compile_pattern(pattern)


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param({"properties": {"q": {"pattern": "(?P<x>a)"}}}, id="pattern"),
        pytest.param({"patternProperties": {"(?P<x>a)": {}}}, id="pattern-properties"),
        pytest.param({"properties": {"q": {"pattern": "a{100001}"}}}, id="pattern-unrolls"),
        pytest.param(
            # Each within the bound, together over it: `regex` would hold 14 MB per 100,000.
            {"properties": {f"q{i}": {"pattern": f"a{{{4000 + i}}}"} for i in range(3)}},
            id="patterns-unroll-together",
        ),
    ],
)
def test_schema_with_a_pattern_ecma_refuses_is_invalid(schema: Any) -> None:
    verdict = replayed({"q": "a"}, schema, pinned=False)
    [finding] = verdict.findings
    assert [(v.path, v.reason) for v in finding.fail] == [("", "invalid_schema")]
    with pytest.raises(ConfigError, match=r"^tools\.lookup: not a valid JSON Schema: pattern "):
        parse_config({"tools": {"lookup": schema}})


def test_patterns_within_the_bound_together_are_used() -> None:
    schema = {"properties": {f"q{i}": {"pattern": f"^a{{{3000 + i}}}$"} for i in range(3)}}
    assert replayed({"q0": "a" * 3000}, schema, pinned=False) == Verdict(Outcome.FORWARD)


def test_pattern_length_is_bounded_before_any_engine_runs() -> None:
    with pytest.raises(PatternError, match="pattern of 1001 characters is over 1000"):
        compile_pattern("(" * 1001, max_length=1000)
