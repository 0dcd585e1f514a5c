"""Findings as values: a reason is a named value that is still its string, each check returns
one result type, and the findings' modules form a leaf that imports nothing above it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.gate.arguments import check_arguments
from proxy.gate.findings import Failed, Finding, message
from proxy.gate.policy import Policy
from proxy.gate.reasons import ALL_REASONS, EMITTED_REASONS, Reason
from proxy.gate.records import read_finding
from proxy.gate.schemas import SchemaCache, Violation
from tests.test_layers import PROXY, imports_of


@pytest.mark.parametrize("reason", list(Reason), ids=str)
def test_a_reason_is_its_string(reason: Reason) -> None:
    # Audit records, metric labels, `gate.actions` keys and tests write and compare the value.
    assert reason == reason.value
    assert hash(reason) == hash(reason.value)
    assert f"{reason}" == str(reason) == reason.value
    assert json.dumps({reason: reason}) == json.dumps({reason.value: reason.value})
    if reason in EMITTED_REASONS:  # door 2 only watches: no action to give it
        with pytest.raises(ValueError, match=f"actions.{reason}: unknown reason"):
            Policy(actions={reason.value: "log"})
    else:
        assert Policy(actions={reason.value: "log"}).action_for(reason) == "log"


def test_every_reason_is_named_once() -> None:
    assert sorted((*ALL_REASONS, *EMITTED_REASONS)) == sorted(Reason)
    assert len(set(ALL_REASONS)) == len(ALL_REASONS)
    assert not set(ALL_REASONS) & set(EMITTED_REASONS)


def _headline(reason: Reason) -> str:
    return Finding(1, reason, "block", "call_1", 0, "get_latest_sales_report").describe()


@pytest.mark.parametrize("reason", list(Reason), ids=str)
def test_every_reason_is_said_and_headlined(reason: Reason) -> None:
    finding = Finding(1, reason, "block", "call_1", 0, "get_latest_sales_report")
    assert message(finding)
    # A rejection's message names the reason, whatever table row said it.
    assert _headline(reason).startswith("input[1] (call_id call_1): ")
    assert _headline(reason).endswith(reason.value)


SCHEMA = {
    "type": "object",
    "properties": {"region": {"enum": ["apac", "emea"]}},
    "required": ["region"],
}

# (arguments, what check_arguments finds: None when they pass)
ARGUMENTS = [
    pytest.param('{"region": "apac"}', None, id="passes"),
    pytest.param('{"region": 1', Failed(Reason.ARGUMENTS_PARSE), id="parse"),
    pytest.param('{"a": 1, "a": 2}', Failed(Reason.ARGUMENTS_PARSE), id="duplicate-key"),
    pytest.param(
        '{"region": "mars"}',
        Failed(
            Reason.ARGUMENTS_SCHEMA,
            (Violation("/region", "enum", None, (["apac", "emea"],)),),
        ),
        id="schema",
    ),
]


@pytest.mark.parametrize(("arguments", "expected"), ARGUMENTS)
def test_check_arguments_returns_failed_or_none(arguments: str, expected: Failed | None) -> None:
    compiled = SchemaCache().compile(SCHEMA)
    found = check_arguments(arguments, [compiled])
    if expected is None:
        assert found is None
        return
    assert isinstance(found, Failed)
    assert (found.reason, [v.as_dict() for v in found.fail]) == (
        expected.reason,
        [v.as_dict() for v in expected.fail],
    )
    assert type(found.reason) is Reason


def test_no_schema_is_an_unknown_tool() -> None:
    assert check_arguments('{"region": "apac"}', []) == Failed(Reason.UNKNOWN_TOOL)


# (what an audit record lists, the finding read back or None)
RECORDS = [
    pytest.param(
        {"index": 2, "call_id": "c", "paired_index": 0, "name": "t", "reason": "status"},
        Finding(2, Reason.STATUS, "block", "c", 0, "t"),
        id="status",
    ),
    pytest.param(
        {"index": None, "param": "messages", "reason": "envelope"},
        Finding(None, Reason.ENVELOPE, "block", param="messages"),
        id="messages",
    ),
    pytest.param({"index": 2, "reason": "no_such_reason"}, None, id="unknown-reason"),
    pytest.param({"index": 2, "reason": ["status"]}, None, id="reason-not-a-string"),
    pytest.param({"index": True, "reason": "status"}, None, id="index-a-boolean"),
    pytest.param(["status"], None, id="not-an-object"),
]


@pytest.mark.parametrize(("recorded", "expected"), RECORDS)
def test_read_finding(recorded: Any, expected: Finding | None) -> None:
    found = read_finding(recorded, Policy().action_for)
    assert found == expected
    if found is not None:
        assert type(found.reason) is Reason


# The findings' modules, each with the modules of ours it may import: a leaf under the verdict.
FAMILY = {
    "proxy.gate.reasons": set(),
    "proxy.gate.phrases": {"proxy.gate.reasons", "proxy.gate.schemas"},
    "proxy.gate.findings": {
        "proxy.gate.items",
        "proxy.gate.strictjson",
        "proxy.gate.phrases",
        "proxy.gate.reasons",
        "proxy.gate.schemas",
    },
    "proxy.gate.records": {"proxy.gate.findings", "proxy.gate.reasons", "proxy.gate.schemas"},
}


@pytest.mark.parametrize(("module", "allowed"), FAMILY.items(), ids=list(FAMILY))
def test_findings_are_a_leaf(module: str, allowed: set[str]) -> None:
    path = PROXY.parent.joinpath(*module.split(".")).with_suffix(".py")
    imported = {name for _, name in imports_of(path.read_text(encoding="utf-8"), module)}
    assert imported <= allowed, sorted(imported - allowed)
