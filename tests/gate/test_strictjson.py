"""Strict JSON: exactly one unambiguous value, or an error naming what is wrong and where."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.gate import strictjson

ACCEPTED = [
    pytest.param('{"region":"apac"}', {"region": "apac"}, id="object"),
    pytest.param(
        " \t\r\n[1, 2.5, -3e2, true, false, null] \n",
        [1, 2.5, -300.0, True, False, None],
        id="array-whitespace",
    ),
    pytest.param('"text"', "text", id="top-level-string"),
    pytest.param("0", 0, id="top-level-number"),
    pytest.param("null", None, id="top-level-null"),
    pytest.param('[{"a":1},{"a":2}]', [{"a": 1}, {"a": 2}], id="same-key-in-sibling-objects"),
    pytest.param('{"a":{"a":{"a":1}}}', {"a": {"a": {"a": 1}}}, id="same-key-at-other-depths"),
    pytest.param('"\\ud83d\\ude00"', "\U0001f600", id="surrogate-pair"),
    pytest.param('"\\u00e9\\n"', "é\n", id="escapes"),
    pytest.param('"é"', "é", id="non-ascii"),
    pytest.param(b'{"region":"\xc3\xa9"}', {"region": "é"}, id="utf-8-bytes"),
    pytest.param("9" * 4300, int("9" * 4300), id="longest-integer"),
    pytest.param("1.5e308", 1.5e308, id="large-double"),
    pytest.param("1e-999", 0.0, id="underflow-to-zero"),
]


@pytest.mark.parametrize(("doc", "value"), ACCEPTED)
def test_accepted(doc: str | bytes, value: Any) -> None:
    assert strictjson.loads(doc) == value


# (document, start of the reason, line, column); no position where the parser cannot name one.
REJECTED = [
    pytest.param("", "Expecting value", 1, 1, id="empty"),
    pytest.param("  \n ", "Expecting value", 2, 2, id="only-whitespace"),
    pytest.param('{"a":1} x', "trailing data after the JSON value", 1, 9, id="trailing-data"),
    pytest.param('{"a":1}\n{"a":2}', "trailing data after the JSON value", 2, 1, id="two-values"),
    pytest.param("01", "trailing data after the JSON value", 1, 2, id="leading-zero"),
    pytest.param('{"a":1,}', "Expecting property name enclosed in double quotes", 1, 8, id="comma"),
    pytest.param("[1,]", "Expecting value", 1, 4, id="array-trailing-comma"),
    pytest.param("{'a':1}", "Expecting property name enclosed in double quotes", 1, 2, id="quote"),
    pytest.param('{\n  "a": tru\n}', "Expecting value", 2, 8, id="bad-literal-line-2"),
    pytest.param('{"a":\n\n  [1 2]}', "Expecting ',' delimiter", 3, 6, id="missing-comma"),
    pytest.param('"a\tb"', "Invalid control character", 1, 3, id="raw-tab-in-string"),
    pytest.param('"abc', "Unterminated string", 1, 1, id="unterminated"),
    pytest.param("\ufeff{}", "Expecting value", 1, 1, id="bom-in-text"),
    pytest.param(b"\xef\xbb\xbf{}", "byte order mark", 1, 1, id="bom-in-bytes"),
    pytest.param(b'{"a":"\xff"}', "invalid UTF-8 at byte 6", None, None, id="bad-utf-8"),
    pytest.param(b'{"a":"\xed\xa0\x80"}', "invalid UTF-8", None, None, id="utf-8-surrogate"),
    pytest.param('{"a":1,"a":2}', "duplicate key 'a'", 1, 1, id="duplicate-key"),
    pytest.param('{"a":1,"a":1}', "duplicate key 'a'", 1, 1, id="duplicate-same-value"),
    pytest.param('{"x":{"b":1,"b":2}}', "duplicate key 'b'", 1, 6, id="duplicate-nested"),
    pytest.param('[[{"x":[{"k":1,"k":1}]}]]', "duplicate key 'k'", 1, 9, id="duplicate-deep"),
    pytest.param('{"a":1,"\\u0061":2}', "duplicate key 'a'", 1, 1, id="duplicate-escaped"),
    pytest.param("NaN", "NaN is not JSON", None, None, id="nan"),
    pytest.param('{"n":Infinity}', "Infinity is not JSON", None, None, id="infinity"),
    pytest.param("[-Infinity]", "-Infinity is not JSON", None, None, id="minus-infinity"),
    pytest.param('"\\ud800"', "lone surrogate in a string", None, None, id="lone-high"),
    pytest.param('"x\\udfff"', "lone surrogate in a string", None, None, id="lone-low"),
    pytest.param('"\\ude00\\ud83d"', "lone surrogate in a string", None, None, id="swapped-pair"),
    pytest.param('{"\\ud800":1}', "lone surrogate in a string", None, None, id="lone-in-key"),
    pytest.param('[{"a":["\\udc00"]}]', "lone surrogate in a string", None, None, id="lone-deep"),
    pytest.param('"\ud800"', "lone surrogate in a string", None, None, id="lone-unescaped"),
    pytest.param("9" * 4301, "Exceeds the limit", None, None, id="integer-too-long"),
    pytest.param("1e999", "number 1e999 overflows a double", None, None, id="overflow"),
    pytest.param('{"n":[-1e400]}', "number -1e400 overflows", None, None, id="negative-overflow"),
    pytest.param("[" * 100_000 + "]" * 100_000, "nesting too deep", None, None, id="too-deep"),
]


@pytest.mark.parametrize(("doc", "reason", "line", "column"), REJECTED)
def test_rejected(doc: str | bytes, reason: str, line: int | None, column: int | None) -> None:
    with pytest.raises(strictjson.StrictJSONError) as caught:
        strictjson.loads(doc)
    error = caught.value
    assert error.reason.startswith(reason)
    assert (error.lineno, error.colno) == (line, column)
    where = f" at line {line} column {column}" if line is not None else ""
    assert str(error) == error.reason + where


def test_error_is_a_value_error() -> None:
    # Callers that only know ValueError (json.JSONDecodeError's base) still catch it.
    with pytest.raises(ValueError, match="trailing data"):
        strictjson.loads("1 2")
