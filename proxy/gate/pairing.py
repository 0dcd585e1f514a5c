"""Pairing each function_call_output with its call: inline, by reference, or recorded upstream."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any, Protocol

from proxy.gate import items
from proxy.gate.items import FUNCTION_CALL, Item
from proxy.gate.vocabulary import CORE, Vocabulary

COMPACTION = "compaction"


class Recorded(Protocol):
    """What the proxy recorded of earlier upstream responses (the ledger), as the gate sees it.

    `trust_unpaired` is true when the previous response a request names could not be read
    and the config fails open: an output with no pair then passes instead of being an `orphan`.
    It waives nothing else.
    """

    trust_unpaired: bool

    def calls(self, call_id: str) -> Sequence[Item]:
        """Items answering `call_id` in the `previous_response_id` chain of this request."""
        ...

    def item(self, item_id: str) -> Item | None:
        """The recorded item an `item_reference` names, if any."""
        ...

    def emitted_statuses(self, call: Item) -> Sequence[Any]:
        """The `status` of each call with this call's `call_id`, `name` and `arguments` that an
        upstream response relayed to this tenant emitted; empty when none did."""
        ...

    def mcp_lists(self) -> Sequence[Item]:
        """The `mcp_list_tools` items of the `previous_response_id` chain of this request."""
        ...


# What makes two items the same call; `id` and `status` count only where both have one.
_IDENTITY = ("type", "call_id", "name", "arguments")


def same_call(one: Item, other: Item) -> bool:
    """Whether two items found for one `call_id` are the same call reached by two routes."""
    if any(one.get(k) != other.get(k) for k in _IDENTITY):
        return False
    for key in ("id", "status"):
        mine, theirs = one.get(key), other.get(key)
        if mine is not None and theirs is not None and mine != theirs:
            return False
    return True


class NothingRecorded:
    """No ledger: only inline items pair, and nothing counts as emitted upstream."""

    trust_unpaired = False

    def calls(self, call_id: str) -> Sequence[Item]:
        return ()

    def item(self, item_id: str) -> Item | None:
        return None

    def emitted_statuses(self, call: Item) -> Sequence[Any]:
        return ()

    def mcp_lists(self) -> Sequence[Item]:
        return ()


NOTHING_RECORDED = NothingRecorded()


class Pairing:
    """Where each output's call is: the items of `input` indexed by pairing key, in input order,
    each `item_reference` resolved once through what was recorded."""

    def __init__(
        self, input_items: list[Any], recorded: Recorded, vocabulary: Vocabulary = CORE
    ) -> None:
        self.input = input_items
        self.recorded = recorded
        # Pairing keys -> indexes of inline candidates, of item_references resolving to a
        # candidate, and of outputs, in input order. Each reference is resolved once, here.
        self.candidates: dict[str, list[int]] = {}
        self.referenced: dict[str, list[int]] = {}
        self.resolved: dict[int, Item] = {}
        self.outputs: dict[str, list[int]] = {}
        # Pairing keys -> (index, call) of the calls inside each compaction item of input (the
        # ledger recorded what a `/compact` request compacted), in input order.
        self.compacted: dict[str, list[tuple[int, Item]]] = {}
        # Items that are findings of their own: references to nothing recorded, ambiguous items.
        self.unknown: set[int] = set()
        self.ambiguous: set[int] = set()
        self.kinds = kinds = [items.kind(item) for item in input_items]
        # Looked up once: this loop runs for every item of every request.
        outputs, answers, candidates = vocabulary.outputs, self.outputs, self.candidates
        for index, item_kind in enumerate(kinds):
            item = input_items[index]
            if item_kind == FUNCTION_CALL:
                # The commonest kind, first: its `pairing_key_of` is its `call_id`.
                key = item.get("call_id")
                if isinstance(key, str):
                    candidates.setdefault(key, []).append(index)
                continue
            family = outputs.get(item_kind) if item_kind is not None else None
            if family is not None:
                field = family.pairs_by
                call_id = item.get(field) if field is not None else None
                if isinstance(call_id, str):
                    answers.setdefault(call_id, []).append(index)
            elif item_kind == items.ITEM_REFERENCE:
                ref = items.reference_id(item)
                resolved = self.recorded.item(ref) if ref is not None else None
                if resolved is None:
                    # An upstream that stores items may resolve it to anything, an output too.
                    self.unknown.add(index)
                    continue
                self.add_compacted(index, resolved)
                key = items.pairing_key(resolved)
                if key is not None:
                    self.referenced.setdefault(key, []).append(index)
                    self.resolved[index] = resolved
            elif isinstance(item, dict):
                if item_kind is None and items.is_ambiguous(item):
                    self.ambiguous.add(index)
                if item_kind == COMPACTION and (ref := items.reference_id(item)) is not None:
                    compacted = self.recorded.item(ref)
                    if compacted is not None:
                        self.add_compacted(index, compacted)
                key = items.pairing_key_of(item, item_kind)
                if key is not None:
                    candidates.setdefault(key, []).append(index)

    def add_compacted(self, index: int, recorded: Item) -> None:
        """The calls a recorded compaction item stands for, found at `index` of input."""
        calls = recorded.get("calls") if recorded.get("type") == COMPACTION else None
        for call in calls if isinstance(calls, list) else ():
            key = items.pairing_key(call)
            if key is not None:
                self.compacted.setdefault(key, []).append((index, call))

    def paired(self, index: int, call_id: str) -> tuple[int, int, Sequence[Item]]:
        """The candidates for `call_id` that precede `index`: how many inline, how many by
        reference (the first of each list in `candidates` and `referenced`), and upstream.

        Counted by bisection, never listed: with thousands of items that share a `call_id`,
        listing them for every output would be quadratic.
        """
        candidates = self.candidates.get(call_id)
        inline = bisect_left(candidates, index) if candidates else 0
        referenced = self.referenced.get(call_id)
        by_reference = bisect_left(referenced, index) if referenced else 0
        chain = self.recorded.calls(call_id)
        # Most bodies compact nothing: no list is built for them.
        found = self.compacted.get(call_id)
        if not found:
            return inline, by_reference, chain
        compacted = [call for at, call in found if at < index]
        return inline, by_reference, [*compacted, *chain] if compacted else chain

    def distinct(
        self, call_id: str, inline: int, by_reference: int, upstream: Sequence[Item]
    ) -> int:
        """How many calls the candidates `paired` found are. Each inline call and each
        reference is one (the upstream reads each), but the same call found again by another
        route (a reference to an inline call, the recorded chain, a compaction) is not another."""
        if inline > 1 or by_reference > 1 or inline + by_reference + len(upstream) <= 1:
            return inline + by_reference + len(upstream)
        seen: list[Item] = []
        if inline:
            seen.append(self.input[self.candidates[call_id][0]])
        found = [self.resolved[self.referenced[call_id][0]]] if by_reference else []
        for call in (*found, *upstream):
            if not any(same_call(call, other) for other in seen):
                seen.append(call)
        return len(seen)

    def pairs_upstream(self, call_id: str | None) -> bool:
        """Whether a call with `call_id` lives upstream: in the recorded chain, or inside a
        compaction item (stripping its output would leave the call without one)."""
        if call_id is None:
            return False
        return call_id in self.compacted or bool(self.recorded.calls(call_id))

    def without(self, removed: set[int], latest: dict[str, int]) -> list[Any]:
        """The input less `removed` (stripped outputs and items), less the inline pairs that
        precede `latest` (call_id -> its latest stripped output), closed so nothing dangles."""
        removed = set(removed)
        for call_id, index in latest.items():
            for pool in (self.candidates.get(call_id, []), self.referenced.get(call_id, [])):
                removed.update(pool[: bisect_left(pool, index)])
        changed = True
        while changed:
            changed = False
            for key, outputs in self.outputs.items():
                calls = self.candidates.get(key, [])
                calls_gone = bool(calls) and all(i in removed for i in calls)
                outputs_gone = all(i in removed for i in outputs)
                if calls_gone and not outputs_gone:
                    removed.update(outputs)
                    changed = True
                elif outputs_gone and calls and not calls_gone:
                    removed.update(calls)
                    changed = True
        return [item for i, item in enumerate(self.input) if i not in removed]
