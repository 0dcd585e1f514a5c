"""Arguments checked wherever there are arguments (vendor openai): an `mcp_call`'s against the
`input_schema` an `mcp_list_tools` item of the context lists, a custom tool call's `input`
against its tool's `format` (text, a regex, a Lark grammar)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.gate.findings import message as sentence
from proxy.gate.policy import Policy
from proxy.gate.verdict import inspect, rejection
from tests.builders import message, request
from tests.gate.ledger_double import Ledger

SCHEMA = {
    "type": "object",
    "properties": {"region": {"enum": ["apac", "emea"]}},
    "required": ["region"],
    "additionalProperties": False,
}
LISTED = {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "crm",
          "tools": [{"name": "sales", "input_schema": SCHEMA}]}  # fmt: skip


def mcp_call(arguments: Any = '{"region": "apac"}', **extra: Any) -> dict[str, Any]:
    return {"type": "mcp_call", "id": "mcp_1", "server_label": "crm", "name": "sales",
            "arguments": arguments, "output": "42"} | extra  # fmt: skip


def findings(
    *input_items: Any, ledger: Ledger | None = None, tools: Any = (), **policy: Any
) -> list[tuple[Any, str]]:
    body = request(message("hi"), *input_items, tools=list(tools))
    verdict = inspect(body, Policy(vendor="openai", **policy), ledger or Ledger())
    return [(f.index, f.reason) for f in verdict.findings]


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        pytest.param("inline", [], id="inline"),
        pytest.param("referenced", [], id="behind-a-reference"),
        pytest.param("chain", [], id="in-the-recorded-chain"),
        pytest.param("nowhere", [(1, "unknown_tool")], id="no-list"),
    ],
)
def test_an_mcp_call_is_judged_by_its_list_wherever_it_is(where: str, expected: list[Any]) -> None:
    items: list[Any] = [mcp_call()]
    ledger = Ledger()
    if where == "inline":
        items.insert(0, LISTED)
    elif where == "referenced":
        items.insert(0, {"type": "item_reference", "id": "mcpl_1"})
        ledger = Ledger(stored={"mcpl_1": LISTED})
    elif where == "chain":
        ledger = Ledger([LISTED])
    found = findings(*items, ledger=ledger)
    assert found == [(len(items), reason) for _, reason in expected]


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        pytest.param('{"region": "mars"}', "arguments_schema", id="schema"),
        pytest.param('{"region": "apac",}', "arguments_parse", id="parse"),
        pytest.param('{"region": "apac", "region": "emea"}', "arguments_parse", id="duplicate"),
        pytest.param({"region": "apac"}, "arguments_type", id="not-a-string"),
    ],
)
def test_an_mcp_call_failing_its_list(arguments: Any, reason: str) -> None:
    assert findings(LISTED, mcp_call(arguments)) == [(2, reason)]


def test_the_violation_is_at_its_path_and_said() -> None:
    body = request(message("hi"), LISTED, mcp_call('{"region": "mars"}'), tools=[])
    verdict = inspect(body, Policy(vendor="openai"), Ledger())
    [finding] = rejection(verdict)["error"]["findings"]
    assert finding["reason"] == "arguments_schema"
    assert [v["path"] for v in finding["fail"]] == ["/region"]
    assert rejection(verdict)["error"]["message"].startswith("input[2]: the mcp_call failed")


def test_a_tool_of_another_server_is_unknown() -> None:
    other = mcp_call(server_label="billing")
    [(index, reason)] = findings(LISTED, other)
    assert (index, reason) == (2, "unknown_tool")
    verdict = inspect(request(LISTED, other, tools=[]), Policy(vendor="openai"), Ledger())
    assert "mcp_list_tools" in sentence(verdict.findings[0])


@pytest.mark.parametrize("pin", ["crm/sales", "sales"])
def test_a_pin_wins_over_the_list(pin: str) -> None:
    pinned = {pin: {"type": "object", "properties": {"region": {"const": "mars"}}}}
    body = request(LISTED, mcp_call('{"region": "mars"}'), tools=[])
    assert inspect(body, Policy(vendor="openai", tools=pinned), Ledger()).findings == ()


def test_an_approval_request_is_judged_by_the_list_too() -> None:
    asked = mcp_call('{"region": "mars"}', type="mcp_approval_request", id="apr_1")
    del asked["output"]
    answered = {"type": "mcp_approval_response", "approval_request_id": "apr_1", "approve": True}
    assert findings(LISTED, asked, answered) == [(3, "arguments_schema")]


def test_without_a_vendor_an_mcp_call_passes() -> None:
    body = request(mcp_call('{"region": "mars"}'), tools=[])
    assert inspect(body, Policy(), Ledger()).findings == ()


LARK = """
start: "add " NUMBER ("," NUMBER)*
%import common.NUMBER
"""
FORMATS = {
    "text": {"type": "text"},
    "regex": {"type": "grammar", "syntax": "regex", "definition": "^add \\d+(,\\d+)*$"},
    "lark": {"type": "grammar", "syntax": "lark", "definition": LARK},
}


def custom_pair(tool_input: Any, name: str = "calc") -> tuple[dict[str, Any], dict[str, Any]]:
    return (
        {"type": "custom_tool_call", "call_id": "c1", "name": name, "input": tool_input},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "3"},
    )


def custom_tool(fmt: str) -> dict[str, Any]:
    return {"type": "custom", "name": "calc", "format": FORMATS[fmt]}


@pytest.mark.parametrize(
    ("fmt", "tool_input", "expected"),
    [
        pytest.param("text", "anything at all", [], id="text"),
        pytest.param("regex", "add 1,2", [], id="regex-passes"),
        pytest.param("regex", "add 1,x", [(2, "input_grammar")], id="regex-breaks"),
        # ECMA-262: `\d` is ASCII only, as in the gate's schemas.
        pytest.param("regex", "add \u0661", [(2, "input_grammar")], id="regex-ecma-digit"),
        pytest.param("lark", "add 1,2", [], id="lark-passes"),
        pytest.param("lark", "add 1,,2", [(2, "input_grammar")], id="lark-breaks"),
        pytest.param("lark", 12, [(2, "input_grammar")], id="not-a-string"),
    ],
)
def test_a_custom_tool_call_is_judged_by_its_format(
    fmt: str, tool_input: Any, expected: list[Any]
) -> None:
    assert findings(*custom_pair(tool_input), tools=[custom_tool(fmt)]) == expected


def test_an_undeclared_custom_tool_is_unknown() -> None:
    assert findings(*custom_pair("x", "other"), tools=[custom_tool("text")]) == [
        (2, "unknown_tool")
    ]


def test_a_custom_tool_in_a_namespace_or_added_by_an_item() -> None:
    namespace = {"type": "namespace", "name": "ops", "tools": [custom_tool("regex")]}
    call, output = custom_pair("add 1,x")
    assert findings(call | {"namespace": "ops"}, output, tools=[namespace]) == [
        (2, "input_grammar")
    ]
    added = {"type": "additional_tools", "tools": [custom_tool("lark")]}
    assert findings(added, *custom_pair("add 1,,2")) == [(3, "input_grammar")]


@pytest.mark.parametrize(
    "broken",
    [
        {"type": "grammar", "syntax": "regex", "definition": "(a"},
        {"type": "grammar", "syntax": "lark", "definition": "start: ("},
        {"type": "grammar", "syntax": "ebnf", "definition": "x"},
    ],
)
def test_a_grammar_that_cannot_judge_fails_the_call(broken: dict[str, Any]) -> None:
    tool = {"type": "custom", "name": "calc", "format": broken}
    assert findings(*custom_pair("a"), tools=[tool]) == [(2, "input_grammar")]


def test_the_grammar_failure_is_said_and_listed() -> None:
    body = request(message("hi"), *custom_pair("add 1,,2"), tools=[custom_tool("lark")])
    verdict = inspect(body, Policy(vendor="openai"), Ledger())
    [finding] = rejection(verdict)["error"]["findings"]
    assert finding["reason"] == "input_grammar"
    assert finding["fail"][0]["reason"] == "lark"
    assert finding["message"].startswith("the input breaks its custom tool's format: ")
    json.dumps(finding)


def test_a_regex_runs_in_the_validation_time() -> None:
    tool = {"type": "custom", "name": "calc",
            "format": {"type": "grammar", "syntax": "regex", "definition": "^(a|a)*$"}}  # fmt: skip
    body = request(*custom_pair("a" * 40 + "b"), tools=[tool])
    verdict = inspect(body, Policy(vendor="openai", validation_timeout_s=0.05), Ledger())
    [finding] = verdict.findings
    assert (finding.reason, finding.fail[0].reason) == ("input_grammar", "pattern_timeout")


def test_a_grammar_that_is_not_lalr_fails_closed() -> None:
    """A grammar LALR(1) cannot parse (here a reduce/reduce conflict) would need Earley, cubic
    at worst: the call fails `input_grammar`, saying why, and nothing is parsed."""
    definition = 'start: a "x" | b "x"\na: "z"\nb: "z"\n'
    ambiguous = {"type": "grammar", "syntax": "lark", "definition": definition}
    tool = {"type": "custom", "name": "calc", "format": ambiguous}
    body = request(message("hi"), *custom_pair("zx"), tools=[tool])
    verdict = inspect(body, Policy(vendor="openai"), Ledger())
    [finding] = verdict.findings
    assert (finding.reason, finding.fail[0].reason) == ("input_grammar", "invalid_grammar")
    assert "not an LALR(1) grammar" in str(finding.fail[0].message)


def test_a_lark_input_is_bounded() -> None:
    tool = custom_tool("lark")
    verdict = inspect(
        request(message("hi"), *custom_pair("add " + "1," * 40_000 + "1"), tools=[tool]),
        Policy(vendor="openai"),
        Ledger(),
    )
    [finding] = verdict.findings
    assert (finding.reason, finding.fail[0].reason) == ("input_grammar", "input_too_long")


def test_a_lark_definition_is_bounded() -> None:
    """Lark's LALR(1) tables take time about the square of the grammar to build: a definition
    past 8,192 characters is not compiled."""
    rules = "\n".join(f'r{i}: "a{i}"' for i in range(600))
    definition = "start: " + " | ".join(f"r{i}" for i in range(600)) + "\n" + rules
    assert len(definition) > 8_192
    tool = {"type": "custom", "name": "calc",
            "format": {"type": "grammar", "syntax": "lark", "definition": definition}}  # fmt: skip
    verdict = inspect(request(message("hi"), *custom_pair("a1"), tools=[tool]),
                      Policy(vendor="openai"), Ledger())  # fmt: skip
    [finding] = verdict.findings
    assert (finding.reason, finding.fail[0].reason) == ("input_grammar", "invalid_grammar")
    assert "definition over 8192 characters" in str(finding.fail[0].message)
