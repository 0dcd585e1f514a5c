"""Numbers in `arguments` are compared with their schema exactly, as written, never as doubles."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from proxy.gate import strictjson
from proxy.gate.budget import is_multiple
from proxy.gate.policy import Policy
from proxy.gate.reasons import Outcome
from proxy.gate.verdict import Verdict, inspect

DRAFT4 = "http://json-schema.org/draft-04/schema#"

# (schema of `n`, the arguments as the call wrote them, the violations expected)
NUMBERS = [
    pytest.param({"maximum": 100}, '{"n": 100.00000000000000001}', ["maximum"], id="max-just-over"),
    pytest.param({"maximum": 100}, '{"n": 100.0}', [], id="max-equal-float"),
    pytest.param({"maximum": 100}, '{"n": 1e2}', [], id="max-equal-exponent"),
    pytest.param({"maximum": 100}, '{"n": 100.000000000000000000}', [], id="max-equal-zeros"),
    pytest.param(
        {"maximum": 9007199254740992},
        '{"n": 9007199254740992.9}',
        ["maximum"],
        id="max-beyond-double-precision",
    ),
    pytest.param({"maximum": 9007199254740993}, '{"n": 9007199254740994}', ["maximum"], id="int"),
    pytest.param({"exclusiveMaximum": 100}, '{"n": 99.99999999999999999}', [], id="exmax-under"),
    pytest.param({"exclusiveMaximum": 100}, '{"n": 100.0}', ["exclusiveMaximum"], id="exmax-eq"),
    pytest.param({"minimum": 0.1}, '{"n": 0.09999999999999999999}', ["minimum"], id="min-under"),
    pytest.param({"minimum": 0.1}, '{"n": 0.1}', [], id="min-equal-float-literal"),
    pytest.param({"exclusiveMinimum": 0}, '{"n": 1e-400}', [], id="exmin-tiny-positive"),
    pytest.param({"exclusiveMinimum": 0}, '{"n": -0.0}', ["exclusiveMinimum"], id="exmin-zero"),
    pytest.param({"multipleOf": 0.01}, '{"n": 0.07}', [], id="multiple-of-cent"),
    pytest.param({"multipleOf": 0.1}, '{"n": 0.3}', [], id="multiple-of-tenth"),
    pytest.param({"multipleOf": 0.01}, '{"n": 0.071}', ["multipleOf"], id="not-multiple"),
    pytest.param({"multipleOf": 0.01}, '{"n": 1e300}', [], id="multiple-huge-exponent"),
    pytest.param({"multipleOf": 3}, '{"n": 9.0}', [], id="multiple-integral-float"),
    pytest.param({"multipleOf": 3}, '{"n": 1e-300}', ["multipleOf"], id="multiple-tiny"),
    pytest.param({"multipleOf": 2.5}, '{"n": -7.5}', [], id="multiple-negative"),
    pytest.param({"type": "integer"}, '{"n": 1.0}', [], id="integer-one-point-zero"),
    pytest.param({"type": "integer"}, '{"n": 1e2}', [], id="integer-exponent"),
    pytest.param({"type": "integer"}, '{"n": 1.5}', ["type"], id="integer-fraction"),
    pytest.param(
        {"type": "integer"}, '{"n": 1.0000000000000000001}', ["type"], id="integer-tiny-fraction"
    ),
    pytest.param(
        {"$schema": DRAFT4, "type": "integer"}, '{"n": 1.0}', ["type"], id="draft4-integer"
    ),
    pytest.param({"type": "number"}, '{"n": 1.5}', [], id="number"),
    pytest.param({"type": "number"}, '{"n": true}', ["type"], id="bool-is-no-number"),
    pytest.param({"const": 1}, '{"n": 1.0}', [], id="const-one-is-one-point-zero"),
    pytest.param({"const": 0.1}, '{"n": 0.1}', [], id="const-float-literal"),
    pytest.param({"const": 0.1}, '{"n": 0.10000000000000001}', ["const"], id="const-just-off"),
    pytest.param({"enum": [1, 2]}, '{"n": 2.0}', [], id="enum-integral-float"),
    pytest.param({"enum": [1]}, '{"n": 1.00000000000000001}', ["enum"], id="enum-just-off"),
    pytest.param({"enum": [True]}, '{"n": 1}', ["enum"], id="enum-one-is-not-true"),
    pytest.param({"uniqueItems": True}, '{"n": [1, 1.0]}', ["uniqueItems"], id="unique-one"),
    pytest.param(
        {"uniqueItems": True}, '{"n": [1, 1.00000000000000001]}', [], id="unique-just-off"
    ),
]


@pytest.mark.parametrize(("schema", "arguments", "fail"), NUMBERS)
@pytest.mark.parametrize("pinned", [False, True], ids=["request", "pinned"])
def test_numbers_are_compared_exactly(
    schema: dict[str, Any], arguments: str, fail: list[str], pinned: bool
) -> None:
    dialect = {k: v for k, v in schema.items() if k == "$schema"}
    keywords = {k: v for k, v in schema.items() if k != "$schema"}
    parameters = {**dialect, "type": "object", "properties": {"n": keywords}}
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "pay",
        "status": "completed",
        "arguments": arguments,
    }
    body = {
        "tools": [] if pinned else [{"type": "function", "name": "pay", "parameters": parameters}],
        "input": [call, {"type": "function_call_output", "call_id": "call_1", "output": "x"}],
    }
    verdict = inspect(body, Policy(tools={"pay": parameters} if pinned else {}))
    if not fail:
        assert verdict == Verdict(Outcome.FORWARD)
        return
    [finding] = verdict.findings
    assert finding.reason == "arguments_schema"
    assert [(v.path, v.reason) for v in finding.fail] == [("/n", reason) for reason in fail]


@pytest.mark.parametrize(
    ("number", "divisor", "expected"),
    [
        pytest.param(Decimal("1e999999999"), Decimal("0.01"), True, id="huge-exponent"),
        pytest.param(Decimal("1e-999999999"), 1, False, id="tiny-exponent"),
        pytest.param(Decimal("0"), Decimal("0.3"), True, id="zero"),
        pytest.param(10, 4, False, id="integers"),
        pytest.param(Decimal("4.5"), 1.5, True, id="float-divisor"),
    ],
)
def test_multiple_of_is_exact_at_any_exponent(
    number: Decimal | int, divisor: Decimal | float | int, expected: bool
) -> None:
    assert is_multiple(number, divisor) is expected


@pytest.mark.parametrize(
    ("doc", "value"),
    [
        pytest.param("100.00000000000000001", Decimal("100.00000000000000001"), id="fraction"),
        pytest.param("1E+2", Decimal("1E+2"), id="exponent"),
        pytest.param("12", 12, id="integer-stays-int"),
    ],
)
def test_exact_parse(doc: str, value: Any) -> None:
    parsed = strictjson.loads(doc, exact=True)
    assert (type(parsed), parsed) == (type(value), value)


@pytest.mark.parametrize("doc", ["1e400", "-1e400", "1." + "0" * 5000])
def test_exact_parse_keeps_the_bounds(doc: str) -> None:
    with pytest.raises(strictjson.StrictJSONError):
        strictjson.loads(doc, exact=True)
