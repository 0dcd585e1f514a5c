"""The gate's caches: what is revalidated, what is compiled once, and their bounds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

import pytest
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

from proxy.gate.caches import GateCaches
from proxy.gate.policy import Policy
from proxy.gate.schemas import Compiled, SchemaCache, SchemaLimits
from proxy.gate.verdict import inspect
from tests.builders import APAC, GLOBAL, TOOLS, call, message, only, output, request, tool
from tests.builders import SALES_SCHEMA as SALES


class CountingValidator:
    """A real validator that counts the instances it is asked to validate."""

    def __init__(self, inner: Validator, seen: list[Any]) -> None:
        self.inner = inner
        self.seen = seen

    def iter_errors(self, instance: Any) -> Iterator[ValidationError]:
        self.seen.append(instance)
        return self.inner.iter_errors(instance)


class CountingSchemas(SchemaCache):
    """The request-schema cache, with each compiled schema's validations recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.validated: list[Any] = []
        self.compiled: dict[int, Compiled] = {}

    def compile(self, schema: Any, limits: SchemaLimits | None = None) -> Compiled:
        found = super().compile(schema, limits)
        if found.key not in self.compiled:
            counting = CountingValidator(found.validator, self.validated)
            self.compiled[found.key] = Compiled(
                found.key, cast(Validator, counting), found.patterns
            )
        return self.compiled[found.key]


def counted(max_cached_verdicts: int = 65536) -> tuple[Policy, GateCaches, list[Any]]:
    schemas = CountingSchemas()
    policy = Policy(max_cached_verdicts=max_cached_verdicts)
    return policy, GateCaches.for_policy(policy, schemas), schemas.validated


def test_repeated_call_is_not_revalidated() -> None:
    policy, caches, validated = counted()
    turn_1 = [message("q"), call("a", GLOBAL), output("a")]
    turn_2 = [*turn_1, call("b"), output("b")]
    turn_3 = [*turn_2, call("c", '{"region":"emea"}'), output("c")]
    first = inspect(request(*turn_1), policy, caches=caches)
    inspect(request(*turn_2), policy, caches=caches)
    third = inspect(request(*turn_3), policy, caches=caches)
    assert validated == [{"region": "global"}, {"region": "apac"}, {"region": "emea"}]
    # A remembered failure is still reported in full.
    assert first.findings == third.findings[:1]
    assert only(first)["fail"] == [
        {"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}
    ]


def test_identical_call_under_other_call_id_is_not_revalidated() -> None:
    policy, caches, validated = counted()
    inspect(request(call("a"), output("a"), call("b"), output("b")), policy, caches=caches)
    assert validated == [{"region": "apac"}]


@pytest.mark.parametrize(
    ("second_arguments", "second_tools", "validations", "second_reason"),
    [
        pytest.param(APAC, TOOLS, 1, None, id="same-call"),
        pytest.param('{"region":"emea"}', TOOLS, 2, None, id="changed-arguments"),
        pytest.param('{ "region":"apac"}', TOOLS, 2, None, id="changed-whitespace"),
        pytest.param(
            APAC,
            [tool(SALES | {"properties": {"region": {"const": "emea"}}})],
            2,
            "arguments_schema",
            id="changed-schema",
        ),
        pytest.param(
            APAC, [tool(dict(reversed(SALES.items())))], 1, None, id="same-schema-other-key-order"
        ),
        pytest.param(APAC, [], 1, "unknown_tool", id="schema-gone"),
    ],
)
def test_cache_revalidates_what_changed(
    second_arguments: str, second_tools: list[Any], validations: int, second_reason: str | None
) -> None:
    policy, caches, validated = counted()
    inspect(request(call("a"), output("a")), policy, caches=caches)
    verdict = inspect(
        request(call("a", second_arguments), output("a"), tools=second_tools), policy, caches=caches
    )
    assert len(validated) == validations
    assert [f.reason for f in verdict.findings] == ([second_reason] if second_reason else [])


def test_verdict_cache_is_bounded() -> None:
    policy, caches, validated = counted(max_cached_verdicts=2)
    regions = ["apac", "emea", "amer", "apac"]
    for region in regions:
        inspect(
            request(call("c", json.dumps({"region": region})), output("c")), policy, caches=caches
        )
    # apac was forgotten when amer came in, so it is checked again.
    assert [v["region"] for v in validated] == regions
    assert len(caches.verdicts) == 2


def test_pinned_schema_verdict_is_cached() -> None:
    policy = Policy(tools={"get_latest_sales_report": SALES})
    caches = GateCaches.for_policy(policy)
    for _ in range(3):
        verdict = inspect(request(call("a", GLOBAL), output("a"), tools=[]), policy, caches=caches)
        assert only(verdict)["reason"] == "arguments_schema"
    assert len(caches.verdicts) == 1
    assert len(caches.schemas) == 0


def test_each_distinct_request_schema_is_compiled_once() -> None:
    policy = Policy()
    caches = GateCaches.for_policy(policy)
    other = {"type": "object", "required": ["order_id"]}
    bodies = [
        request(call("a"), output("a")),
        request(call("a"), output("a"), tools=[tool(json.loads(json.dumps(SALES)))]),
        request(call("b", name="lookup"), output("b"), tools=[*TOOLS, tool(other, "lookup")]),
        request(call("c", "{}", name="lookup"), output("c"), tools=[tool(other, "lookup")]),
        request(call("d"), output("d"), tools=[tool({"type": 12})]),
        request(call("d", "[]"), output("d"), tools=[tool({"type": 12})]),
    ]
    for body in bodies:
        inspect(body, policy, caches=caches)
    assert len(caches.schemas) == 3


def test_a_passing_call_re_sent_is_not_judged_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stateless conversation re-sends its history every turn: a call that passed is
    remembered by its fields, and only its output is looked at again."""
    from proxy.gate import verdict

    policy, caches, _ = counted()
    history = [message("q"), call("a"), output("a"), call("b", '{"region":"emea"}'), output("b")]
    assert inspect(request(*history), policy, caches=caches).outcome == "forward"
    assert len(caches.passed_calls) == 2
    judged: list[Any] = []
    whole = verdict._Inspection.judge_call

    def counting(self: Any, call: Any, *args: Any, **kwargs: Any) -> Any:
        judged.append(call["call_id"])
        return whole(self, call, *args, **kwargs)

    monkeypatch.setattr(verdict._Inspection, "judge_call", counting)
    # Parsed again from the wire: equal items, not the same objects.
    turn_2 = json.loads(json.dumps(request(*history, call("c"), output("c"))))
    assert inspect(turn_2, policy, caches=caches).outcome == "forward"
    assert judged == ["c"]


PASSING = call("a")
# A call or output that differs from the remembered pair in one way, and its verdict with
# fresh caches: the remembered pass must never stand in for it.
VARIANTS = {
    "arguments": (call("a", GLOBAL), output("a")),
    "status": (call("a", status="in_progress"), output("a")),
    "status missing": ({k: v for k, v in PASSING.items() if k != "status"}, output("a")),
    "integer id": (call("a", id=1), output("a")),
    "true status": (call("a", status=True), output("a")),
    "name": (call("a", name="get latest sales report"), output("a")),
    "output status": (PASSING, {**output("a"), "status": "bogus"}),
    "output parts": (PASSING, {**output("a"), "output": [{"type": "input_text"}]}),
    "output number": (PASSING, {**output("a"), "output": 1}),
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "tools",
    [TOOLS, [tool({"type": "object", "required": ["week"]})]],
    ids=["same tools", "other schema"],
)
def test_a_remembered_pass_never_stands_in_for_another_verdict(
    variant: str, tools: list[Any]
) -> None:
    policy, caches, _ = counted()
    assert inspect(request(PASSING, output("a")), policy, caches=caches).outcome == "forward"
    assert len(caches.passed_calls) == 1
    changed = request(*VARIANTS[variant], tools=tools)
    fresh = inspect(changed, policy, caches=GateCaches.for_policy(policy))
    assert inspect(changed, policy, caches=caches) == fresh
    assert fresh.outcome != "forward"


def test_the_same_call_under_another_schema_is_judged_again() -> None:
    policy, caches, _ = counted()
    inspect(request(PASSING, output("a")), policy, caches=caches)
    stricter = [tool({"type": "object", "required": ["week"]})]
    verdict = inspect(request(PASSING, output("a"), tools=stricter), policy, caches=caches)
    assert only(verdict)["reason"] == "arguments_schema"
