"""Properties of `inspect` on generated bodies: it never raises, never forwards a failing pair."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from copy import deepcopy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.gate import items
from proxy.gate.caches import GateCaches
from proxy.gate.items import Item
from proxy.gate.policy import Policy
from proxy.gate.reasons import ACTIONS, ALL_REASONS, NOT_REWRITTEN
from proxy.gate.verdict import Verdict, inspect, judges_nothing

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
)
KEYS = st.sampled_from(["type", "id", "call_id", "name", "arguments", "input", "role"])
JSON: st.SearchStrategy[Any] = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(KEYS | st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=6,
)


ROLL = st.integers(0, 3)


@st.composite
def mostly(draw: st.DrawFn, common: st.SearchStrategy[Any], rare: st.SearchStrategy[Any]) -> Any:
    """`common` three times in four, so that most items are well formed and most pairs pass."""
    # Not st.one_of(common, common, common, rare): one_of drops repeated branches.
    return draw(rare) if draw(ROLL) == 0 else draw(common)


SALES = {
    "type": "object",
    "additionalProperties": False,
    "required": ["region"],
    "properties": {"region": {"enum": ["apac", "emea", "amer"]}},
}
SALES_TOOL = {"type": "function", "name": "get_latest_sales_report", "parameters": SALES}

CALL_IDS = mostly(st.sampled_from(list("abcdefgh")), SCALARS)
NAMES = mostly(st.sampled_from(["get_latest_sales_report", "lookup", "missing"]), SCALARS)
TYPES = st.sampled_from(
    ["function_call", "function_call_output", "message", "reasoning", "openai:web_search_call"]
)
STATUSES = mostly(st.just("completed"), st.sampled_from(["in_progress", "incomplete", None]))
ARGUMENTS = mostly(
    st.sampled_from(['{"region":"apac"}', '{"region":"emea"}', '{"region":"global"}']),
    st.sampled_from(
        [
            '{"region":"apac","region":"emea"}',
            '{"region":"apac","x":{"a":1,"a":1}}',
            '{"region":NaN}',
            '{"region":"apac"} {}',
            '{"region":"\\ud800"}',
            "{}",
            "",
            "[",
        ]
    )
    | JSON,
)
SCHEMA_KEYS = st.sampled_from(
    [
        "type",
        "properties",
        "required",
        "enum",
        "$ref",
        "$defs",
        "$schema",
        "$id",
        "additionalProperties",
        "patternProperties",
        "pattern",
        "items",
        "definitions",
        "allOf",
    ]
)
SCHEMA_VALUES = SCALARS | st.sampled_from(["object", "string", "#/$defs/a", "#", "^a+$", "("])
SCHEMAS: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from(
        [
            SALES,
            {"$ref": "#/$defs/a", "$defs": {"a": {"type": "object"}}},
            {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"},
            {"$schema": "urn:unknown"},
            {"$ref": "#/nowhere"},
            {"$ref": "#"},
            {"type": 12},
            {},
            True,
            False,
        ]
    ),
    st.fixed_dictionaries({"$schema": JSON}),
    st.recursive(
        SCHEMA_VALUES,
        lambda children: (
            st.dictionaries(SCHEMA_KEYS, children, max_size=3) | st.lists(children, max_size=3)
        ),
        max_leaves=6,
    ),
)

FUNCTION_CALLS = st.fixed_dictionaries(
    {
        "type": mostly(
            st.just("function_call"), st.sampled_from(["acme:call", "custom_tool_call"])
        ),
        "call_id": CALL_IDS,
        "name": NAMES,
        "arguments": ARGUMENTS,
    },
    optional={"status": STATUSES, "id": st.sampled_from(["fc_a", "fc_b", "fc_c"]), "x": SCALARS},
)
OUTPUTS = st.fixed_dictionaries(
    {"type": st.just("function_call_output"), "call_id": CALL_IDS},
    optional={"output": SCALARS, "status": STATUSES},
)


def answered(call: dict[str, Any], output: dict[str, Any]) -> list[Any]:
    return [call, output | {"call_id": call["call_id"]}]


PAIRS = st.builds(answered, FUNCTION_CALLS, OUTPUTS)
OTHER_ITEMS = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": SCALARS}),
    st.fixed_dictionaries(
        {"type": st.just("item_reference"), "id": st.sampled_from(["fc_a", "fc_b", "x"])}
    ),
    st.fixed_dictionaries({"id": st.sampled_from(["fc_a", "fc_c"])}),
    st.fixed_dictionaries({"type": TYPES, "id": st.sampled_from(["a", "b", "rs_1"])}),
    st.dictionaries(st.sampled_from(["type", "id", "call_id", "role"]), SCALARS),
    JSON,
)
# Chat Completions envelopes: a tool message, an assistant message with tool_calls, an output
# carrying tool_call_id.
ENVELOPES = st.one_of(
    st.fixed_dictionaries(
        {"role": st.just("tool"), "content": SCALARS}, optional={"tool_call_id": CALL_IDS}
    ),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "tool_calls": st.lists(SCALARS, max_size=2)}
    ),
    OUTPUTS.map(lambda item: item | {"tool_call_id": item["call_id"]}),
)
SEGMENTS = mostly(
    PAIRS,
    st.lists(FUNCTION_CALLS | OUTPUTS | OTHER_ITEMS, min_size=1, max_size=2)
    | st.lists(ENVELOPES, max_size=1)
    | PAIRS.map(lambda pair: pair[::-1]),
)
INPUT_ITEMS: st.SearchStrategy[list[Any]] = st.lists(SEGMENTS, max_size=6).map(
    lambda segments: [item for segment in segments for item in segment]
)
TOOLS = st.one_of(
    st.just([SALES_TOOL]),
    st.lists(
        st.one_of(
            st.just(SALES_TOOL),
            st.fixed_dictionaries(
                {"type": st.just("function"), "name": NAMES, "parameters": SCHEMAS}
            ),
            st.fixed_dictionaries(
                {
                    "type": st.just("function"),
                    "function": st.fixed_dictionaries({"name": NAMES, "parameters": SCHEMAS}),
                }
            ),
            JSON,
        ),
        max_size=3,
    ),
    st.none(),
    st.just("tools"),
)
BODIES = st.fixed_dictionaries(
    {"input": INPUT_ITEMS, "tools": TOOLS},
    optional={"previous_response_id": st.just("resp_1")},
)
PINNED = st.sampled_from(
    [{}, {}, {"get_latest_sales_report": {"type": "object"}}, {"lookup": False}]
)


def policies(actions: Sequence[str] = ACTIONS) -> st.SearchStrategy[Policy]:
    return st.builds(
        Policy,
        action=st.sampled_from(actions),
        actions=st.dictionaries(st.sampled_from(ALL_REASONS), st.sampled_from(actions)).map(
            lambda chosen: {
                reason: action
                for reason, action in chosen.items()
                if not (action == "rewrite" and reason in NOT_REWRITTEN)
            }
        ),
        allow_missing_status=st.booleans(),
        require_provenance=mostly(st.just(False), st.just(True)),
        vendor=st.sampled_from([None, "acme", "openai"]),
        tools=PINNED,
    )


class Ledger:
    """A Recorded double over a fixed list of upstream items."""

    trust_unpaired = False

    def __init__(self, upstream: Sequence[Any]) -> None:
        self.upstream = [item for item in upstream if isinstance(item, Mapping)]

    def calls(self, call_id: str) -> Sequence[Item]:
        return [item for item in self.upstream if items.pairing_key(item) == call_id]

    def item(self, item_id: str) -> Item | None:
        return next((item for item in self.upstream if item.get("id") == item_id), None)

    def emitted_statuses(self, call: Item) -> Sequence[Any]:
        return [item.get("status") for item in self.upstream if call is item]

    def mcp_lists(self) -> Sequence[Item]:
        return ()


LEDGERS = st.builds(Ledger, st.lists(FUNCTION_CALLS | OTHER_ITEMS, max_size=3))


@SETTINGS
@given(body=JSON, policy=policies())
def test_never_raises_on_any_json(body: Any, policy: Policy) -> None:
    verdict = inspect(body, policy)
    assert verdict.outcome in ("forward", "rewrite", "strip", "block")
    verdict = inspect({"input": body, "tools": body}, policy)
    assert verdict.outcome in ("forward", "rewrite", "strip", "block")
    if isinstance(body, list):
        inspect({"input": [body, *body]}, policy)


@SETTINGS
@given(body=BODIES, policy=policies(), ledger=LEDGERS)
def test_never_raises_on_request_shaped_bodies(body: Any, policy: Policy, ledger: Ledger) -> None:
    verdict = inspect(body, policy, ledger)
    assert verdict.outcome in ("forward", "rewrite", "strip", "block")
    assert (verdict.input is not None) == (verdict.outcome in ("strip", "rewrite"))
    if verdict.outcome == "forward":
        assert all(f.action == "log" for f in verdict.findings)


def dangling_calls(original: Sequence[Any], forwarded: Sequence[Any]) -> set[str]:
    """Keys the forwarded input has calls for and no outputs, where the original had both."""

    def keys(input_items: Sequence[Any]) -> tuple[set[str], set[str]]:
        calls: set[str] = set()
        answered: set[str] = set()
        for item in input_items:
            if items.is_output(item):
                call_id = items.output_call_id(item)
                if call_id is not None:
                    answered.add(call_id)
            else:
                key = items.pairing_key(item)
                if key is not None:
                    calls.add(key)
        return calls, answered

    calls, answered = keys(forwarded)
    _, answered_before = keys(original)
    return {key for key in calls - answered if key in answered_before}


def forwarded(body: dict[str, Any], verdict: Verdict) -> dict[str, Any]:
    return body | {"input": verdict.input} if verdict.outcome == "strip" else body


@SETTINGS
@given(body=BODIES, policy=policies(actions=("block", "strip")), ledger=LEDGERS)
def test_never_forwards_a_failing_pair(body: Any, policy: Policy, ledger: Ledger) -> None:
    verdict = inspect(body, policy, ledger)
    if verdict.outcome == "block":
        assert verdict.findings
        return
    sent = forwarded(body, verdict)
    # Gated again with the same settings, what is forwarded has nothing left to find.
    assert inspect(sent, policy, ledger).findings == ()
    assert dangling_calls(body["input"], sent["input"]) == set()
    if verdict.outcome == "strip":
        assert verdict.input is not None
        # The forwarded input is the original with items removed, in order, untouched.
        remaining = iter(body["input"])
        assert all(any(item is kept for kept in remaining) for item in verdict.input)


@SETTINGS
@given(body=BODIES, policy=policies(), ledger=LEDGERS)
def test_cached_verdicts_match_fresh_ones(body: Any, policy: Policy, ledger: Ledger) -> None:
    caches = GateCaches.for_policy(policy)
    warm = inspect(body, policy, ledger, caches)
    again = inspect(body, policy, ledger, caches)
    fresh = inspect(body, policy, ledger, GateCaches.for_policy(policy))
    assert again == warm == fresh
    if warm.outcome == "forward":
        # Logged findings leave the request as it was; the header counts them.
        assert all(f.action == "log" for f in warm.findings)
        assert warm.header() == (f"logged={len(warm.findings)}" if warm.findings else None)


@SETTINGS
@given(body=BODIES, policy=policies(), ledger=LEDGERS)
def test_a_session_re_sending_its_history_gets_fresh_verdicts(
    body: Any, policy: Policy, ledger: Ledger
) -> None:
    """Turn by turn, each turn's input the one before with one more item, copied as if read
    from the wire again: what the caches remember (calls that passed, among them) never
    changes a verdict."""
    caches = GateCaches.for_policy(policy)
    history = body["input"] if isinstance(body.get("input"), list) else []
    for end in range(len(history) + 1):
        turn = {**body, "input": deepcopy(history[:end])}
        fresh = inspect(turn, policy, ledger, GateCaches.for_policy(policy))
        assert inspect(turn, policy, ledger, caches) == fresh


# -- `judges_nothing`: the bodies admission answers clean without pairing them ----------------

# Items that read as messages or nearly: a role, a type, and now and then a member that makes
# one something else (an envelope's, an output's, a call's, a reference's, a reasoning item's).
MESSAGE_LIKE = st.fixed_dictionaries(
    {"content": st.sampled_from(["hi", [{"type": "input_text", "text": "hi"}]])},
    optional={
        "role": st.sampled_from(["user", "assistant", "system", "developer", "tool", 7]),
        "type": st.sampled_from(["message", "function_call_output", "openai:note", "", None]),
        "tool_call_id": st.just("call_1"),
        "tool_calls": st.just([]),
        "call_id": st.just("call_1"),
        "output": st.just("42"),
        "id": st.just("msg_1"),
        "summary": st.just([]),
        "encrypted_content": st.just("e"),
    },
)
NEARLY_MESSAGES = st.lists(mostly(MESSAGE_LIKE, JSON), max_size=5)


@SETTINGS
@given(
    listed=NEARLY_MESSAGES,
    tools=TOOLS,
    chat=st.booleans(),
    policy=policies(),
    ledger=LEDGERS,
)
def test_a_body_judged_for_nothing_is_clean_when_judged_in_full(
    listed: list[Any], tools: Any, chat: bool, policy: Policy, ledger: Ledger
) -> None:
    body: dict[str, Any] = {"model": "m", "input": listed, "tools": tools}
    if chat:
        body["messages"] = [{"role": "user", "content": "hi"}]
    if judges_nothing(body):
        assert inspect(body, policy, ledger) == inspect({"input": []}, policy)


def test_judges_nothing_is_said_of_messages_alone() -> None:
    user = {"role": "user", "content": "hi"}
    assistant = {"type": "message", "role": "assistant", "content": [], "id": "msg_1"}
    assert judges_nothing({"input": [user, assistant], "tools": [{"type": "function"}]})
    assert judges_nothing({"input": []})
    others: list[Any] = [
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},  # an envelope
        {"role": "assistant", "tool_calls": [], "content": None},
        {"call_id": "call_1", "output": "42"},  # a typeless output
        {"role": "user", "content": "hi", "call_id": "call_1", "output": "4"},  # which?
        {"type": "function_call", "call_id": "c", "name": "n", "arguments": "{}"},
        {"type": "item_reference", "id": "msg_1"},
        "not an item",
    ]
    for other in others:
        assert not judges_nothing({"input": [user, other]}), other
    assert not judges_nothing({"input": [user], "messages": [user]})
    assert not judges_nothing({"input": "hi"})
