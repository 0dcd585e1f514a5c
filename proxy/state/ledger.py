"""The ledger: what the proxy recorded of the upstream responses it relayed, per tenant."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from proxy.gate import items
from proxy.gate.items import Item

log = logging.getLogger("replay_proxy")

# What the gate needs of a recorded item; the rest (message text, reasoning) is not kept.
# `TOOLS` names, on a recorded call, the tools of the request that made it (their hash).
_KEPT_FIELDS = ("type", "id", "call_id", "name", "arguments", "status", items.RECORDED_TOOLS)
_SHARED_FIELDS = frozenset({"type", "name", "status", items.RECORDED_TOOLS})
COMPACTION = "compaction"


class LedgerFault(Exception):
    """The store could not be read or written in time."""


def _shared(key: str, value: Any) -> Any:
    """One copy of the values every recording repeats (a type, a status, a tool's name)."""
    return sys.intern(value) if key in _SHARED_FIELDS and type(value) is str else value


def kept(item: Item, tools: str | None = None, *, trusted: bool = False) -> dict[str, Any] | None:
    """The fields of `item` the gate needs, or None when it is nothing to pair or refer to: a
    message is kept only by its `id` (an `item_reference` may name it), its text never.

    A function_call is tagged with `tools`, the hash of the tools it was made with, unless it is
    `trusted` (read from the ledger) and tagged already.
    """
    item_kind = items.kind(item)
    if item_kind == items.MESSAGE:
        item_id = item.get("id")
        if not isinstance(item_id, str):
            return None
        return {"type": items.MESSAGE, "id": item_id}
    found = {k: _shared(k, item[k]) for k in _KEPT_FIELDS if k in item}
    if not trusted:
        found.pop(items.RECORDED_TOOLS, None)  # only the ledger says which tools made a call
    if tools is not None and item_kind == items.FUNCTION_CALL:
        found.setdefault(items.RECORDED_TOOLS, sys.intern(tools))
    return found


def tools_key(tools: Sequence[tuple[str, Any]]) -> str:
    """The hash a set of function tools is stored under, once for every response it made.

    A client sends the same tools every turn: orjson's sorted JSON of them (some 15 times
    quicker than the stdlib's) finds the hash made before. The hash itself stays the stdlib's,
    as every stored recording has it.
    """
    try:
        sorted_json = orjson.dumps(tools, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # an integer beyond 64 bits
        return _hashed(tools)
    return _tools_key_of(sorted_json)


@functools.lru_cache(maxsize=256)
def _tools_key_of(sorted_json: bytes) -> str:
    # The tools read back are the same values (a body's numbers are never infinite: the
    # reader refuses them), so this is the hash of the tools themselves.
    return _hashed(json.loads(sorted_json))


def _hashed(tools: Any) -> str:
    canonical = json.dumps(tools, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Context:
    """What a forwarded request adds to the responses it creates (the spec's context is the
    previous response's input + output): its input items that passed the gate, kept as the gate
    needs them, and the function tools it offered (name, parameters).

    `compacts` is set for a `/compact` request: the compaction item its answer holds stands for
    `items` (the calls that went into it), and a later output pairs with them through it.
    """

    items: tuple[dict[str, Any], ...] = ()
    tools: tuple[tuple[str, Any], ...] = ()
    compacts: bool = False
    tools_key: str | None = None  # `tools_key(tools)`, hashed once
    # With `ledger.whole_items`: the request's input items as they went upstream, whole.
    whole: tuple[Any, ...] | None = None

    @classmethod
    def of(
        cls, found: Sequence[dict[str, Any]], tools: Sequence[tuple[str, Any]], compacts: bool
    ) -> Context:
        tools = tuple(tools)
        return cls(tuple(found), tools, compacts, tools_key(tools) if tools else None)


NO_CONTEXT = Context()


@dataclass(frozen=True, slots=True)
class Recording:
    """One upstream response as the gate needs it: its id, its predecessor, its pairable and
    referable items (the first `inputs` of them from the request that created it, then its
    output), and the hash of the tools that request offered."""

    response_id: str
    previous_response_id: str | None
    items: tuple[dict[str, Any], ...]
    inputs: int = 0
    tools: str | None = None
    upstream: str | None = None  # the upstream that made it (None: recorded before routes)
    # With `ledger.whole_items`: the request's input items and the response's output items,
    # whole and in order (what a route that materializes inlines for another upstream).
    whole: tuple[Any, ...] | None = None

    @classmethod
    def of(
        cls, response: Mapping[str, Any], context: Context = NO_CONTEXT, upstream: str | None = None
    ) -> Recording | None:
        """The recording of a response object (`id`, `previous_response_id`, `output`), or of
        a `/compact` answer (`object: response.compaction`) made for `context`."""
        response_id = response.get("id")
        output = response.get("output")
        if not isinstance(response_id, str) or not isinstance(output, list):
            return None
        tools = context.tools_key
        found = [
            recorded
            for item in output
            if isinstance(item, dict) and items.kind(item) != COMPACTION
            if (recorded := kept(item, tools)) is not None
        ]
        if context.compacts:
            # The compaction item is opaque: it stands for the calls that went into it.
            calls = [dict(call) for call in context.items]
            found += [
                {"type": COMPACTION, "id": item["id"], "calls": calls}
                for item in output
                if isinstance(item, dict) and items.kind(item) == COMPACTION
                if isinstance(item.get("id"), str)
            ]
            return cls(response_id, None, tuple(found), upstream=upstream)
        previous = response.get("previous_response_id")
        whole = None if context.whole is None else (*context.whole, *output)
        return cls(
            response_id,
            previous if isinstance(previous, str) else None,
            (*context.items, *found),
            len(context.items),
            tools,
            upstream,
            whole,
        )

    def with_inputs_of(self, earlier: Recording) -> Recording:
        """This recording of a response read again (`GET /v1/responses/{id}`), with the input
        items and tools recorded when the request that created it was relayed."""
        upstream = self.upstream or earlier.upstream
        whole = self.whole if self.whole is not None else earlier.whole
        if self.inputs or not earlier.inputs:
            return Recording(
                self.response_id,
                self.previous_response_id,
                self.items,
                self.inputs,
                self.tools,
                upstream,
                whole,
            )
        inputs = earlier.items[: earlier.inputs]
        tools = self.tools or earlier.tools
        output = self.items
        if tools is not None and self.tools is None:
            # Read again, the calls were made with the tools of the request that created it.
            output = tuple(
                kept(item, tools) or item if item.get("type") == items.FUNCTION_CALL else item
                for item in output
            )
        return Recording(
            self.response_id,
            self.previous_response_id,
            (*inputs, *output),
            len(inputs),
            tools,
            upstream,
            whole,
        )

    def encode(self) -> str:
        value: dict[str, Any] = {"prev": self.previous_response_id, "items": self.items}
        if self.inputs:
            value["inputs"] = self.inputs
        if self.tools is not None:
            value["tools"] = self.tools
        if self.upstream is not None:
            value["upstream"] = self.upstream
        if self.whole is not None:
            value["whole"] = self.whole
        return json.dumps(value)

    @classmethod
    def decode(cls, response_id: str, data: str | bytes) -> Recording:
        """The recording `encode` wrote; ValueError for anything else (a value corrupted, or
        written by another program), so that no stored value reaches the gate unchecked."""
        value = json.loads(data)
        if not isinstance(value, dict):
            raise ValueError("not a JSON object")
        previous, found, inputs = value.get("prev"), value.get("items"), value.get("inputs", 0)
        tools, upstream, whole = value.get("tools"), value.get("upstream"), value.get("whole")
        if not isinstance(found, list) or not all(isinstance(item, dict) for item in found):
            raise ValueError("items: not a list of objects")
        if type(inputs) is not int or not 0 <= inputs <= len(found):
            raise ValueError("inputs: not a count of its items")
        for key, given in (("prev", previous), ("tools", tools), ("upstream", upstream)):
            if given is not None and not isinstance(given, str):
                raise ValueError(f"{key}: not a string")
        if whole is not None and not isinstance(whole, list):
            raise ValueError("whole: not a list")
        return cls(
            response_id,
            previous,
            tuple(found),
            inputs,
            tools,
            upstream,
            None if whole is None else tuple(whole),
        )


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
            for index, item in enumerate(recording.items):
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
            if call.get("name") not in names
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
            schemas = [parameters for name, parameters in recorded if name == call.get("name")]
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

    async def put(
        self, tenant: str, recording: Recording, tools: Sequence[tuple[str, Any]] = ()
    ) -> None:
        """Record a response; `tools` (stored once per hash) are those `recording.tools` names."""
        ...

    async def tools(self, tenant: str, keys: Sequence[str]) -> dict[str, list[tuple[str, Any]]]:
        """The recorded tools under each of `keys` that is still known."""
        ...

    async def chain(self, tenant: str, response_id: str, depth: int) -> list[Recording]:
        """The named response and its predecessors, newest first; empty when it is unknown."""
        ...

    async def lookup(
        self,
        tenant: str,
        item_ids: Sequence[str],
        call_ids: Sequence[str],
        *,
        upstream: str | None = None,
    ) -> tuple[dict[str, Item], list[Item]]:
        """The items `upstream` made (or that went to it) recorded by id, and every recorded
        call with one of `call_ids`, whichever upstream emitted it."""
        ...

    async def close(self) -> None: ...

    async def size(self) -> int:
        """How many responses the store holds now (every process's, for a shared store)."""
        ...

    async def ping(self) -> None:
        """Return once the store answers (a LedgerFault when it does not): for readiness."""
        ...


class Ledger:
    """The store plus the rules: tenants, chain depth, and what a missing history means."""

    def __init__(
        self,
        store: Store,
        *,
        max_chain: int,
        fail_open: bool,
        on_fault: Callable[[str], None] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.max_chain = max_chain
        self.fail_open = fail_open
        self.on_fault = on_fault
        self.on_write = on_write  # told of each response recorded

    def fault(self, operation: str, exc: LedgerFault) -> None:
        """Log and count a fault of the store's; what it costs depends on the operation."""
        if operation != "read":
            cost = "the response is not recorded" if operation == "write" else "not known"
        elif self.fail_open:
            cost = "failing open: an unpaired output is let through"
        else:
            cost = "the request is answered 503 ledger_unavailable"
        log.warning("ledger %s failed (%s): %s", operation, cost, exc)
        if self.on_fault is not None:
            self.on_fault(operation)

    async def view(
        self,
        tenant: str,
        body: Mapping[str, Any],
        *,
        provenance: bool,
        upstream: str | None = None,
    ) -> LedgerView | None:
        """What the gate may pair this request's outputs with; None when it names no history.
        Its `item_reference`s resolve only to items recorded from `upstream` (the route's).

        A store that cannot answer is logged and counted, then raises LedgerFault, unless
        `fail_open`: then what could not be read counts as not recorded."""
        previous = body.get("previous_response_id")
        input_items = body.get("input")
        listed = input_items if isinstance(input_items, list) else []
        # The items looked up by id: those an item_reference names, and each compaction item
        # (it stands for the calls that went into it).
        reference_ids = [
            ref
            for item in listed
            if items.kind(item) in (items.ITEM_REFERENCE, COMPACTION)
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
                view.origin = chain[0].upstream if chain else None
                view.add_chain(chain)
            if reference_ids or call_ids:
                by_id, calls = await self.store.lookup(
                    tenant, reference_ids, call_ids, upstream=upstream
                )
                view.by_id.update(by_id)
                for call in calls:
                    view.add_emitted(call)
            wanted = view.tools_wanted(name for name, _ in items.tool_schemas(body.get("tools")))
            if wanted:
                view.tools.update(await self.store.tools(tenant, sorted(wanted)))
                view.attach_tools()
        except LedgerFault as exc:
            self.fault("read", exc)
            if not self.fail_open:
                raise
            missing = True
        # Only an unknown previous response is waived; a request that names none pairs inline.
        view.trust_unpaired = self.fail_open and missing and isinstance(previous, str)
        return view

    async def history(self, tenant: str, response_id: str) -> list[Any] | None:
        """The whole conversation up to and with a recorded response, oldest item first: each
        response's input, then its output, from the first of its chain. None when it cannot be
        had whole: a response of it unknown, recorded without its whole items, or the chain
        longer than `max_chain`. Raises LedgerFault (logged and counted)."""
        try:
            chain = await self.store.chain(tenant, response_id, self.max_chain)
        except LedgerFault as exc:
            self.fault("read", exc)
            raise
        if not chain or chain[-1].previous_response_id is not None:
            return None
        found: list[Any] = []
        for recording in reversed(chain):
            if recording.whole is None:
                return None
            found += recording.whole
        return found

    async def record(
        self,
        tenant: str,
        response: Mapping[str, Any],
        context: Context | None = None,
        upstream: str | None = None,
    ) -> None:
        """Record a response `upstream` relayed to `tenant`, with the `context` of the request
        that created it; None when it is read again (`GET /v1/responses/{id}`): then the
        context recorded when it was created is kept."""
        recording = Recording.of(response, context or NO_CONTEXT, upstream)
        if recording is None:
            return
        try:
            if context is None:
                earlier = await self.store.chain(tenant, recording.response_id, 1)
                if earlier:
                    recording = recording.with_inputs_of(earlier[0])
            await self.store.put(tenant, recording, context.tools if context else ())
        except LedgerFault as exc:
            self.fault("write", exc)
            return
        if self.on_write is not None:
            self.on_write()
