"""`not_portable`: a pair that breaks the spec's own item schemas, which any server may apply."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.gate import items, portable
from proxy.gate.caches import GateCaches
from proxy.gate.call_limits import CallLimits
from proxy.gate.host import check_call
from proxy.gate.policy import Policy
from proxy.gate.records import failure_record
from proxy.gate.verdict import inspect, rejection
from tests.builders import (
    APAC,
    BUDGET_S,
    SALES_SCHEMA,
    call,
    output,
    request,
    tool,
    typeless,
    without,
)
from tests.gate.ledger_double import Ledger

ID_64 = "call_" + "a" * 59
ID_65 = "call_" + "a" * 60
# The length of the call_id in the report that made the check: refused by the next provider.
ID_94 = "call_" + "b" * 89
NAME_64 = "n" * 64
NAME_65 = "n" * 65


def sales(item: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return item | changes


def text(value: str) -> dict[str, Any]:
    return {"type": "input_text", "text": value}


# (input items, the tools offered, the one finding's reason (None: no finding), the failing
# item's `type`, its violations as (path, keyword) or (path, keyword, expected))
PORTABLE = [
    pytest.param([call(ID_64), output(ID_64)], None, None, None, [], id="call-id-64-passes"),
    pytest.param(
        [call(ID_65), output(ID_65)],
        None,
        "not_portable",
        "function_call",
        [("/call_id", "maxLength", 64)],
        id="call-id-65",
    ),
    pytest.param(
        [call(ID_94), output(ID_94)],
        None,
        "not_portable",
        "function_call",
        [("/call_id", "maxLength", 64)],
        id="call-id-94",
    ),
    pytest.param(
        [call(""), output("")],
        None,
        "not_portable",
        "function_call",
        [("/call_id", "minLength", 1)],
        id="call-id-empty",
    ),
    pytest.param(
        [call("c", name="get weather"), output("c")],
        None,
        "not_portable",
        "function_call",
        [("/name", "pattern", "^[a-zA-Z0-9_-]+$")],
        id="name-with-space",
    ),
    pytest.param(
        [call("c", name="web.search"), output("c")],
        [tool(SALES_SCHEMA, "web.search")],
        "not_portable",
        "function_call",
        [("/name", "pattern", "^[a-zA-Z0-9_-]+$")],
        id="name-with-dot-even-if-offered",
    ),
    pytest.param(
        [call("c", name="lookup\n"), output("c")],
        None,
        "not_portable",
        "function_call",
        [("/name", "pattern", "^[a-zA-Z0-9_-]+$")],
        id="name-final-newline",
    ),
    pytest.param(
        [call("c", name="suché"), output("c")],
        None,
        "not_portable",
        "function_call",
        [("/name", "pattern", "^[a-zA-Z0-9_-]+$")],
        id="name-not-ascii",
    ),
    pytest.param(
        [call("c", name=NAME_64), output("c")],
        [tool(SALES_SCHEMA, NAME_64)],
        None,
        None,
        [],
        id="name-64-passes",
    ),
    pytest.param(
        [call("c", name=NAME_65), output("c")],
        [tool(SALES_SCHEMA, NAME_65)],
        "not_portable",
        "function_call",
        [("/name", "maxLength", 64)],
        id="name-65",
    ),
    pytest.param(
        [call("c", name=""), output("c")],
        None,
        "not_portable",
        "function_call",
        [("/name", "minLength", 1), ("/name", "pattern", "^[a-zA-Z0-9_-]+$")],
        id="name-empty",
    ),
    pytest.param(
        [without(call("c"), "name"), output("c")],
        None,
        "not_portable",
        "function_call",
        [("/name", "required", ["call_id", "type", "name", "arguments"])],
        id="name-missing",
    ),
    pytest.param(
        [call("c", name=["x"]), output("c")],
        None,
        "not_portable",
        "function_call",
        [("/name", "type", "string")],
        id="name-list",
    ),
    pytest.param(
        [call("c", id=7), output("c")],
        None,
        "not_portable",
        "function_call",
        [("/id", "anyOf")],
        id="call-id-field-number",
    ),
    pytest.param([call("c", id=None), output("c")], None, None, None, [], id="call-null-id-passes"),
    pytest.param(
        [without(call("c"), "id"), output("c")], None, None, None, [], id="call-no-id-passes"
    ),
    pytest.param(
        [call("c", extra={"a": 1}), output("c")], None, None, None, [], id="extra-field-passes"
    ),
    # The call's arguments and status are judged by the reasons after this one, which say more.
    pytest.param(
        [call("c", {"region": "apac"}), output("c")],
        None,
        "arguments_type",
        None,
        [],
        id="arguments-object-is-arguments-type",
    ),
    pytest.param(
        [without(call("c"), "arguments"), output("c")],
        None,
        "arguments_type",
        None,
        [],
        id="arguments-missing-is-arguments-type",
    ),
    pytest.param(
        [call("c", status="done"), output("c")], None, "status", None, [], id="status-unknown"
    ),
    # The output: every field it has is checked; `id` and `status` may be absent or null.
    pytest.param(
        [call("c"), sales(output("c"), output={"rows": 3})],
        None,
        "not_portable",
        "function_call_output",
        [("/output", "oneOf")],
        id="output-object",
    ),
    pytest.param(
        [call("c"), sales(output("c"), output=12)],
        None,
        "not_portable",
        "function_call_output",
        [("/output", "oneOf")],
        id="output-number",
    ),
    pytest.param(
        [call("c"), without(output("c"), "output")],
        None,
        "not_portable",
        "function_call_output",
        [("/output", "required", ["call_id", "type", "output"])],
        id="output-missing",
    ),
    pytest.param(
        [call("c"), sales(output("c"), output=[text("3 rows")])],
        None,
        None,
        None,
        [],
        id="output-content-parts-pass",
    ),
    pytest.param(
        [call("c"), sales(output("c"), output=[{"type": "input_text"}])],
        None,
        "not_portable",
        "function_call_output",
        [("/output", "oneOf")],
        id="output-content-part-without-text",
    ),
    pytest.param(
        [call("c"), sales(output("c"), status="completed", id="fco_1")],
        None,
        None,
        None,
        [],
        id="output-status-and-id-pass",
    ),
    pytest.param(
        [call("c"), sales(output("c"), status=None, id=None)],
        None,
        None,
        None,
        [],
        id="output-null-status-and-id-pass",
    ),
    pytest.param(
        [call("c"), sales(output("c"), status="done")],
        None,
        "not_portable",
        "function_call_output",
        [("/status", "anyOf")],
        id="output-status-unknown",
    ),
    pytest.param(
        [call("c"), sales(output("c"), id=5)],
        None,
        "not_portable",
        "function_call_output",
        [("/id", "anyOf")],
        id="output-id-number",
    ),
    # The gate reads an output without a type (or a null one) with the spec's default.
    pytest.param([call("c"), typeless(output("c"))], None, None, None, [], id="typeless-output"),
    pytest.param(
        [call("c"), sales(output("c"), type=None)], None, None, None, [], id="null-type-output"
    ),
    # Both break the schema: the call's violations are the finding's.
    pytest.param(
        [call(ID_65, name="a b"), sales(output(ID_65), output={})],
        None,
        "not_portable",
        "function_call",
        [("/call_id", "maxLength", 64), ("/name", "pattern", "^[a-zA-Z0-9_-]+$")],
        id="call-first",
    ),
]


@pytest.mark.parametrize(("input_items", "tools", "reason", "item_type", "fail"), PORTABLE)
def test_not_portable(
    input_items: list[Any],
    tools: list[Any] | None,
    reason: str | None,
    item_type: str | None,
    fail: list[tuple[Any, ...]],
) -> None:
    body = request(*input_items) if tools is None else request(*input_items, tools=tools)
    verdict = inspect(body, Policy())
    assert [f.reason for f in verdict.findings] == ([reason] if reason else [])
    if reason != "not_portable":
        return
    [finding] = verdict.findings
    found = finding.as_dict()
    assert (found["index"], found["paired_index"], found["type"]) == (1, 0, item_type)
    assert found["fail"] == [
        {"path": path, "reason": keyword} | ({"expected": rest[0]} if rest else {})
        for path, keyword, *rest in fail
    ]


def test_a_recorded_call_is_checked_too() -> None:
    ledger = Ledger(chain=[call(ID_65)])
    verdict = inspect(request(output(ID_65), previous_response_id="resp_1"), Policy(), ledger)
    assert [(f.reason, f.paired_index, f.item_type) for f in verdict.findings] == [
        ("not_portable", None, "function_call")
    ]


# (policy settings, the outcome, the forwarded input's items (None: not forwarded changed))
ACTIONS = [
    pytest.param({}, "block", None, id="block"),
    pytest.param({"action": "strip"}, "strip", [0], id="strip-removes-the-pair"),
    pytest.param({"actions": {"not_portable": "log"}}, "forward", None, id="log"),
    # The call would stay as it was: a rewritten output does not make the pair portable.
    pytest.param({"action": "rewrite"}, "block", None, id="rewrite-blocks"),
]


@pytest.mark.parametrize(("settings", "outcome", "kept"), ACTIONS)
def test_actions(settings: dict[str, Any], outcome: str, kept: list[int] | None) -> None:
    input_items = [{"role": "user", "content": "hi"}, call(ID_65), output(ID_65)]
    verdict = inspect(request(*input_items), Policy(**settings))
    assert verdict.outcome == outcome
    if kept is not None:
        assert verdict.input == [input_items[i] for i in kept]


def test_rejection_names_the_item_and_the_keyword() -> None:
    verdict = inspect(request(call("c"), sales(output("c"), output={})), Policy())
    error = rejection(verdict)["error"]
    assert error["param"] == "input[1]"
    assert error["message"] == (
        "input[1] (call_id c): the function_call_output failed the replay gate: "
        "not_portable at /output (oneOf)"
    )
    verdict = inspect(request(call(ID_65), output(ID_65)), Policy())
    assert rejection(verdict)["error"]["message"] == (
        f"input[1] (call_id {ID_65}): paired function_call failed the replay gate: "
        "not_portable at /call_id (maxLength)"
    )


def test_failure_record_says_what_breaks_the_schema() -> None:
    [finding] = inspect(request(call("c", name="a b"), output("c")), Policy()).findings
    record = failure_record(finding)
    assert record["reason"] == "not_portable"
    pattern = "^[a-zA-Z0-9_-]+$"
    assert record["fail"] == [{"path": "/name", "reason": "pattern", "expected": pattern}]
    assert record["error"] == (
        "the function_call breaks the spec's item schema (a server may refuse it): "
        "name failed schema: expected ^[a-zA-Z0-9_-]+$"
    )


def test_verdicts_jsonschema_gave_are_cached_per_item() -> None:
    policy = Policy()
    caches = GateCaches.for_policy(policy)
    unportable = call(ID_65) | {"id": 7}
    body = request(unportable, output(ID_65), call("d", APAC), output("d"))
    first = inspect(body, policy, caches=caches)
    # The quick acceptor passed the second pair; only the failing call went to jsonschema.
    assert len(caches.portable) == 1
    assert inspect(body, policy, caches=caches) == first
    assert len(caches.portable) == 1
    assert [(f.reason, [v.path for v in f.fail]) for f in first.findings] == [
        ("not_portable", ["/id", "/call_id"])
    ]


def test_an_output_that_runs_out_of_time_fails_and_is_not_cached() -> None:
    # More parts than the quick acceptor checks for one request: jsonschema gets the output,
    # and takes some 100-500 µs a part (a oneOf of four $refs), far longer than the budget.
    parts = [text("") for _ in range(portable.QUICK_STEPS + 1)]
    policy = Policy(validation_timeout_s=BUDGET_S)
    caches = GateCaches.for_policy(policy)
    body = request(call("c"), sales(output("c"), output=parts))
    verdict = inspect(body, policy, caches=caches)
    [finding] = verdict.findings
    assert (verdict.outcome, finding.reason, finding.item_type) == (
        "block",
        "not_portable",
        "function_call_output",
    )
    assert [v.reason for v in finding.fail] == ["validation_timeout"]
    # Nothing is remembered: the call passed the quick acceptor, and a timeout says how busy
    # the request was, not what the output is worth.
    assert len(caches.portable) == 0


def test_the_ledgers_own_keys_are_not_judged() -> None:
    # The keys the ledger adds to a call it recorded never go upstream, and may be large.
    recorded = call("c") | {items.RECORDED_TOOLS: "t_1", items.RECORDED_SCHEMAS: [SALES_SCHEMA]}
    assert (
        portable.judged(recorded)
        == portable.judged(call("c"))
        == without(call("c"), "arguments", "status")
    )


def test_the_host_check_says_so_too() -> None:
    record = check_call(call("c", name="get latest"), SALES_SCHEMA)
    assert (record["execute"], record["reason"], record["fail"]) == (
        False,
        "not_portable",
        [{"path": "/name", "reason": "pattern", "expected": "^[a-zA-Z0-9_-]+$"}],
    )


def test_an_apis_own_limits_are_not_portable_and_never_taken_from_the_cache() -> None:
    """A call that passed under the spec's limits alone (remembered as passing) is judged again
    under an API's own: OpenAI Chat's 40-character call id."""
    limits = CallLimits(max_call_id=40)
    body = request(call(ID_64), output(ID_64))
    policy = Policy()
    caches = GateCaches.for_policy(policy)

    assert inspect(body, policy, caches=caches).findings == ()
    [finding] = inspect(body, policy, caches=caches, limits=limits).findings
    assert (finding.reason, finding.item_type) == ("not_portable", "function_call")
    assert [v.as_dict() for v in finding.fail] == [
        {"path": "/call_id", "reason": "maxLength", "expected": 40}
    ]
    assert inspect(request(call("c" * 40), output("c" * 40)), policy, limits=limits).findings == ()
