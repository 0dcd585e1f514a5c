"""What the ledger keeps of one relayed response: the items the gate needs, the context of the
request that created it, and the hash of the tools that request offered."""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from proxy.gate import items
from proxy.gate.items import Item
from proxy.gate.values import value

# What the gate needs of a recorded item; the rest (message text, reasoning) is not kept.
# `TOOLS` names, on a recorded call, the tools of the request that made it (their hash).
_KEPT_FIELDS = (
    *("type", "id", "call_id", "name", "arguments", "status", "server_label"),
    items.RECORDED_TOOLS,
)
_SHARED_FIELDS = frozenset({"type", "name", "status", "server_label", items.RECORDED_TOOLS})
COMPACTION = "compaction"


def _shared(key: str, value: Any) -> Any:
    """One copy of the values every recording repeats (a type, a status, a tool's name)."""
    return sys.intern(value) if key in _SHARED_FIELDS and type(value) is str else value


def kept(item: Item, tools: str | None = None, *, trusted: bool = False) -> dict[str, Any] | None:
    """The fields of `item` the gate needs, or None when it is nothing to pair or refer to: a
    message is kept only by its `id` (an `item_reference` may name it), its text never.

    A function_call is tagged with `tools`, the hash of the tools it was made with, unless it is
    `trusted` (read from the ledger) and tagged already.
    """
    return _kept(item, items.kind(item), tools, trusted)


def _kept(
    item: Item, item_kind: str | None, tools: str | None, trusted: bool
) -> dict[str, Any] | None:
    """`kept` of an item whose kind is known."""
    if item_kind == items.MESSAGE:
        item_id = item.get("id")
        if not isinstance(item_id, str):
            return None
        return {"type": items.MESSAGE, "id": item_id}
    found = {k: _shared(k, item[k]) for k in _KEPT_FIELDS if k in item}
    if item_kind == items.MCP_LIST_TOOLS and "tools" in item:
        found["tools"] = item["tools"]  # the input_schema an mcp_call is judged by
    if not trusted:
        found.pop(items.RECORDED_TOOLS, None)  # only the ledger says which tools made a call
    if tools is not None and item_kind == items.FUNCTION_CALL:
        found.setdefault(items.RECORDED_TOOLS, sys.intern(tools))
    return found


# The tools remembered by their JSON (`tools_key`, `offered_tools`): at most 256 sets each,
# none larger than this, so that what is held stays within a few tens of MB however large a
# body's tools (up to `limits.max_body_bytes`); a larger set is read again every time.
_REMEMBERED_TOOLS_BYTES = 64 * 1024


def tools_key(tools: Sequence[tuple[str, Any]]) -> str:
    """The hash a set of function tools is stored under, once for every response it made.

    A client sends the same tools every turn, in the same order: orjson's JSON of them (some
    15 times quicker than the stdlib's; unsorted, a third quicker again) finds the hash made
    before. The hash itself stays the stdlib's of the tools sorted, as every stored recording
    has it: the same tools written in another order are hashed alike.
    """
    try:
        written = orjson.dumps(tools)
    except orjson.JSONEncodeError:  # an integer beyond 64 bits
        return _hashed(tools)
    if len(written) > _REMEMBERED_TOOLS_BYTES:
        return _hashed(tools)
    return _tools_key_of(written)


class Offered(NamedTuple):
    """The function tools a request offers (`items.tool_schemas` of its `tools`) and their
    `tools_key` (None: it offers none)."""

    schemas: tuple[tuple[str, Any], ...]
    key: str | None


def offered_tools(tools: Any) -> Offered:
    """`Offered` of a request's `tools`. A client sends the same tools every turn: found by
    orjson's JSON of them, both are made once (the schemas read back from that JSON, the same
    values), where reading the tools and writing their pairs for the key took some 15 k
    instructions a request."""
    try:
        written = orjson.dumps(tools)
    except orjson.JSONEncodeError:  # an integer beyond 64 bits
        return _offered(tools)
    if len(written) > _REMEMBERED_TOOLS_BYTES:
        return _offered(tools)
    return _offered_of(written)


@functools.lru_cache(maxsize=256)
def _offered_of(written: bytes) -> Offered:
    return _offered(orjson.loads(written))


def _offered(tools: Any) -> Offered:
    schemas = tuple(items.tool_schemas(tools))
    return Offered(schemas, tools_key(schemas) if schemas else None)


@functools.lru_cache(maxsize=256)
def _tools_key_of(written: bytes) -> str:
    # The tools read back are the same values (a body's numbers are never infinite: the
    # reader refuses them), so this is the hash of the tools themselves.
    return _hashed(json.loads(written))


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
    # The tools its `tool_choice` allows (`items.allowed_tools`); None: any it offers.
    allowed: frozenset[str] | None = None

    @classmethod
    def of(
        cls, found: Sequence[dict[str, Any]], tools: Sequence[tuple[str, Any]], compacts: bool
    ) -> Context:
        tools = tuple(tools)
        return cls(tuple(found), tools, compacts, tools_key(tools) if tools else None)


NO_CONTEXT = Context()


@value
class RecordedResponse:
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
    ) -> RecordedResponse | None:
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
            if isinstance(item, dict) and (item_kind := items.kind(item)) != COMPACTION
            if (recorded := _kept(item, item_kind, tools, False)) is not None
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

    def with_inputs_of(self, earlier: RecordedResponse) -> RecordedResponse:
        """This recording of a response read again (`GET /v1/responses/{id}`), with the input
        items and tools recorded when the request that created it was relayed."""
        upstream = self.upstream or earlier.upstream
        whole = self.whole if self.whole is not None else earlier.whole
        if self.inputs or not earlier.inputs:
            return RecordedResponse(
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
        return RecordedResponse(
            self.response_id,
            self.previous_response_id,
            (*inputs, *output),
            len(inputs),
            tools,
            upstream,
            whole,
        )
