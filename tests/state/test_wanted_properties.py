"""What a request wants of the ledger, found in one pass over its input: on generated bodies,
the ids each item asks for on its own, in input order, each call_id once."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.gate import items
from proxy.state.ledger_view import Wanted
from proxy.state.recording import COMPACTION
from tests.gate.test_gate_properties import BODIES, JSON, SCALARS, SETTINGS

COMPACTIONS = st.fixed_dictionaries(
    {"type": st.just(COMPACTION), "id": st.sampled_from(["cmp_1", "cmp_2"])},
    optional={"encrypted_content": st.just("x")},
)
# Items of every shape the keys make: typeless, ambiguous, typed with a number, with a status.
ODD_ITEMS = st.dictionaries(
    st.sampled_from(["type", "id", "call_id", "name", "output", "role", "status"]),
    SCALARS | st.sampled_from(["function_call", "item_reference", "a", "b"]),
    max_size=4,
)


def wanted_by_each_item(body: dict[str, Any], *, provenance: bool) -> Wanted | None:
    """`Wanted.of` read item by item: each reference's and compaction's id, and the pairing key
    of each call looked up (every candidate under provenance, else a typed function_call with
    no status)."""
    listed = body.get("input")
    listed = listed if isinstance(listed, list) else []
    reference_ids = [
        ref
        for item in listed
        if items.kind(item) in (items.ITEM_REFERENCE, COMPACTION)
        if (ref := items.reference_id(item)) is not None
    ]
    call_ids: list[str] = []
    for item in listed:
        looked_up = provenance or (
            isinstance(item, dict)
            and item.get("type") == items.FUNCTION_CALL
            and item.get("status") is None
        )
        key = items.pairing_key(item) if looked_up else None
        if key is not None and key not in call_ids:
            call_ids.append(key)
    previous = body.get("previous_response_id")
    if not isinstance(previous, str) and not reference_ids and not call_ids:
        return None
    return Wanted(previous if isinstance(previous, str) else None, reference_ids, call_ids)


@SETTINGS
@given(
    body=BODIES,
    extra=st.lists(COMPACTIONS | ODD_ITEMS | JSON, max_size=4),
    provenance=st.booleans(),
)
def test_wanted_is_what_each_item_asks_for(
    body: dict[str, Any], extra: list[Any], provenance: bool
) -> None:
    body = {**body, "input": [*body["input"], *extra]}
    assert Wanted.of(body, provenance=provenance) == wanted_by_each_item(
        body, provenance=provenance
    )
