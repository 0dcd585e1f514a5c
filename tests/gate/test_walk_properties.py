"""The gate's walk over input takes shortcuts for the commonest items (a function_call paired
first, a plain message's kind read without its every reading): on generated items, each says
what the general definitions in `items` say."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.gate import items
from proxy.gate.pairing import Pairing
from proxy.gate.vocabulary import VOCABULARIES, Vocabulary, vocabulary_of
from tests.gate.test_gate_properties import (
    INPUT_ITEMS,
    JSON,
    LEDGERS,
    SCALARS,
    SETTINGS,
    Ledger,
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
