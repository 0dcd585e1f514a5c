"""The validation budget: per request, and a timeout never lets a call through."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.gate.items import Item
from proxy.gate.policy import Policy
from proxy.gate.reasons import Outcome
from proxy.gate.verdict import Verdict, inspect
from tests.builders import BUDGET_S, EVIL, USER, replay

TIMEOUTS = ("pattern_timeout", "validation_timeout")


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param({"pattern": "^(a|a)*$"}, id="pattern"),
        pytest.param({"not": {"pattern": "^(a|a)*$"}}, id="under-not"),
        pytest.param({"anyOf": [{"pattern": "^(a|a)*$"}, {"type": "string"}]}, id="under-anyof"),
        pytest.param({"if": {"pattern": "^(a|a)*$"}, "then": True, "else": True}, id="under-if"),
        pytest.param({"propertyNames": {"pattern": "^(a|a)*$"}}, id="property-names"),
    ],
)
def test_a_validation_that_runs_out_of_time_fails(schema: dict[str, Any]) -> None:
    # Under `not`, `anyOf` or `if`, an undecided match must not count as a decided one.
    parameters = {"properties": {"q": schema}}
    arguments = json.dumps({"q": EVIL} if "propertyNames" not in schema else {"q": {EVIL: 1}})
    verdict = inspect(
        json.loads(replay(arguments, parameters)), Policy(validation_timeout_s=BUDGET_S)
    )
    [finding] = verdict.findings
    assert verdict.outcome == "block"
    assert finding.reason == "arguments_schema"
    assert any(v.reason in TIMEOUTS for v in finding.fail)


def evil_pairs(count: int) -> list[Item]:
    found: list[Item] = []
    for i in range(count):
        arguments = json.dumps({"q": EVIL + str(i)})  # no two alike: no cached verdict
        call = {
            "type": "function_call",
            "call_id": f"call_{i}",
            "name": "lookup",
            "status": "completed",
            "arguments": arguments,
        }
        found += [call, {"type": "function_call_output", "call_id": f"call_{i}", "output": "x"}]
    return found


LOOKUP = {
    "type": "function",
    "name": "lookup",
    "parameters": {"properties": {"q": {"pattern": "^(a|a)*$"}}},
}


def test_the_budget_is_for_the_whole_request() -> None:
    policy = Policy(validation_timeout_s=BUDGET_S)
    request = {"tools": [LOOKUP], "input": [USER, *evil_pairs(20)]}
    verdict = inspect(request, policy)
    assert verdict.outcome == "block"
    # The first call spends the budget; the other nineteen are not even started.
    reasons = [[v.as_dict() for v in f.fail] for f in verdict.findings]
    assert reasons[0] == [{"path": "/q", "reason": "pattern_timeout"}]
    assert reasons[1:] == [[{"path": "", "reason": "validation_timeout"}]] * 19


def test_a_timeout_is_not_remembered_for_the_next_request() -> None:
    policy = Policy(validation_timeout_s=BUDGET_S)
    benign = {
        "type": "function_call",
        "call_id": "call_ok",
        "name": "lookup",
        "status": "completed",
        "arguments": json.dumps({"q": "aaa"}),
    }
    answered = {"type": "function_call_output", "call_id": "call_ok", "output": "x"}
    # A busy request spends its budget before the benign call comes up: it fails with it.
    busy = inspect({"tools": [LOOKUP], "input": [*evil_pairs(1), benign, answered]}, policy)
    assert [f.call_id for f in busy.findings] == ["call_0", "call_ok"]
    # Alone, with a budget of its own, the same call passes: the timeout was not cached.
    assert inspect({"tools": [LOOKUP], "input": [benign, answered]}, policy) == Verdict(
        Outcome.FORWARD
    )


class _EarlyTimer:
    """A compiled pattern whose timer fires at once, before the deadline by any clock (as the
    `regex` module's own timer may, a little)."""

    def search(self, string: str, timeout: float | None = None) -> None:
        raise TimeoutError


def test_a_match_stopped_before_the_deadline_still_spends_the_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A regex stopped by its timer ends the request's validation time, whatever the clock
    says is left: the other calls are not started (no sliver of time for each to time out in).
    """
    monkeypatch.setattr("proxy.gate.patterns.Patterns.get", lambda self, source: _EarlyTimer())
    verdict = inspect({"tools": [LOOKUP], "input": [USER, *evil_pairs(3)]}, Policy())
    reasons = [[v.as_dict() for v in f.fail] for f in verdict.findings]
    assert reasons == [
        [{"path": "/q", "reason": "pattern_timeout"}],
        [{"path": "", "reason": "validation_timeout"}],
        [{"path": "", "reason": "validation_timeout"}],
    ]
