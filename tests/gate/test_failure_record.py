"""The failure record a rewritten output carries, and the expected values every finding names."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.gate import items
from proxy.gate.policy import Policy
from proxy.gate.schemas import MAX_EXPECTED_BYTES, expected_value
from proxy.gate.verdict import inspect
from tests.builders import LOOKUP_SCHEMA, call, output, request, tool

BIG = 2**70
WIDE_ENUM = [f"region-{n:04d}" for n in range(200)]
SCHEMAS: dict[str, Any] = {
    "lookup_order": LOOKUP_SCHEMA,
    "numbers": {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "maximum": 100},
            "x": {"maximum": 2.5},
            "big": {"maximum": BIG},
            "kind": {"const": "refund"},
            "region": {"enum": WIDE_ENUM},
        },
    },
    "either": {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
    "nothing_else": {"properties": {"x": False}},
}
TOOLS = [tool(schema, name) for name, schema in SCHEMAS.items()]


def record_of(name: str, arguments: Any) -> dict[str, Any]:
    """The failure record the rewritten output of one call carries, checked against the
    finding the audit log and a 400 would show."""
    body = request(call("c", json.dumps(arguments), name), output("c"), tools=TOOLS)
    verdict = inspect(body, Policy(action="rewrite"))
    assert verdict.outcome == "rewrite"
    assert verdict.input is not None
    [finding] = verdict.findings
    [rewritten] = [item for item in verdict.input if items.is_output(item)]
    record: dict[str, Any] = json.loads(rewritten["output"])
    found = finding.as_dict()
    assert (found["pass"], found["fail"]) == (record["pass"], record["fail"])
    return record


# (tool, arguments, pass, fail, error)
RECORDS = [
    pytest.param(
        "lookup_order",
        {"order_id": "1042", "include_lines": True, "refund": True},
        ["include_lines"],
        [
            {"path": "/order_id", "reason": "pattern", "expected": "^[A-Z]-\\d{4}$"},
            {"path": "/refund", "reason": "additionalProperties", "expected": False},
        ],
        "order_id failed schema: expected ^[A-Z]-\\d{4}$; "
        "refund is not allowed (additionalProperties: false)",
        id="pattern-and-extra",
    ),
    pytest.param(
        "lookup_order",
        {"order_id": "A-1042"},
        ["order_id"],
        [
            {
                "path": "/include_lines",
                "reason": "required",
                "expected": ["order_id", "include_lines"],
            }
        ],
        "include_lines is required",
        id="required",
    ),
    pytest.param(
        "numbers",
        {"n": 1.5, "kind": "sale"},
        [],
        [
            {"path": "/n", "reason": "type", "expected": "integer"},
            {"path": "/kind", "reason": "const", "expected": "refund"},
        ],
        "n failed schema: expected type integer; kind failed schema: expected refund",
        id="type-and-const",
    ),
    pytest.param(
        "numbers",
        {"n": 101, "x": 2.6, "kind": "refund"},
        ["kind"],
        [
            {"path": "/n", "reason": "maximum", "expected": 100},
            {"path": "/x", "reason": "maximum", "expected": 2.5},
        ],
        "n failed schema: expected maximum 100; x failed schema: expected maximum 2.5",
        id="maximum-as-json-numbers",
    ),
    pytest.param(
        "numbers",
        {"big": BIG + 1},
        [],
        [{"path": "/big", "reason": "maximum", "expected": BIG}],
        f"big failed schema: expected maximum {BIG}",
        id="integer-beyond-64-bits-exact",
    ),
    pytest.param(
        "numbers",
        {"region": "mars", "n": 3},
        ["n"],
        [{"path": "/region", "reason": "enum"}],
        "region failed schema (enum)",
        id="enum-too-large-to-repeat",
    ),
    pytest.param(
        "either",
        {"c": 1},
        [],
        [{"path": "", "reason": "anyOf", "expected": [{"required": ["a"]}, {"required": ["b"]}]}],
        'the arguments failed schema: expected anyOf [{"required": ["a"]}, {"required": ["b"]}]',
        id="root-failure-passes-nothing",
    ),
    pytest.param(
        "nothing_else",
        {"x": 1, "y": 2},
        # jsonschema places a `false` subschema's error at the root, keyword None.
        [],
        [{"path": "", "reason": "None"}],
        "the arguments failed schema (None)",
        id="false-schema-expects-nothing-it-could-name",
    ),
]


@pytest.mark.parametrize(("name", "arguments", "passed", "fail", "error"), RECORDS)
def test_failure_record(
    name: str, arguments: Any, passed: list[str], fail: list[dict[str, Any]], error: str
) -> None:
    assert record_of(name, arguments) == {
        "success": False,
        "execute": False,
        "check": name,
        "reason": "arguments_schema",
        "pass": passed,
        "fail": fail,
        "error": error,
    }


@pytest.mark.parametrize(
    ("arguments", "reason", "error"),
    [
        pytest.param(
            "{",
            "arguments_parse",
            "arguments are not one strict JSON value: Expecting property name enclosed in double "
            "quotes at line 1 column 2",
        ),
        pytest.param(
            "{}",
            "unknown_tool",
            "no schema for tool mystery: pin one under tools: or send it in the request's tools",
        ),
    ],
)
def test_failure_record_of_other_reasons(arguments: str, reason: str, error: str) -> None:
    body = request(call("c", arguments, "mystery"), output("c"), tools=[])
    verdict = inspect(body, Policy(action="rewrite"))
    assert verdict.input is not None
    assert json.loads(verdict.input[1]["output"]) == {
        "success": False,
        "execute": False,
        "check": "mystery",
        "reason": reason,
        "pass": [],
        "fail": [],
        "error": error,
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(["a", 1, None, True], (["a", 1, None, True],), id="plain"),
        pytest.param({"k": [1.5]}, ({"k": [1.5]},), id="nested"),
        pytest.param(float("inf"), (), id="not-json"),
        pytest.param("x" * MAX_EXPECTED_BYTES, (), id="over-the-limit"),
        pytest.param(10 ** (5 * MAX_EXPECTED_BYTES), (), id="huge-integer"),
        pytest.param(object(), (), id="not-a-json-value"),
    ],
)
def test_expected_value(value: Any, expected: tuple[Any, ...]) -> None:
    assert expected_value(value) == expected
