"""The ledger: what the proxy recorded of the upstream responses it relayed, per tenant."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.gate import items
from proxy.gate.items import Item

log = logging.getLogger("replay_proxy")

# What the gate needs of a recorded item; the rest (message text, reasoning) is not kept.
_KEPT_FIELDS = ("type", "id", "call_id", "name", "arguments", "status")
_SHARED_FIELDS = frozenset({"type", "name", "status"})


class LedgerFault(Exception):
    """The store could not be read or written in time."""


def _shared(key: str, value: Any) -> Any:
    """One copy of the values every recording repeats (a type, a status, a tool's name)."""
    return sys.intern(value) if key in _SHARED_FIELDS and type(value) is str else value


@dataclass(frozen=True, slots=True)
class Recording:
    """One upstream response as the gate needs it: its id, its predecessor, its pairable items."""

    response_id: str
    previous_response_id: str | None
    items: tuple[dict[str, Any], ...]

    @classmethod
    def of(cls, response: Mapping[str, Any]) -> Recording | None:
        """The recording of a response object (`id`, `previous_response_id`, `output`)."""
        response_id = response.get("id")
        output = response.get("output")
        if not isinstance(response_id, str) or not isinstance(output, list):
            return None
        previous = response.get("previous_response_id")
        kept = tuple(
            {k: _shared(k, item[k]) for k in _KEPT_FIELDS if k in item}
            for item in output
            if isinstance(item, dict) and items.kind(item) != items.MESSAGE
        )
        return cls(response_id, previous if isinstance(previous, str) else None, kept)

    def encode(self) -> str:
        return json.dumps({"prev": self.previous_response_id, "items": self.items})

    @classmethod
    def decode(cls, response_id: str, data: str | bytes) -> Recording:
        value = json.loads(data)
        return cls(response_id, value["prev"], tuple(value["items"]))


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

    def calls(self, call_id: str) -> Sequence[Item]:
        return self.chain_calls.get(call_id, ())

    def item(self, item_id: str) -> Item | None:
        return self.by_id.get(item_id)

    def emitted_statuses(self, call: Item) -> Sequence[Any]:
        key = items.pairing_key(call)
        found = self.emitted_calls.get(key, ()) if key is not None else ()
        name, arguments = call.get("name"), call.get("arguments")
        return [status for n, a, status in found if n == name and same_arguments(a, arguments)]

    def add_chain(self, recordings: Iterable[Recording]) -> None:
        for recording in recordings:
            for item in recording.items:
                key = items.pairing_key(item)
                if key is not None:
                    self.chain_calls.setdefault(key, []).append(item)
                    self.add_emitted(item)

    def add_emitted(self, item: Item) -> None:
        key = items.pairing_key(item)
        if key is not None and item.get("type") == items.FUNCTION_CALL:
            emitted = (item.get("name"), item.get("arguments"), item.get("status"))
            self.emitted_calls.setdefault(key, []).append(emitted)


def same_arguments(emitted: Any, replayed: Any) -> bool:
    """Whether a replayed call's `arguments` are the ones emitted: the same string, or strict
    JSON texts of the same value, numbers written alike.

    A client that parsed the arguments and replays `JSON.stringify` of them (the AI SDK) changes
    spacing, key order and escapes, not the call. A number written otherwise (`1.0` for `1`)
    is not the same: readers that keep every digit may read the two apart.
    """
    if emitted == replayed:
        return True
    if not isinstance(emitted, str) or not isinstance(replayed, str):
        return False
    try:
        return bool(_as_written(emitted) == _as_written(replayed))
    except (ValueError, RecursionError):
        return False


def _as_written(text: str) -> Any:
    """The JSON value of `text`, each number kept as its text; ValueError unless strict JSON."""
    return json.loads(
        text,
        object_pairs_hook=_unique,
        parse_int=_Number,
        parse_float=_Number,
        parse_constant=_refuse,
    )


class _Number(str):
    """A number as written: equal only to the same digits, never to a string or a bool."""

    def __eq__(self, other: object) -> bool:
        return type(other) is _Number and str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = str.__hash__


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError("duplicate key")
    return found


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _missing_status(item: Item) -> bool:
    # A typeless call fails `namespaced` whatever its status: only typed ones are looked up.
    return item.get("type") == items.FUNCTION_CALL and item.get("status") is None


class Store(Protocol):
    """A ledger backend. Every method may raise LedgerFault."""

    async def put(self, tenant: str, recording: Recording) -> None: ...

    async def chain(self, tenant: str, response_id: str, depth: int) -> list[Recording]:
        """The named response and its predecessors, newest first; empty when it is unknown."""
        ...

    async def lookup(
        self, tenant: str, item_ids: Sequence[str], call_ids: Sequence[str]
    ) -> tuple[dict[str, Item], list[Item]]:
        """Recorded items by id, and every recorded call with one of `call_ids`."""
        ...

    async def close(self) -> None: ...

    def __len__(self) -> int: ...


class Ledger:
    """The store plus the rules: tenants, chain depth, and what a missing history means."""

    def __init__(
        self,
        store: Store,
        *,
        max_chain: int,
        fail_open: bool,
        on_fault: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.max_chain = max_chain
        self.fail_open = fail_open
        self.on_fault = on_fault

    def fault(self, operation: str, exc: LedgerFault) -> None:
        log.warning(
            "ledger %s failed (%s): %s",
            operation,
            "failing open" if self.fail_open else "failing closed",
            exc,
        )
        if self.on_fault is not None:
            self.on_fault(operation)

    async def view(
        self, tenant: str, body: Mapping[str, Any], *, provenance: bool
    ) -> LedgerView | None:
        """What the gate may pair this request's outputs with; None when it names no history."""
        previous = body.get("previous_response_id")
        input_items = body.get("input")
        listed = input_items if isinstance(input_items, list) else []
        reference_ids = [
            ref
            for item in listed
            if items.is_reference(item)
            if (ref := items.reference_id(item)) is not None
        ]
        # The calls whose emission the gate may ask about: every candidate under provenance,
        # else the function_calls replayed without a status (judged by the recorded one).
        # Each once: a call_id given many times would fetch its recorded calls many times.
        call_ids = list(
            dict.fromkeys(
                key
                for item in listed
                if provenance or (isinstance(item, dict) and _missing_status(item))
                if (key := items.pairing_key(item)) is not None
            )
        )
        if not isinstance(previous, str) and not reference_ids and not call_ids:
            return None
        view = LedgerView()
        missing = False
        try:
            if isinstance(previous, str):
                chain = await self.store.chain(tenant, previous, self.max_chain)
                missing = not chain
                view.add_chain(chain)
            if reference_ids or call_ids:
                by_id, calls = await self.store.lookup(tenant, reference_ids, call_ids)
                view.by_id.update(by_id)
                for call in calls:
                    view.add_emitted(call)
        except LedgerFault as exc:
            self.fault("read", exc)
            missing = True
        # Only an unknown previous response is waived; a request that names none pairs inline.
        view.trust_unpaired = self.fail_open and missing and isinstance(previous, str)
        return view

    async def record(self, tenant: str, response: Mapping[str, Any]) -> None:
        recording = Recording.of(response)
        if recording is None:
            return
        try:
            await self.store.put(tenant, recording)
        except LedgerFault as exc:
            self.fault("write", exc)
