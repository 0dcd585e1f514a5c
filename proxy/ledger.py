"""The ledger: items of upstream responses the proxy relayed, per tenant; memory and Redis."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from proxy import config, items
from proxy.items import Item

log = logging.getLogger("replay_proxy")

# What the gate needs of a recorded item; the rest (message text, reasoning) is not kept.
_KEPT_FIELDS = ("type", "id", "call_id", "name", "arguments", "status")


class LedgerFault(Exception):
    """The store could not be read or written in time."""


@dataclass(frozen=True)
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
            {k: item[k] for k in _KEPT_FIELDS if k in item}
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

    `trust_unpaired` is set when the history could not be read (an unknown previous response,
    a store fault) and the config says to fail open: then an output with no pair is let through.
    """

    chain_calls: dict[str, list[Item]] = field(default_factory=dict)
    by_id: dict[str, Item] = field(default_factory=dict)
    emitted_calls: dict[str, list[tuple[Any, Any]]] = field(default_factory=dict)
    trust_unpaired: bool = False

    def calls(self, call_id: str) -> Sequence[Item]:
        return self.chain_calls.get(call_id, ())

    def item(self, item_id: str) -> Item | None:
        return self.by_id.get(item_id)

    def emitted(self, call: Item) -> bool:
        if self.trust_unpaired:
            return True
        key = items.pairing_key(call)
        found = self.emitted_calls.get(key, ()) if key is not None else ()
        return (call.get("name"), call.get("arguments")) in found

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
            self.emitted_calls.setdefault(key, []).append((item.get("name"), item.get("arguments")))


def open_store(settings: config.Ledger) -> Store:
    if settings.backend == "redis":
        return RedisStore(settings.url, ttl_s=settings.ttl_s, timeout_s=settings.timeout_s)
    return MemoryStore(max_responses=settings.max_responses, ttl_s=settings.ttl_s)


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


class MemoryStore:
    """Per-process store, bounded in responses, with a TTL; every operation O(1) per item."""

    def __init__(self, *, max_responses: int, ttl_s: float) -> None:
        self.max_responses = max_responses
        self.ttl_s = ttl_s
        # (tenant, response id) -> (expiry, recording); insertion order is expiry order.
        self._responses: OrderedDict[tuple[str, str], tuple[float, Recording]] = OrderedDict()
        self._items: dict[tuple[str, str], Item] = {}
        self._calls: dict[tuple[str, str], list[Item]] = {}

    def __len__(self) -> int:
        return len(self._responses)

    async def put(self, tenant: str, recording: Recording) -> None:
        now = time.monotonic()
        key = (tenant, recording.response_id)
        if key in self._responses:
            self._forget(key)
        self._responses[key] = (now + self.ttl_s, recording)
        for item in recording.items:
            item_id = item.get("id")
            if isinstance(item_id, str):
                self._items[(tenant, item_id)] = item
            call_key = items.pairing_key(item)
            if call_key is not None:
                self._calls.setdefault((tenant, call_key), []).append(item)
        self._expire(now)

    def _expire(self, now: float) -> None:
        while self._responses:
            key, (expires, _) = next(iter(self._responses.items()))
            if expires > now and len(self._responses) <= self.max_responses:
                return
            self._forget(key)

    def _forget(self, key: tuple[str, str]) -> None:
        _, recording = self._responses.pop(key)
        tenant = key[0]
        for item in recording.items:
            item_id = item.get("id")
            if isinstance(item_id, str) and self._items.get((tenant, item_id)) is item:
                del self._items[(tenant, item_id)]
            call_key = items.pairing_key(item)
            calls = self._calls.get((tenant, call_key)) if call_key is not None else None
            if calls is not None and call_key is not None:
                calls[:] = [c for c in calls if c is not item]
                if not calls:
                    del self._calls[(tenant, call_key)]

    def _get(self, tenant: str, response_id: str) -> Recording | None:
        found = self._responses.get((tenant, response_id))
        if found is None or found[0] <= time.monotonic():
            return None
        return found[1]

    async def chain(self, tenant: str, response_id: str, depth: int) -> list[Recording]:
        self._expire(time.monotonic())
        found: list[Recording] = []
        current: str | None = response_id
        while current is not None and len(found) < depth:
            recording = self._get(tenant, current)
            if recording is None:
                break
            found.append(recording)
            current = recording.previous_response_id
        return found

    async def lookup(
        self, tenant: str, item_ids: Sequence[str], call_ids: Sequence[str]
    ) -> tuple[dict[str, Item], list[Item]]:
        self._expire(time.monotonic())
        by_id = {i: self._items[(tenant, i)] for i in item_ids if (tenant, i) in self._items}
        calls = [c for call_id in call_ids for c in self._calls.get((tenant, call_id), ())]
        return by_id, calls

    async def close(self) -> None:
        return None


# Walks a response chain inside Redis: one round trip whatever its length.
# Values are "<previous id>\n<json>"; the previous id is empty for the first response.
_CHAIN_SCRIPT = """
local out = {}
local id = ARGV[2]
for i = 1, tonumber(ARGV[3]) do
  local value = redis.call('GET', ARGV[1] .. id)
  if not value then break end
  out[#out + 1] = value
  local newline = string.find(value, '\\n', 1, true)
  id = string.sub(value, 1, newline - 1)
  if id == '' then break end
end
return out
"""


class RedisStore:
    """A store in Redis, shared by every proxy process and machine; keys expire with the TTL."""

    def __init__(self, url: str, *, ttl_s: float, timeout_s: float) -> None:
        import redis.asyncio as aioredis  # only the redis backend needs the client

        self.ttl = max(1, round(ttl_s))
        self.timeout_s = timeout_s
        self._redis = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._chain = self._redis.register_script(_CHAIN_SCRIPT)
        self._count = 0

    def __len__(self) -> int:
        # Redis is shared and expires keys itself; this process only knows what it wrote.
        return self._count

    @staticmethod
    def _key(tenant: str, kind: str, name: str) -> str:
        return f"replay-proxy:{tenant}:{kind}:{name}"

    async def _run(self, operation: Any) -> Any:
        try:
            return await asyncio.wait_for(operation, self.timeout_s)
        except LedgerFault:
            raise
        except Exception as exc:
            # redis-py raises its own errors, OSError or a timeout; all mean the same here.
            raise LedgerFault(f"redis: {exc!r}") from None

    async def put(self, tenant: str, recording: Recording) -> None:
        pipe = self._redis.pipeline(transaction=False)
        value = (recording.previous_response_id or "") + "\n" + recording.encode()
        pipe.set(self._key(tenant, "resp", recording.response_id), value, ex=self.ttl)
        for item in recording.items:
            item_id = item.get("id")
            encoded = json.dumps(item)
            if isinstance(item_id, str):
                pipe.set(self._key(tenant, "item", item_id), encoded, ex=self.ttl)
            call_key = items.pairing_key(item)
            if call_key is not None:
                pipe.rpush(self._key(tenant, "call", call_key), encoded)
                pipe.expire(self._key(tenant, "call", call_key), self.ttl)
        await self._run(pipe.execute())
        self._count += 1

    async def chain(self, tenant: str, response_id: str, depth: int) -> list[Recording]:
        prefix = self._key(tenant, "resp", "")
        values = await self._run(self._chain(keys=[], args=[prefix, response_id, depth]))
        found = []
        current = response_id
        for value in values:
            _, _, data = bytes(value).partition(b"\n")
            recording = Recording.decode(current, data)
            found.append(recording)
            current = recording.previous_response_id or ""
        return found

    async def lookup(
        self, tenant: str, item_ids: Sequence[str], call_ids: Sequence[str]
    ) -> tuple[dict[str, Item], list[Item]]:
        pipe = self._redis.pipeline(transaction=False)
        if item_ids:
            pipe.mget([self._key(tenant, "item", i) for i in item_ids])
        for call_id in call_ids:
            pipe.lrange(self._key(tenant, "call", call_id), 0, -1)
        results = await self._run(pipe.execute()) if item_ids or call_ids else []
        by_id: dict[str, Item] = {}
        if item_ids:
            values = results.pop(0)
            by_id = {i: json.loads(v) for i, v in zip(item_ids, values, strict=True) if v}
        calls = [json.loads(v) for found in results for v in found]
        return by_id, calls

    async def close(self) -> None:
        await self._redis.aclose()


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
        call_ids = []
        if provenance:
            call_ids = [key for item in listed if (key := items.pairing_key(item)) is not None]
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
        view.trust_unpaired = self.fail_open and missing
        return view

    async def record(self, tenant: str, response: Mapping[str, Any]) -> None:
        recording = Recording.of(response)
        if recording is None:
            return
        try:
            await self.store.put(tenant, recording)
        except LedgerFault as exc:
            self.fault("write", exc)


_TERMINAL = ("response.completed", "response.incomplete")


class ResponseTap:
    """Watches an upstream answer go by (JSON or SSE) and records the response it completes.

    `feed` sees each chunk before it is forwarded, so a follow-up turn sent the moment the
    client has the whole answer finds the record, on any proxy process sharing the store.
    """

    def __init__(
        self, ledger: Ledger, tenant: str, content_type: str, content_length: int | None, limit: int
    ) -> None:
        self.ledger = ledger
        self.tenant = tenant
        self.sse = content_type.split(";")[0].strip().lower() == "text/event-stream"
        self.expected = content_length
        self.limit = limit
        self.pending = bytearray()
        self.done_items: list[Any] = []
        self.recorded = False

    async def feed(self, chunk: bytes) -> None:
        if self.recorded:
            return
        self.pending += chunk
        if self.sse:
            await self._events()
        elif len(self.pending) > self.limit:
            self.recorded = True  # too large to keep a copy of; it goes by unrecorded
            self.pending.clear()
        elif self.expected is not None and len(self.pending) >= self.expected:
            await self.finish()

    async def finish(self) -> None:
        """The answer has ended: record a JSON response body now."""
        if self.recorded or self.sse:
            return
        self.recorded = True
        try:
            response = orjson.loads(self.pending)
        except orjson.JSONDecodeError:
            return
        finally:
            self.pending.clear()
        if isinstance(response, dict) and response.get("object") == "response":
            await self.ledger.record(self.tenant, response)

    async def _events(self) -> None:
        while True:
            match = _EVENT_END.search(self.pending)
            if match is None:
                if len(self.pending) > self.limit:
                    self.recorded = True
                    self.pending.clear()
                return
            block = bytes(self.pending[: match.start()])
            del self.pending[: match.end()]
            await self.event(_data_of(block))

    async def event(self, data: bytes | str) -> None:
        """One event's JSON (an SSE `data:` or a WebSocket frame)."""
        if not any(marker in data for marker in _MARKERS_OF[type(data)]):
            return
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            self.done_items.append(event["item"])
        elif kind in _TERMINAL and isinstance(event.get("response"), dict):
            response = event["response"]
            if not response.get("output") and self.done_items:
                response = {**response, "output": self.done_items}
            self.done_items = []
            await self.ledger.record(self.tenant, response)


_EVENT_END = re.compile(rb"\r?\n\r?\n")
_MARKERS_OF: dict[type, tuple[Any, ...]] = {
    bytes: (b"response.completed", b"response.incomplete", b"response.output_item.done"),
    str: ("response.completed", "response.incomplete", "response.output_item.done"),
}


def _data_of(block: bytes) -> bytes:
    lines = [
        line[5:].removeprefix(b" ") for line in block.splitlines() if line.startswith(b"data:")
    ]
    return b"\n".join(lines)
