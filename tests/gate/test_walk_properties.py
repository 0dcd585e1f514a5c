"""The gate's walk over input takes shortcuts for the commonest items (a function_call paired
first, a plain message's kind read without its every reading): on generated items, each says
what the general definitions in `items` say."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.gate import items
from proxy.gate.caches import GateCaches
from proxy.gate.pairing import Pairing
from proxy.gate.policy import Policy
from proxy.gate.verdict import Bounds, _Inspection, inspect
from proxy.gate.vocabulary import VOCABULARIES, Kind, Vocabulary, vocabulary_of
from tests.gate.test_gate_properties import (
    INPUT_ITEMS,
    JSON,
    LEDGERS,
    SALES_TOOL,
    SCALARS,
    SETTINGS,
    Ledger,
    answered,
    mostly,
    policies,
)

# The members every reading of a typeless item looks at, and a few it does not.
READ_MEMBERS = st.sampled_from(
    [
        "type",
        "id",
        "role",
        "content",
        "call_id",
        "name",
        "output",
        "summary",
        "encrypted_content",
        "arguments",
        "status",
    ]
)
TYPELESS = st.dictionaries(READ_MEMBERS, SCALARS, max_size=5).map(
    lambda item: item if item.get("type") else {k: v for k, v in item.items() if k != "type"}
)
VOCABULARY = st.sampled_from([vocabulary_of(None), *VOCABULARIES.values()])


def read_kind(item: Any) -> str | None:
    """`items.kind` as its docstring defines it: the type, else the one reading."""
    if not isinstance(item, dict):
        return None
    item_type = item.get("type")
    if not item_type:
        found = items.readings(item)
        return next(iter(found)) if len(found) == 1 else None
    return item_type if isinstance(item_type, str) else None


@SETTINGS
@given(item=TYPELESS | JSON)
def test_an_items_kind_is_its_type_or_its_one_reading(item: Any) -> None:
    assert items.kind(item) == read_kind(item)


def indexed(input_items: list[Any], vocabulary: Vocabulary) -> tuple[dict[str, list[int]], ...]:
    """The candidates and outputs of `input_items` by pairing key, as `items` reads each item
    on its own: an output under the key its family answers by, any other object but a
    reference under its `pairing_key`."""
    candidates: dict[str, list[int]] = {}
    outputs: dict[str, list[int]] = {}
    for index, item in enumerate(input_items):
        family = vocabulary.output_of(items.kind(item))
        if family is not None:
            key = items.answered_key(item, family.pairs_by)
            if key is not None:
                outputs.setdefault(key, []).append(index)
        elif items.kind(item) != items.ITEM_REFERENCE and isinstance(item, dict):
            key = items.pairing_key(item)
            if key is not None:
                candidates.setdefault(key, []).append(index)
    return candidates, outputs


@SETTINGS
@given(input_items=INPUT_ITEMS, ledger=LEDGERS, vocabulary=VOCABULARY)
def test_pairing_indexes_each_item_as_items_reads_it(
    input_items: list[Any], ledger: Ledger, vocabulary: Vocabulary
) -> None:
    pairing = Pairing(input_items, ledger, vocabulary)
    assert pairing.kinds == [items.kind(item) for item in input_items]
    assert (pairing.candidates, pairing.outputs) == indexed(input_items, vocabulary)


@SETTINGS
@given(input_items=INPUT_ITEMS, ledger=LEDGERS, vocabulary=VOCABULARY)
def test_paired_counts_the_candidates_before_each_output(
    input_items: list[Any], ledger: Ledger, vocabulary: Vocabulary
) -> None:
    """`paired` counts what precedes an output: the inline calls and references by bisection,
    the calls of the compaction items before it and of the recorded chain in full."""
    pairing = Pairing(input_items, ledger, vocabulary)
    for call_id, found in pairing.outputs.items():
        for index in found:
            inline, by_reference, upstream = pairing.paired(index, call_id)
            assert inline == sum(1 for i in pairing.candidates.get(call_id, []) if i < index)
            assert by_reference == sum(1 for i in pairing.referenced.get(call_id, []) if i < index)
            compacted = [c for at, c in pairing.compacted.get(call_id, []) if at < index]
            assert list(upstream) == [*compacted, *ledger.calls(call_id)]


def inspection(body: dict[str, Any], policy: Policy, ledger: Ledger, caches: GateCaches) -> Any:
    """The pass `inspect` makes over `body`, before it has looked at any item."""
    return _Inspection(body, body["input"], policy, ledger, caches, Bounds())


def outputs_of(walk: Any) -> list[tuple[int, Any, str, Kind]]:
    """(index, output, the call_id it answers, its family) of each output of the walk's input."""
    found = []
    for index, item_kind in enumerate(walk.pairing.kinds):
        family = walk.vocabulary.output_of(item_kind)
        if family is not None:
            call_id = items.answered_key(walk.input[index], family.pairs_by)
            if call_id is not None:
                found.append((index, walk.input[index], call_id, family))
    return found


# Histories most of whose pairs pass (a conversation re-sent), among any other items: outputs
# answered twice, before their call, by a call also recorded or referenced, with content parts.
CLEAN_CALLS = st.fixed_dictionaries(
    {
        "type": st.just("function_call"),
        "call_id": st.sampled_from(["a", "b", "c", "d", "e", "f", "g", "fc_a"]),
        "name": st.sampled_from(["get_latest_sales_report", "get_latest_sales_report", "lookup"]),
        "arguments": st.sampled_from(['{"region":"apac"}', '{"region":"emea"}', '{"region":1}']),
        "status": mostly(st.just("completed"), st.sampled_from(["in_progress", None])),
    },
    optional={"id": st.sampled_from(["fc_a", "fc_b"])},
)
CLEAN_OUTPUTS = st.fixed_dictionaries(
    {
        "type": mostly(st.just("function_call_output"), st.sampled_from([None, ""])),
        "call_id": st.sampled_from(["a", "b", "c", "d", "e", "f", "g", "fc_a"]),
        "output": mostly(
            st.text(max_size=3), st.lists(st.fixed_dictionaries({"type": st.just("x")}))
        ),
    }
)
CLEAN_PAIRS = st.builds(answered, CLEAN_CALLS, CLEAN_OUTPUTS)
# A call also sent again, or also referenced (`fc_a` is recorded as call `a`), answered once.
SENT_TWICE = CLEAN_PAIRS.map(lambda pair: [pair[0], dict(pair[0]), pair[1]])
REFERENCED = CLEAN_PAIRS.map(
    lambda pair: [
        pair[0] | {"call_id": "a"},
        {"type": "item_reference", "id": "fc_a"},
        pair[1] | {"call_id": "a"},
    ]
)
# A call also compacted (`cmp_a` is recorded as a compaction of call `a`), answered once.
COMPACTED = CLEAN_PAIRS.map(
    lambda pair: [
        pair[0] | {"call_id": "a"},
        {"type": "compaction", "id": "cmp_a"},
        pair[1] | {"call_id": "a"},
    ]
)
HISTORIES = st.lists(
    st.one_of(
        CLEAN_PAIRS,
        SENT_TWICE,
        REFERENCED,
        COMPACTED,
        CLEAN_PAIRS.map(lambda pair: pair[::-1]),
        st.lists(CLEAN_CALLS | CLEAN_OUTPUTS, max_size=2),
        INPUT_ITEMS,
    ),
    max_size=6,
).map(lambda segments: {"input": [i for s in segments for i in s], "tools": [SALES_TOOL]})
RECORDED_A = {"type": "function_call", "id": "fc_a", "call_id": "a", "name": "lookup"}
COMPACTION_A = {"type": "compaction", "id": "cmp_a", "calls": [RECORDED_A]}


class ItemsOnly(Ledger):
    """A ledger whose items resolve by id (a reference, a compaction), and no chain: the calls
    they stand for are found only through them."""

    def calls(self, call_id: str) -> list[Any]:
        return []


RECORDED = st.builds(Ledger, st.lists(CLEAN_CALLS | st.just(RECORDED_A), max_size=2)) | st.just(
    ItemsOnly([RECORDED_A, COMPACTION_A])
)


@settings(SETTINGS, max_examples=400)
@given(body=HISTORIES, policy=policies(), ledger=RECORDED)
def test_an_output_passes_as_before_only_where_it_is_judged_clean(
    body: dict[str, Any], policy: Policy, ledger: Ledger
) -> None:
    """With the caches of earlier turns (each call of the body, answered alone) and of the body
    itself, every output `passes_as_before` is one `judge_output` finds nothing in, after the
    same steps of the quick acceptor."""
    caches = GateCaches.for_policy(policy)
    # Each call answered alone first, as an earlier turn would have: those that pass are
    # remembered, whatever this body does with them.
    for call in body["input"]:
        if isinstance(call, dict) and isinstance(call.get("call_id"), str):
            answer = {"type": "function_call_output", "call_id": call["call_id"], "output": ""}
            alone = [call, answer]
            inspect({**body, "input": alone}, policy, ledger, caches)
    inspect(body, policy, ledger, caches)
    quick, judged = (
        inspection(body, policy, ledger, caches),
        inspection(body, policy, ledger, caches),
    )
    for index, output, call_id, family in outputs_of(quick):
        if quick.passes_as_before(index, output, call_id, family):
            assert judged.judge_output(index, output, family) is None
        else:
            judged.judge_output(index, output, family)
            quick.judge_output(index, output, family)
        assert quick.steps.left == judged.steps.left


def test_a_history_sent_again_passes_as_before() -> None:
    """The case the shortcut is for: a call and its output, judged once, sent again."""
    body: dict[str, Any] = {
        "input": [
            {"role": "user", "content": "hi"},
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "get_latest_sales_report",
                "arguments": '{"region":"apac"}',
                "status": "completed",
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "[]"},
        ],
        "tools": [SALES_TOOL],
    }
    policy, caches, ledger = Policy(), GateCaches.for_policy(Policy()), Ledger(())
    walk = inspection(body, policy, ledger, caches)
    [(index, output, call_id, family)] = outputs_of(walk)
    assert not walk.passes_as_before(index, output, call_id, family)
    assert inspect(body, policy, ledger, caches).findings == ()
    walk = inspection(body, policy, ledger, caches)
    assert walk.passes_as_before(index, output, call_id, family)
    # Another output of the same call, a reference or a recorded call: judged in full.
    twice = {**body, "input": [*body["input"], output]}
    walk = inspection(twice, policy, ledger, caches)
    assert not walk.passes_as_before(index, output, call_id, family)
    recorded = Ledger([body["input"][1]])
    walk = inspection(body, policy, recorded, caches)
    assert not walk.passes_as_before(index, output, call_id, family)
