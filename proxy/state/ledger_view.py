"""What the ledger holds for one request, as the gate reads it: the calls of its chain, the items
it refers to, the calls emitted upstream and the tools recorded with them; and which of these a
request asks for."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.gate import items
from proxy.gate.items import Item
from proxy.state.arguments import same_arguments
from proxy.state.recording import COMPACTION, RecordedResponse


@dataclass(frozen=True, slots=True)
class Wanted:
    """What of the ledger a request's outputs may be judged by: the response it continues, the
    items it looks up by id, and the calls whose emission the gate may ask about."""

    previous: str | None
    reference_ids: list[str]
    call_ids: list[str]

    @classmethod
    def of(cls, body: Mapping[str, Any], *, provenance: bool) -> Wanted | None:
        """What `body` wants; None when it names no history."""
        previous = body.get("previous_response_id")
        input_items = body.get("input")
        # The items looked up by id: those an item_reference names, and each compaction item
        # (it stands for the calls that went into it).
        reference_ids: list[str] = []
        # The calls whose emission the gate may ask about: every candidate under provenance,
        # else the function_calls replayed without a status (judged by the recorded one).
        # Each once, in order (a dict's keys): a call_id given many times would fetch its
        # recorded calls many times.
        call_ids: dict[str, None] = {}
        # One pass, each item's kind read once: this runs for every request that has an input.
        for item in input_items if isinstance(input_items, list) else ():
            if not isinstance(item, dict):
                continue
            item_kind = items.kind(item)
            if item_kind in _LOOKED_UP and (ref := items.reference_id(item)) is not None:
                reference_ids.append(ref)
            # A typeless call fails `namespaced` whatever its status: only typed ones are
            # looked up by the status they were emitted with.
            if provenance or (
                item.get("status") is None and item.get("type") == items.FUNCTION_CALL
            ):
                key = items.pairing_key_of(item, item_kind)
                if key is not None:
                    call_ids[key] = None
        if not isinstance(previous, str) and not reference_ids and not call_ids:
            return None
        return cls(previous if isinstance(previous, str) else None, reference_ids, list(call_ids))


# The kinds of item whose recorded item is looked up by its `id`.
_LOOKED_UP = frozenset({items.ITEM_REFERENCE, COMPACTION})


@dataclass
class LedgerView:
    """What the ledger holds for one request, as the gate's `Recorded`.

    `trust_unpaired` is set when the named previous response could not be read (unknown, or
    a store fault) and the config says to fail open: then an output with no pair is let through.
    Nothing else is waived: provenance and recorded statuses come only from what was read.
    """

    chain_calls: dict[str, list[Item]] = field(default_factory=dict)
    by_id: dict[str, Item] = field(default_factory=dict)
    # call_id -> (name, arguments, status) of each function_call emitted upstream.
    emitted_calls: dict[str, list[tuple[Any, Any, Any]]] = field(default_factory=dict)
    trust_unpaired: bool = False
    # The tools recorded with the responses read (their hash -> (name, parameters) pairs).
    tools: dict[str, list[tuple[str, Any]]] = field(default_factory=dict)
    # The upstream that made the named previous response, as recorded (None: unknown).
    origin: str | None = None
    # The mcp_list_tools items of the chain: the schemas its mcp_calls are judged by.
    listed_tools: list[Item] = field(default_factory=list)
    # The call ids it was read for when the request named no response and no item: what the
    # gate decides then depends on the ledger through `emitted_calls` alone. Else None.
    calls_alone: tuple[str, ...] | None = None
    # The store could not be read and the config fails open: it counts as holding nothing.
    faulted: bool = False

    def calls(self, call_id: str) -> Sequence[Item]:
        return self.chain_calls.get(call_id, ())

    def item(self, item_id: str) -> Item | None:
        return self.by_id.get(item_id)

    def emitted_statuses(self, call: Item) -> Sequence[Any]:
        if not self.emitted_calls:
            return []  # most requests: nothing they name was emitted
        key = items.pairing_key(call)
        found = self.emitted_calls.get(key) if key is not None else None
        if not found:
            return []
        name, arguments = call.get("name"), call.get("arguments")
        return [status for n, a, status in found if n == name and same_arguments(a, arguments)]

    def mcp_lists(self) -> Sequence[Item]:
        return self.listed_tools

    def add_chain(self, recordings: Iterable[RecordedResponse]) -> None:
        for recording in recordings:
            for index, item in enumerate(recording.items):
                if item.get("type") == items.MCP_LIST_TOOLS:
                    self.listed_tools.append(item)
                key = items.pairing_key(item)
                if key is not None and item.get("type") != COMPACTION:
                    self.chain_calls.setdefault(key, []).append(item)
                    # A call the client sent pairs, but was never emitted by an upstream.
                    if index >= recording.inputs:
                        self.add_emitted(item)

    def tools_wanted(self, offered: Iterable[str]) -> set[str]:
        """The tool hashes of recorded calls named by no tool in `offered` (the request's):
        those calls are judged by the schemas recorded with them."""
        names = set(offered)
        return {
            tools
            for call in self.iter_recorded_calls()
            if items.tool_name(call) not in names
            if isinstance(tools := call.get(items.RECORDED_TOOLS), str)
        }

    def iter_recorded_calls(self) -> Iterator[Item]:
        for found in self.chain_calls.values():
            yield from found
        for item in self.by_id.values():
            yield item
            calls = item.get("calls") if item.get("type") == COMPACTION else None
            if isinstance(calls, list):
                yield from calls

    def attach_tools(self) -> None:
        """Put on each recorded call the parameters of its own tool, recorded with it, under
        `items.RECORDED_SCHEMAS` (on a copy: the store's items are shared)."""
        if not self.tools:
            return

        def attached(call: Item) -> Item:
            recorded = self.tools.get(call.get(items.RECORDED_TOOLS) or "")
            if recorded is None:
                return call
            called = items.tool_name(call)
            schemas = [parameters for name, parameters in recorded if name == called]
            return {**call, items.RECORDED_SCHEMAS: schemas}

        for key, found in self.chain_calls.items():
            self.chain_calls[key] = [attached(c) for c in found]
        for item_id, item in self.by_id.items():
            calls = item.get("calls") if item.get("type") == COMPACTION else None
            if isinstance(calls, list):
                self.by_id[item_id] = {**item, "calls": [attached(c) for c in calls]}
            else:
                self.by_id[item_id] = attached(item)

    def add_emitted(self, item: Item) -> None:
        key = items.pairing_key(item)
        if key is not None and item.get("type") == items.FUNCTION_CALL:
            emitted = (item.get("name"), item.get("arguments"), item.get("status"))
            self.emitted_calls.setdefault(key, []).append(emitted)
