"""`foreign_item`: an item typed with another vendor's slug than the target upstream's."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.gate import items
from proxy.gate.findings import message as sentence
from proxy.gate.policy import Policy
from proxy.gate.verdict import inspect, rejection
from tests.builders import WEB_SEARCH, call, message, output, request
from tests.gate.ledger_double import Ledger
from tests.gate.test_actions import REWRITES, STRIPS
from tests.gate.test_check_order import ORDER
from tests.gate.test_item_findings import CLASSIFIED
from tests.gate.test_reasons import REASONS

SEARCH = {"type": "acme:search_call", "id": "sc_1", "status": "completed", "query": "apac"}


def acme_call(call_id: str) -> dict[str, Any]:
    return {"type": "acme:tool_call", "call_id": call_id, "name": "lookup", "arguments": "{}"}


# (input items, the target's vendor, every finding as (index, reason))
FOREIGN = [
    pytest.param([SEARCH], None, [], id="no-vendor-nothing-judged"),
    pytest.param([SEARCH, WEB_SEARCH], None, [], id="no-vendor-two-vendors"),
    pytest.param([SEARCH], "acme", [], id="native"),
    pytest.param([SEARCH], "openai", [(0, "foreign_item")], id="foreign"),
    pytest.param(
        [WEB_SEARCH, message("hi"), SEARCH], "openai", [(2, "foreign_item")], id="one-of-two"
    ),
    pytest.param(
        [SEARCH, WEB_SEARCH], "other", [(0, "foreign_item"), (1, "foreign_item")], id="both"
    ),
    # The slug is what comes before the first colon, compared exactly.
    pytest.param([{"type": "acme:a:b"}], "acme", [], id="slug-before-first-colon"),
    pytest.param([{"type": "Acme:search_call"}], "acme", [(0, "foreign_item")], id="case"),
    pytest.param([{"type": ":search_call"}], "acme", [(0, "foreign_item")], id="empty-slug"),
    pytest.param([{"type": "acmex:search_call"}], "acme", [(0, "foreign_item")], id="prefix"),
    # Items without a slug are not judged here.
    pytest.param(
        [message("hi"), {"type": "reasoning", "id": "rs_1", "summary": []}],
        "acme",
        [],
        id="spec-types",
    ),
    pytest.param([{"type": 5}, ["acme:x"], "acme:x", None], "openai", [], id="not-typed"),
    pytest.param([call("c"), output("c")], "acme", [], id="portable-pair"),
    # An output paired with a slug item fails `namespaced`, native or not: a vendor's item is
    # never a portable function_call.
    pytest.param(
        [acme_call("c"), output("c")], "acme", [(1, "namespaced")], id="native-pair-namespaced"
    ),
    pytest.param(
        [acme_call("c"), output("c")],
        "openai",
        [(0, "foreign_item"), (1, "namespaced")],
        id="foreign-pair",
    ),
    pytest.param(
        [SEARCH, {"type": "function_call_output", "call_id": "sc_1", "output": "x"}],
        "openai",
        [(0, "foreign_item"), (1, "namespaced")],
        id="output-answers-by-id",
    ),
]


@pytest.mark.parametrize(("input_items", "vendor", "found"), FOREIGN)
def test_foreign_items(input_items: list[Any], vendor: str | None, found: list[Any]) -> None:
    verdict = inspect(request(*input_items), Policy(vendor=vendor), Ledger())
    assert [(f.index, f.reason) for f in verdict.findings] == found


def test_finding_names_the_type() -> None:
    verdict = inspect(request(message("hi"), acme_call("c7")), Policy(vendor="openai"))
    [finding] = verdict.findings
    assert finding.as_dict() == {
        "index": 1,
        "call_id": "c7",
        "paired_index": None,
        "name": None,
        "reason": "foreign_item",
        "type": "acme:tool_call",
        "message": (
            "the item's type carries another vendor's slug than the upstream's (acme:tool_call): "
            "it is not portable"
        ),
    }
    assert rejection(verdict)["error"]["message"] == (
        "input[1] (call_id c7): acme:tool_call is another vendor's item, not portable to this "
        "upstream: foreign_item"
    )


USER = message("hi")
ANSWER = {"type": "function_call_output", "call_id": "sc_1", "output": "x"}
LATE_ANSWER = {"type": "function_call_output", "call_id": "c", "output": "late"}

# (input items, policy settings, ledger, outcome, indexes of the items forwarded, or None)
STRIP = [
    pytest.param(
        [USER, SEARCH, call("c"), output("c")],
        {"action": "strip"},
        None,
        "strip",
        [0, 2, 3],
        id="strip-foreign-item",
    ),
    pytest.param(
        [USER, SEARCH, ANSWER, call("c"), output("c")],
        {"action": "strip"},
        None,
        "strip",
        [0, 3, 4],
        id="strip-with-its-output",
    ),
    # Its outputs go with it even when their own reason is only logged: none is left dangling.
    pytest.param(
        [USER, SEARCH, ANSWER, call("c"), output("c")],
        {"actions": {"foreign_item": "strip", "namespaced": "log"}},
        None,
        "strip",
        [0, 3, 4],
        id="outputs-go-with-it",
    ),
    # An output before it answers an earlier call, not the foreign item.
    pytest.param(
        [call("c"), output("c"), acme_call("c")],
        {"actions": {"foreign_item": "strip", "duplicate_call_id": "log"}},
        None,
        "strip",
        [0, 1],
        id="earlier-output-stays",
    ),
    # Its output would leave a call of the recorded chain without one: blocked instead.
    pytest.param(
        [acme_call("c"), LATE_ANSWER],
        {"actions": {"foreign_item": "strip", "duplicate_call_id": "log"}},
        Ledger(chain=[call("c")]),
        "block",
        None,
        id="upstream-pair-escalates",
    ),
    pytest.param(
        [USER, SEARCH],
        {"actions": {"foreign_item": "log"}},
        None,
        "forward",
        None,
        id="log",
    ),
    pytest.param([USER, SEARCH], {}, None, "block", None, id="block-by-default"),
    pytest.param(
        [USER, SEARCH],
        {"action": "strip", "actions": {"foreign_item": "block"}},
        None,
        "block",
        None,
        id="own-action",
    ),
    # There is no call whose failure an output could carry: under rewrite, it blocks.
    pytest.param([USER, SEARCH], {"action": "rewrite"}, None, "block", None, id="rewrite-blocks"),
]


@pytest.mark.parametrize(("input_items", "settings", "ledger", "outcome", "kept"), STRIP)
def test_actions(
    input_items: list[Any],
    settings: dict[str, Any],
    ledger: Ledger | None,
    outcome: str,
    kept: list[int] | None,
) -> None:
    policy = Policy(vendor="openai", **settings)
    body = request(*input_items, previous_response_id="resp_1")
    verdict = inspect(body, policy, ledger or Ledger())
    assert verdict.outcome == outcome
    if kept is not None:
        assert verdict.input == [input_items[i] for i in kept]


def corpus() -> list[Any]:
    """Every row of the gate's existing tables as (input items, settings, ledger)."""
    rows = []
    for table in (REASONS, ORDER, CLASSIFIED, STRIPS, REWRITES):
        for row in table:
            input_items, settings, *rest = row.values
            ledger = next((value for value in rest if isinstance(value, Ledger)), None)
            rows.append(pytest.param(input_items, settings, ledger, id=row.id))
    return rows


@pytest.mark.parametrize(("input_items", "settings", "ledger"), corpus())
def test_a_native_vendor_changes_no_verdict(
    input_items: list[Any], settings: dict[str, Any], ledger: Ledger | None
) -> None:
    slugs = {items.vendor_of(i.get("type")) for i in input_items if isinstance(i, dict)} - {None}
    if len(slugs) > 1:
        pytest.skip("items of two vendors: one of them is foreign to any target")
    vendor = slugs.pop() if slugs else "acme"
    body = request(*input_items)
    without = inspect(body, Policy(**settings), ledger or Ledger())
    assert inspect(body, Policy(**settings, vendor=vendor), ledger or Ledger()) == without


def test_its_sentence_names_the_type() -> None:
    [finding] = inspect(request(SEARCH), Policy(vendor="openai")).findings
    assert sentence(finding) == (
        "the item's type carries another vendor's slug than the upstream's (acme:search_call): "
        "it is not portable"
    )
