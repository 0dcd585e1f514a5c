"""Ledger stores: per-process memory (bounded, TTL) and Redis (shared, keys expire)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

from proxy import settings
from proxy.gate import items
from proxy.gate.items import Item
from proxy.state.encoding import as_stored, decode_response, encode_response
from proxy.state.ledger import LedgerFault, Store
from proxy.state.recording import COMPACTION, RecordedResponse
from proxy.state.tool_lists import MAX_TOOLS, Listed, ListStore, MemoryLists, SessionKey

log = logging.getLogger("replay_proxy")

# A response's key kind in Redis. Not `resp`, the kind of the newline-split values before: a
# proxy of either kind never reads the other's values, so none can fail on them.
RESPONSE = "response"


def open_store(settings: settings.LedgerSettings) -> Store:
    if settings.backend == "redis":
        return RedisStore(settings.url, ttl_s=settings.ttl_s, timeout_s=settings.timeout_s)
    return MemoryStore(
        max_responses=settings.max_responses,
        ttl_s=settings.ttl_s,
        max_per_tenant=settings.per_tenant,
    )


def open_lists(store: Store, settings: settings.LedgerSettings) -> ListStore:
    """Where the MCP sessions' tool lists are kept: beside the ledger's responses, in Redis
    (shared) or in this process's memory, for the ledger's TTL."""
    if isinstance(store, RedisStore):
        return RedisLists(store)
    return MemoryLists(ttl_s=settings.ttl_s)


class _Holdings:
    """How many responses each tenant holds, and one that holds the most: O(1) per change."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}
        # count -> the tenants holding that many, in the order they came to hold it.
        self._holding: dict[int, dict[str, None]] = {}
        self._top = 0

    def add(self, tenant: str) -> None:
        count = self._count.get(tenant, 0)
        if count:
            del self._holding[count][tenant]
        self._count[tenant] = count + 1
        self._holding.setdefault(count + 1, {})[tenant] = None
        self._top = max(self._top, count + 1)

    def remove(self, tenant: str) -> None:
        count = self._count.pop(tenant)
        del self._holding[count][tenant]
        if count > 1:
            self._count[tenant] = count - 1
            self._holding.setdefault(count - 1, {})[tenant] = None

    def largest(self) -> str:
        """A tenant holding the most (the first to hold that many); some tenant holds one."""
        while not self._holding.get(self._top):
            self._top -= 1  # counts change by one: the top falls a step at a time
        return next(iter(self._holding[self._top]))


class MemoryStore:
    """Per-process store, bounded in responses per tenant and in all, with a TTL; every
    operation O(1) per item.

    A tenant past `max_per_tenant` loses its own oldest response. When the store is full, the
    tenant holding the most loses its oldest: no tenant's traffic evicts another's few.
    """

    def __init__(
        self, *, max_responses: int, ttl_s: float, max_per_tenant: int | None = None
    ) -> None:
        self.max_responses = max_responses
        self.max_per_tenant = max_responses if max_per_tenant is None else max_per_tenant
        self.ttl_s = ttl_s
        # (tenant, response id) -> (expiry, recording); insertion order is expiry order.
        self._responses: OrderedDict[tuple[str, str], tuple[float, RecordedResponse]] = (
            OrderedDict()
        )
        # tenant -> its response ids, oldest first.
        self._held: dict[str, dict[str, None]] = {}
        self._holdings = _Holdings()
        # (tenant, upstream, item id) -> item: a reference resolves on its own upstream only.
        self._items: dict[tuple[str, str, str], Item] = {}
        self._calls: dict[tuple[str, str], list[Item]] = {}
        # (tenant, tools hash) -> [the tools, how many recorded responses name them].
        self._tools: dict[tuple[str, str], list[Any]] = {}

    def __len__(self) -> int:
        return len(self._responses)

    async def size(self) -> int:
        self._expire(time.monotonic())
        return len(self._responses)

    async def put(
        self, tenant: str, recording: RecordedResponse, tools: Sequence[tuple[str, Any]] = ()
    ) -> None:
        now = time.monotonic()
        key = (tenant, recording.response_id)
        if recording.tools is not None:
            # Held before a recording read again replaces its first one, which holds them too.
            held = self._tools.get((tenant, recording.tools))
            if held is not None:
                held[1] += 1
            elif tools:
                self._tools[(tenant, recording.tools)] = [list(tools), 1]
            else:
                # Named but not given (read again after its tools were forgotten): not named.
                recording = replace(recording, tools=None)
        if key in self._responses:
            self._forget(key)
        self._responses[key] = (now + self.ttl_s, recording)
        own = self._held.setdefault(tenant, {})
        own[recording.response_id] = None
        self._holdings.add(tenant)
        made_by = recording.upstream or ""
        for index, item in enumerate(recording.items):
            item_id = item.get("id")
            sent = index < recording.inputs
            # An item a client sent never replaces one an upstream emitted under its id.
            if isinstance(item_id, str) and not (
                sent and (tenant, made_by, item_id) in self._items
            ):
                self._items[(tenant, made_by, item_id)] = item
            call_key = items.pairing_key(item)
            # Only calls an upstream emitted are looked up as emitted (provenance, statuses).
            if call_key is not None and not sent and item.get("type") != COMPACTION:
                self._calls.setdefault((tenant, call_key), []).append(item)
        self._expire(now)
        if len(own) > self.max_per_tenant:
            self._forget((tenant, next(iter(own))))
        while len(self._responses) > self.max_responses:
            largest = self._holdings.largest()
            self._forget((largest, next(iter(self._held[largest]))))

    def _expire(self, now: float) -> None:
        while self._responses:
            key, (expires, _) = next(iter(self._responses.items()))
            if expires > now:
                return
            self._forget(key)

    def _forget(self, key: tuple[str, str]) -> None:
        _, recording = self._responses.pop(key)
        tenant = key[0]
        own = self._held[tenant]
        del own[key[1]]
        if not own:
            del self._held[tenant]
        self._holdings.remove(tenant)
        if recording.tools is not None:
            held = self._tools.get((tenant, recording.tools))
            if held is not None:
                held[1] -= 1
                if held[1] <= 0:
                    del self._tools[(tenant, recording.tools)]
        made_by = recording.upstream or ""
        for item in recording.items:
            item_id = item.get("id")
            if isinstance(item_id, str) and self._items.get((tenant, made_by, item_id)) is item:
                del self._items[(tenant, made_by, item_id)]
            call_key = items.pairing_key(item)
            calls = self._calls.get((tenant, call_key)) if call_key is not None else None
            if calls is not None and call_key is not None:
                calls[:] = [c for c in calls if c is not item]
                if not calls:
                    del self._calls[(tenant, call_key)]

    def _get(self, tenant: str, response_id: str) -> RecordedResponse | None:
        found = self._responses.get((tenant, response_id))
        if found is None or found[0] <= time.monotonic():
            return None
        return found[1]

    async def chain(self, tenant: str, response_id: str, depth: int) -> list[RecordedResponse]:
        self._expire(time.monotonic())
        found: list[RecordedResponse] = []
        current: str | None = response_id
        while current is not None and len(found) < depth:
            recording = self._get(tenant, current)
            if recording is None:
                break
            found.append(recording)
            current = recording.previous_response_id
        return found

    async def lookup(
        self,
        tenant: str,
        item_ids: Sequence[str],
        call_ids: Sequence[str],
        *,
        upstream: str | None = None,
    ) -> tuple[dict[str, Item], list[Item]]:
        self._expire(time.monotonic())
        made_by = upstream or ""
        by_id = {
            i: found
            for i in item_ids
            if (found := self._items.get((tenant, made_by, i))) is not None
        }
        calls = [c for call_id in call_ids for c in self._calls.get((tenant, call_id), ())]
        return by_id, calls

    async def tools(self, tenant: str, keys: Sequence[str]) -> dict[str, list[tuple[str, Any]]]:
        return {k: held[0] for k in keys if (held := self._tools.get((tenant, k))) is not None}

    async def close(self) -> None:
        return None

    async def ping(self) -> None:
        return None


# Walks a response chain inside Redis: one round trip whatever its length. A response's value
# is length-prefixed, `<bytes of the previous id>:<previous id><recording as JSON>` (`0:` for
# the first response), so that no byte of an id can end it early. A value that is not a string
# or not so prefixed ends the walk: the store reads it as not recorded ('' for a wrong type).
_CHAIN_SCRIPT = """
local out = {}
local id = ARGV[2]
for i = 1, tonumber(ARGV[3]) do
  local value = redis.pcall('GET', ARGV[1] .. id)
  if type(value) ~= 'string' then
    if value then out[#out + 1] = '' end
    break
  end
  out[#out + 1] = value
  local colon = string.find(value, ':', 1, true)
  if not colon then break end
  local length = tonumber(string.sub(value, 1, colon - 1))
  if not length or length < 1 then break end
  id = string.sub(value, colon + 1, colon + length)
end
return out
"""


def _undecodable(what: str, exc: Exception) -> None:
    log.warning("ledger: %s cannot be read (%s); taken as not recorded", what, exc)


def key_tenant(tenant: str) -> str:
    """A tenant as its Redis keys name it: one with no colon and no `%` as it is (the keys it
    always had); any other with `%` and `:` percent-escaped. A client's name may hold colons,
    and `replay-proxy:<tenant>:<kind>:<name>` must not let `a` and `a:response:b` share a key:
    the tenant a key names ends at its first colon, and no escaped name is a plain one."""
    if ":" not in tenant and "%" not in tenant:
        return tenant
    return tenant.replace("%", "%25").replace(":", "%3A")


def _items_of(upstream: str | None) -> str:
    """The key kind of the items an upstream made (an upstream's name has no colon)."""
    return f"item@{upstream or ''}"


def _item(what: str, value: bytes) -> Item | None:
    """A recorded item read back; None (logged) for a value that is not one."""
    try:
        item = json.loads(value)
    except (ValueError, RecursionError) as exc:
        _undecodable(what, exc)
        return None
    if not isinstance(item, dict):
        _undecodable(what, ValueError("not a JSON object"))
        return None
    return item


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
        # Every response's key, scored by when it expires: what the store holds is counted
        # without a scan, and the index forgets what Redis has expired as it goes.
        self._index = "replay-proxy:responses"

    @staticmethod
    def _key(tenant: str, kind: str, name: str) -> bytes:
        return as_stored(f"replay-proxy:{key_tenant(tenant)}:{kind}:{name}")

    async def _run(self, operation: Any) -> Any:
        try:
            return await asyncio.wait_for(operation, self.timeout_s)
        except LedgerFault:
            raise
        except Exception as exc:
            # redis-py raises its own errors, OSError or a timeout; all mean the same here.
            raise LedgerFault(f"redis: {exc!r}") from None

    async def put(
        self, tenant: str, recording: RecordedResponse, tools: Sequence[tuple[str, Any]] = ()
    ) -> None:
        pipe = self._redis.pipeline(transaction=False)
        key = self._key(tenant, RESPONSE, recording.response_id)
        pipe.set(key, encode_response(recording), ex=self.ttl)
        now = time.time()  # wall clock: every machine sharing the store counts alike
        pipe.zadd(self._index, {key: now + self.ttl})
        pipe.zremrangebyscore(self._index, "-inf", now)
        pipe.expire(self._index, self.ttl)
        if recording.tools is not None:
            tools_key = self._key(tenant, "tools", recording.tools)
            if tools:
                # Stored once per hash; every response that names it keeps it alive.
                pipe.set(tools_key, json.dumps(tools), ex=self.ttl, nx=True)
            pipe.expire(tools_key, self.ttl)
        for index, item in enumerate(recording.items):
            item_id = item.get("id")
            encoded = json.dumps(item)
            sent = index < recording.inputs
            if isinstance(item_id, str):
                # An item a client sent never replaces one an upstream emitted under its id.
                key = self._key(tenant, _items_of(recording.upstream), item_id)
                pipe.set(key, encoded, ex=self.ttl, nx=sent)
            call_key = items.pairing_key(item)
            # Only calls an upstream emitted are looked up as emitted (provenance, statuses).
            if call_key is not None and not sent and item.get("type") != COMPACTION:
                pipe.rpush(self._key(tenant, "call", call_key), encoded)
                pipe.expire(self._key(tenant, "call", call_key), self.ttl)
        await self._run(pipe.execute())

    async def size(self) -> int:
        pipe = self._redis.pipeline(transaction=False)
        pipe.zremrangebyscore(self._index, "-inf", time.time())
        pipe.zcard(self._index)
        _, count = await self._run(pipe.execute())
        return int(count)

    async def chain(self, tenant: str, response_id: str, depth: int) -> list[RecordedResponse]:
        prefix = self._key(tenant, RESPONSE, "")
        named = as_stored(response_id)
        values = await self._run(self._chain(keys=[], args=[prefix, named, depth]))
        found = []
        current = response_id
        for value in values:
            try:
                recording = decode_response(current, bytes(value))
            except (ValueError, RecursionError) as exc:
                # The chain ends where it cannot be read: what came before it still pairs.
                _undecodable(f"the recorded response {current!r}", exc)
                break
            found.append(recording)
            current = recording.previous_response_id or ""
        return found

    async def lookup(
        self,
        tenant: str,
        item_ids: Sequence[str],
        call_ids: Sequence[str],
        *,
        upstream: str | None = None,
    ) -> tuple[dict[str, Item], list[Item]]:
        pipe = self._redis.pipeline(transaction=False)
        if item_ids:
            kind = _items_of(upstream)
            pipe.mget([self._key(tenant, kind, i) for i in item_ids])
        for call_id in call_ids:
            pipe.lrange(self._key(tenant, "call", call_id), 0, -1)
        results = await self._run(pipe.execute()) if item_ids or call_ids else []
        by_id: dict[str, Item] = {}
        if item_ids:
            values = results.pop(0)
            by_id = {
                i: item
                for i, v in zip(item_ids, values, strict=True)
                if v and (item := _item(f"the recorded item {i!r}", v)) is not None
            }
        calls = [
            call
            for call_id, found in zip(call_ids, results, strict=True)
            for v in found
            if (call := _item(f"a recorded call {call_id!r}", v)) is not None
        ]
        return by_id, calls

    async def tools(self, tenant: str, keys: Sequence[str]) -> dict[str, list[tuple[str, Any]]]:
        if not keys:
            return {}
        values = await self._run(self._redis.mget([self._key(tenant, "tools", k) for k in keys]))
        found = {}
        for k, v in zip(keys, values, strict=True):
            if not v:
                continue
            try:
                found[k] = [(str(name), parameters) for name, parameters in json.loads(v)]
            except (ValueError, TypeError, RecursionError) as exc:
                _undecodable(f"the recorded tools {k!r}", exc)
        return found

    async def ping(self) -> None:
        await self._run(self._redis.ping())

    def tool_list_key(self, key: SessionKey) -> bytes:
        """The hash of an MCP session's tool list: `tool:<name>` fields, and `stale` while
        its server's list changed since (a server's name has no colon; the session id ends
        the key)."""
        tenant, server, session = key
        return self._key(tenant, f"mcp-tools@{server}", session)

    async def close(self) -> None:
        await self._redis.aclose()


# A page of a tools/list result, in one round trip: the first page empties the list, every page
# makes it fresh, and past MAX_TOOLS tools only those already listed are updated.
_PAGE_SCRIPT = """
if ARGV[1] == '1' then redis.call('DEL', KEYS[1]) end
redis.call('HDEL', KEYS[1], 'stale')
local count = redis.call('HLEN', KEYS[1])
local most = tonumber(ARGV[3])
for i = 4, #ARGV, 2 do
  if count < most or redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
    count = count + redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
"""
_TOOL = "tool:"
_STALE = "stale"


class RedisLists:
    """The MCP sessions' tool lists in the ledger's Redis: every worker and machine sharing it
    reads the list a session's `tools/list` went through any of them. A read is one round
    trip (the called tools' fields and `stale`, the TTL renewed in the same pipeline)."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._page = store._redis.register_script(_PAGE_SCRIPT)

    async def listed(self, key: SessionKey, names: Collection[str]) -> dict[str, Listed]:
        if not names:
            return {}
        store = self.store
        hashed = store.tool_list_key(key)
        asked = list(names)
        pipe = store._redis.pipeline(transaction=False)
        pipe.hmget(hashed, [_STALE, *(_TOOL + n for n in asked)])
        pipe.expire(hashed, store.ttl)
        values, _ = await store._run(pipe.execute())
        if values[0] is not None:
            return {}
        found = {}
        for name, value in zip(asked, values[1:], strict=True):
            if value is None:
                continue
            tool = Listed.decoded(value)
            if tool is None:
                _undecodable(f"the listed tool {name!r}", ValueError("not [input, output]"))
                continue
            found[name] = tool
        return found

    async def page(self, key: SessionKey, tools: Sequence[tuple[str, Listed]], first: bool) -> None:
        store = self.store
        fields = [part for name, tool in tools for part in (_TOOL + name, tool.encoded())]
        args = ["1" if first else "0", store.ttl, MAX_TOOLS, *fields]
        await store._run(self._page(keys=[store.tool_list_key(key)], args=args))

    async def changed(self, key: SessionKey) -> None:
        store = self.store
        hashed = store.tool_list_key(key)
        pipe = store._redis.pipeline(transaction=False)
        pipe.hset(hashed, _STALE, "1")
        pipe.expire(hashed, store.ttl)
        await store._run(pipe.execute())

    async def forget(self, key: SessionKey) -> None:
        store = self.store
        await store._run(store._redis.delete(store.tool_list_key(key)))
