"""What one request's verdict may say, whatever the request: findings and violations capped and
counted, Chat Completions bodies on a Responses path, rewritten outputs rebuilt."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.gate import schemas
from proxy.gate.arguments import check_arguments
from proxy.gate.findings import Finding
from proxy.gate.policy import Policy
from proxy.gate.reasons import Action, Outcome, Reason
from proxy.gate.records import failure_record
from proxy.gate.schemas import SchemaCache, Violation, ViolationTally
from proxy.gate.verdict import (
    Bounds,
    Verdict,
    inspect,
    listed,
    rejection,
    rewritten_output,
)
from proxy.settings import Limits
from tests.builders import (
    CHAT_MESSAGES,
    GLOBAL,
    MESSAGES_FINDING,
    PICK_SCHEMA,
    PICK_TOOL,
    WIDE_ENUM,
    call,
    message,
    output,
    pick_call,
    request,
)


def amplifying(elements: int = 6000) -> dict[str, Any]:
    return request(pick_call("c", elements), output("c"), tools=[PICK_TOOL])


def test_the_gates_defaults_are_the_configs() -> None:
    limits = Limits()
    assert Bounds() == Bounds(limits.max_findings, limits.max_violations)


def test_the_wide_enum_is_about_900_bytes() -> None:
    assert 850 <= len(json.dumps(WIDE_ENUM)) <= 1000


TALLIES = [
    pytest.param(None, ["a", "b", "c"], ["a", "b", "c"], 0, id="no-limit"),
    pytest.param(2, ["a", "b", "c", "d"], ["a", "b"], 2, id="over"),
    pytest.param(2, ["a", "b"], ["a", "b"], 0, id="at-the-limit"),
    pytest.param(2, ["a", "a", "b", "b", "c"], ["a", "b"], 1, id="duplicates-once"),
    pytest.param(
        2, ["a", "b", "c", "validation_timeout"], ["a", "validation_timeout"], 2, id="timeout-said"
    ),
]


@pytest.mark.parametrize(("limit", "paths", "shown", "omitted"), TALLIES)
def test_tally(limit: int | None, paths: list[str], shown: list[str], omitted: int) -> None:
    found = ViolationTally(limit)
    for path in paths:
        reason = path if path == "validation_timeout" else "enum"
        found.add([Violation("" if reason != "enum" else "/" + path, reason)])
    assert [v.path[1:] or v.reason for v in found.listed] == shown
    assert found.omitted == omitted
    assert len(list(found.seen)) == len(set(paths))


def test_violations_past_the_cap_are_counted_not_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = SchemaCache().compile(PICK_SCHEMA)
    rendered = []
    real = schemas.expected_value

    def counting(value: Any, limit: int = schemas.MAX_EXPECTED_BYTES) -> tuple[Any, ...]:
        rendered.append(value)
        return real(value, limit)

    monkeypatch.setattr(schemas, "expected_value", counting)
    arguments = json.dumps({"values": [0] * 6000, "note": "fine"})

    found = check_arguments(arguments, [compiled], max_violations=20)

    assert found is not None
    reason, fail, passed, omitted = found.reason, found.fail, found.passed, found.fail_omitted
    assert (reason, len(fail), omitted) == ("arguments_schema", 20, 5980)
    assert [v.path for v in fail] == [f"/values/{n}" for n in range(20)]
    assert all(v.expected == (WIDE_ENUM,) for v in fail)
    # Only what is listed is rendered; every other violation is a count.
    assert len(rendered) == 20
    # The count saw every path: `note` passed, `values` did not.
    assert passed == ("note",)


def test_the_amplifying_request_says_a_bounded_amount() -> None:
    verdict = inspect(amplifying(), Policy(), bounds=Bounds(max_violations=20))
    [finding] = verdict.findings
    assert (len(finding.fail), finding.fail_omitted) == (20, 5980)
    shown = finding.as_dict()
    assert shown["fail_omitted"] == 5980
    assert len(shown["fail"]) == 20
    assert shown["message"].endswith("; and 5980 more violations")
    body = json.dumps(rejection(verdict, request_id="req_1"))
    assert len(body) < 64 * 1024
    assert "and 5980 more" in json.loads(body)["error"]["message"]


def test_the_same_arguments_under_another_cap_are_judged_again() -> None:
    policy = Policy()
    first = inspect(amplifying(30), policy, bounds=Bounds(max_violations=5))
    again = inspect(amplifying(30), policy, bounds=Bounds(max_violations=7))
    assert [(len(f.fail), f.fail_omitted) for f in (*first.findings, *again.findings)] == [
        (5, 25),
        (7, 23),
    ]


def test_not_portable_violations_are_capped() -> None:
    # A call that breaks the spec's item schema three ways: its id, call_id and name.
    call_id = "c" * 100
    bad = call(call_id, name="bad name", id=5)
    verdict = inspect(request(bad, output(call_id)), Policy(), bounds=Bounds(max_violations=2))
    [finding] = verdict.findings
    assert finding.reason == "not_portable"
    assert [v.path for v in finding.fail] == ["/id", "/call_id"]
    assert finding.fail_omitted == 1
    assert finding.as_dict()["fail_omitted"] == 1
    assert finding.as_dict()["message"].endswith("; and 1 more violation")


def failing(index: int, action: Action) -> Finding:
    return Finding(index, Reason.ARGUMENTS_SCHEMA, action, f"c{index}")


LISTINGS = [
    pytest.param(["block"] * 3, 5, [0, 1, 2], 0, id="under"),
    pytest.param(["log"] * 4, 2, [0, 1], 2, id="in-input-order"),
    pytest.param(["log", "log", "block", "log", "block"], 2, [2, 4], 3, id="blocking-first"),
    pytest.param(["block", "log", "log", "block"], 3, [0, 1, 3], 1, id="then-the-others"),
]


@pytest.mark.parametrize(("actions", "limit", "indexes", "omitted"), LISTINGS)
def test_listed(actions: list[Action], limit: int, indexes: list[int], omitted: int) -> None:
    findings = [failing(i, a) for i, a in enumerate(actions)]
    shown, left_out = listed(findings, limit)
    assert ([f.index for f in shown], left_out) == (indexes, omitted)


def test_many_findings_are_listed_up_to_the_cap() -> None:
    pairs = [item for n in range(150) for item in (call(f"c{n}", GLOBAL), output(f"c{n}"))]
    verdict = inspect(request(*pairs), Policy(), bounds=Bounds(max_findings=100))
    assert len(verdict.findings) == 150
    error = rejection(verdict)["error"]
    assert len(error["findings"]) == 100
    assert error["findings_omitted"] == 50
    assert error["message"].endswith("(and 149 more findings)")


def test_nothing_is_omitted_under_the_caps() -> None:
    verdict = inspect(request(call("c", GLOBAL), output("c")), Policy())
    error = rejection(verdict)["error"]
    assert "findings_omitted" not in error
    assert "fail_omitted" not in error["findings"][0]


@pytest.mark.parametrize(
    "bounds",
    [
        pytest.param({"max_findings": 0}, id="zero-findings"),
        pytest.param({"max_violations": -1}, id="negative-violations"),
        pytest.param({"max_violations": True}, id="boolean"),
        pytest.param({"max_findings": 1.5}, id="float"),
    ],
)
def test_bounds_are_positive_integers(bounds: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bounds))):
        Bounds(**bounds)


def test_the_failure_record_counts_what_it_leaves_out() -> None:
    verdict = inspect(amplifying(), Policy(action="rewrite"), bounds=Bounds(max_violations=4))
    [finding] = verdict.findings
    record = failure_record(finding)
    assert len(record["fail"]) == 4
    assert record["fail_omitted"] == 5996
    assert list(record) == [
        "success",
        "execute",
        "check",
        "reason",
        "pass",
        "fail",
        "fail_omitted",
        "error",
    ]
    assert record["error"].endswith("; and 5996 more violations")


CHAT = CHAT_MESSAGES

CHAT_BODIES = [
    pytest.param({"model": "m", "messages": CHAT}, "block", "block", None, frozenset(), id="block"),
    pytest.param(
        {"model": "m", "messages": []}, "block", "block", None, frozenset(), id="empty-messages"
    ),
    pytest.param(
        {"model": "m", "messages": CHAT},
        "strip",
        "strip",
        None,
        frozenset({"messages"}),
        id="strip-drops-messages",
    ),
    pytest.param(
        {"model": "m", "messages": CHAT, "input": [message("hi")]},
        "strip",
        "strip",
        [message("hi")],
        frozenset({"messages"}),
        id="strip-keeps-input",
    ),
    pytest.param({"model": "m", "messages": CHAT}, "log", "forward", None, frozenset(), id="log"),
    pytest.param(
        {"model": "m", "messages": CHAT}, "rewrite", "block", None, frozenset(), id="no-rewrite"
    ),
]


@pytest.mark.parametrize(("body", "action", "outcome", "sent", "without"), CHAT_BODIES)
def test_a_chat_completions_body_is_an_envelope(
    body: dict[str, Any],
    action: Action,
    outcome: str,
    sent: list[Any] | None,
    without: frozenset[str],
) -> None:
    verdict = inspect(body, Policy(action=action))
    [finding] = verdict.findings
    assert finding.as_dict() == MESSAGES_FINDING
    assert (verdict.outcome, verdict.input, verdict.without) == (outcome, sent, without)


def test_a_chat_completions_body_is_rejected_at_messages() -> None:
    error = rejection(inspect({"model": "m", "messages": CHAT}, Policy()))["error"]
    assert error["param"] == "messages"
    assert error["message"] == "messages: a Chat Completions body on a Responses path: envelope"
    assert error["findings"] == [MESSAGES_FINDING]


def test_messages_beside_input_are_found_with_the_input_findings() -> None:
    body = request(call("c", GLOBAL), output("c"), messages=CHAT)
    verdict = inspect(body, Policy())
    assert [(f.where, f.reason) for f in verdict.findings] == [
        ("messages", "envelope"),
        ("input[1]", "arguments_schema"),
    ]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"model": "m", "messages": "hi"}, id="messages-not-an-array"),
        pytest.param({"model": "m", "message": []}, id="another-key"),
    ],
)
def test_not_a_chat_completions_body(body: dict[str, Any]) -> None:
    assert inspect(body, Policy()) == Verdict(Outcome.FORWARD)


REBUILT = [
    pytest.param(
        output("c") | {"content": "secret", "result": {"rows": 1}},
        {"type": "function_call_output", "call_id": "c", "output": "R"},
        id="other-fields-gone",
    ),
    pytest.param(
        {"id": "fco_1", "call_id": "c", "output": "secret", "status": "completed", "x": 1},
        {"id": "fco_1", "call_id": "c", "output": "R", "status": "completed"},
        id="spec-fields-kept-in-order",
    ),
    pytest.param(
        {"call_id": "c", "output": ["secret"], "extra": "secret"},
        {"call_id": "c", "output": "R"},
        id="typeless",
    ),
]


@pytest.mark.parametrize(("item", "rebuilt"), REBUILT)
def test_rewritten_output(item: dict[str, Any], rebuilt: dict[str, Any]) -> None:
    got = rewritten_output(item, "R")
    assert got == rebuilt
    assert list(got) == list(rebuilt)


def test_rewrite_forwards_nothing_else_of_the_output() -> None:
    failing_output = output("c") | {"content": [{"type": "output_text", "text": "secret"}]}
    verdict = inspect(request(call("c", GLOBAL), failing_output), Policy(action="rewrite"))
    assert verdict.input is not None
    rewritten = verdict.input[1]
    assert set(rewritten) == {"type", "call_id", "output"}
    assert "secret" not in json.dumps(verdict.input)


@pytest.mark.parametrize(
    ("max_body_bytes", "outcome"),
    [
        pytest.param(None, "rewrite", id="no-limit"),
        pytest.param(1024 * 1024, "rewrite", id="room"),
        pytest.param(64 * 1024, "block", id="records-over"),
    ],
)
def test_a_rewrite_past_the_body_limit_is_blocked_unbuilt(
    max_body_bytes: int | None, outcome: str
) -> None:
    # Ten calls of 40 elements, each rewritten to a record of some 38 KB.
    pairs = [item for n in range(10) for item in (pick_call(f"c{n}", 40), output(f"c{n}"))]
    body = request(*pairs, tools=[PICK_TOOL])
    verdict = inspect(body, Policy(action="rewrite"), bounds=Bounds(max_body_bytes=max_body_bytes))
    assert verdict.outcome == outcome
    assert {f.action for f in verdict.findings} == {outcome}
    if outcome == "block":
        assert verdict.input is None
        assert verdict.note is not None
        assert verdict.note.startswith("the body with its outputs rewritten would be more than ")
        assert verdict.note.endswith("bytes, over limits.max_body_bytes (65536): blocked instead")
        error = rejection(verdict)["error"]
        assert error["message"].startswith(verdict.note + ". input[1] (call_id c0): ")
