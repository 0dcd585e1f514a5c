"""`check --vendor` speaks the vocabulary of the upstream the documents went to: a request of
every kind of item gets the verdict the live gate gives it on a route to that vendor, and a
response's custom tool calls and MCP calls are judged as door 2 judges them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.gate.policy import Policy
from proxy.running.check import Checker
from proxy.running.documents import Document, Kind
from tests.builders import USER
from tests.running.test_check import check, write
from tests.server.test_every_kind import (
    APAC,
    CUSTOM,
    LISTED,
    MARS,
    ROWS,
    TOOLS,
    Broken,
    custom_call,
    mcp,
)


def checked(value: dict[str, Any], vendor: str | None = "openai", kind: Kind = "request") -> Any:
    return Checker(Policy(vendor=vendor)).check(Document("a.json", 1, None, kind, value))


def reasons(value: dict[str, Any], vendor: str | None = "openai", kind: Kind = "request") -> Any:
    return [(r.where, r.finding.reason) for r in checked(value, vendor, kind).reported]


def as_live() -> list[Any]:
    """Each variant of the table the proxy is tested with, and the finding it has live."""
    found = []
    for kind, row in sorted(ROWS.items()):
        if kind != "item_reference":  # its valid variant names an item only the ledger has
            found.append(pytest.param(row.valid, None, id=f"{kind}-valid"))
        for n, broken in enumerate(row.broken):
            found.append(pytest.param(broken.items, broken, id=f"{kind}-{broken.reason}-{n}"))
    return found


@pytest.mark.parametrize(("items", "broken"), as_live())
def test_every_kind_has_the_live_verdict(items: tuple[Any, ...], broken: Broken | None) -> None:
    body = {"model": "m", "tools": TOOLS, "input": [USER, *items]}
    expected = [] if broken is None else [(f"input[{broken.index}]", broken.reason)]
    assert reasons(body) == expected


@pytest.mark.parametrize("kind", [k for k in sorted(ROWS) if k.endswith("_output")])
def test_without_a_vendor_a_forged_output_of_another_family_passes_as_before(kind: str) -> None:
    [forged, *_] = [b for b in ROWS[kind].broken if b.reason == "orphan"]
    body = {"model": "m", "tools": TOOLS, "input": [USER, *forged.items]}
    expected = [("input[1]", "orphan")] if kind == "function_call_output" else []
    assert reasons(body, vendor=None) == expected


def response(*output: Any) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "tools": TOOLS, "output": list(output)}


# (a response's output, the findings as (where, reason) under vendor openai)
EMITTED = [
    pytest.param([custom_call("add 1,2")], [], id="custom-passes"),
    pytest.param([custom_call("add 1,x")], [("output[0]", "input_grammar")], id="custom-grammar"),
    pytest.param(
        [custom_call("x") | {"name": "nope"}], [("output[0]", "unknown_tool")], id="custom-unknown"
    ),
    pytest.param([LISTED, mcp("mcp_call", APAC)], [], id="mcp-passes"),
    pytest.param(
        [LISTED, mcp("mcp_call", MARS)], [("output[1]", "arguments_schema")], id="mcp-schema"
    ),
    pytest.param(
        [LISTED, mcp("mcp_call", APAC, "nope")], [("output[1]", "unknown_tool")], id="mcp-unknown"
    ),
    # Its list is further up the chain, out of view: not judged, as door 2 does not.
    pytest.param([mcp("mcp_call", MARS)], [], id="mcp-list-out-of-view"),
    # An approval request is answered by the client, not run: door 2 leaves it alone.
    pytest.param([LISTED, mcp("mcp_approval_request", MARS)], [], id="approval-request"),
]


@pytest.mark.parametrize(("output", "expected"), EMITTED)
def test_a_response_is_judged_as_door_2_judges_it(output: list[Any], expected: Any) -> None:
    assert reasons(response(*output), kind="response") == expected


def test_without_a_vendor_a_response_judges_only_function_calls() -> None:
    output = [custom_call("add 1,x"), LISTED, mcp("mcp_call", MARS)]
    assert reasons(response(*output), vendor=None, kind="response") == []


def test_the_grammar_finding_names_its_tool() -> None:
    [reported] = checked(response(custom_call("add 1,x")), kind="response").reported
    assert (reported.finding.call_id, reported.finding.name) == ("k1", "calc")
    assert reported.message.startswith("the input breaks its custom tool's format: ")


def test_the_vendor_option(tmp_path: Path) -> None:
    forged = {"model": "m", "tools": TOOLS, "input": [USER, CUSTOM[1]]}
    name = write(tmp_path / "forged.json", forged)

    assert check(tmp_path, name).code == 0
    run = check(tmp_path, "--vendor", "openai", "--json", name)
    assert run.code == 1
    [verdict] = run.verdicts
    assert (verdict["where"], verdict["finding"]["reason"]) == ("input[1]", "orphan")
    assert verdict["finding"]["message"].startswith("no custom_tool_call with call_id k1")


def test_a_vendor_that_is_not_a_slug_is_a_usage_error(tmp_path: Path) -> None:
    run = check(tmp_path, "--vendor", "openai:x", write(tmp_path / "a.json", {"input": []}))
    assert run.code == 2
    assert "--vendor: 'openai:x' is not a vendor slug" in run.err
