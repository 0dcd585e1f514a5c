"""What the ledger costs: memory per recorded response, and the time the Redis backend adds.

`python bench/ledger_cost.py` — starts its own redis-server on a free loopback port (Debian's
`redis-server` must be installed), measures what the memory store holds per recorded response
and per recorded item of each kind, records typical responses in the memory store and in Redis,
and times a follow-up turn's ledger work (record the response, then read the chain back), the
per-request cost the ledger adds on top of the gate. Medians of many samples; prints Markdown.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from responses import TOOLS, follow_up, response, shaped
from servers import started_redis

from proxy.state.ledger import Ledger, Store
from proxy.state.recording import Context, kept, tools_key
from proxy.state.stores import MemoryStore, RedisStore

SAMPLES = 2000


async def memory_per_response(
    count: int, make: Callable[[int], tuple[dict[str, Any], list[Any]]]
) -> float:
    """Bytes the memory store holds per recorded response made by `make` (tracemalloc).

    Each response and its request's input are parsed from JSON inside the measurement, as the
    proxy parses them, so that the strings the store keeps are counted."""
    store = MemoryStore(max_responses=count * 2, ttl_s=3600)
    ledger = Ledger(store, max_chain=64, fail_open=False)
    encoded = [tuple(json.dumps(part) for part in make(n)) for n in range(count)]
    key = tools_key(TOOLS)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for answer, sent in encoded:
        found = [kept(item, key) for item in json.loads(sent)]
        context = Context.of([item for item in found if item is not None], TOOLS, False)
        await ledger.record("tenant", json.loads(answer), context)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / count


async def memory_costs(count: int) -> list[tuple[str, float]]:
    """Bytes per recorded response of several shapes, and per recorded item of each kind."""
    empty = await memory_per_response(count, lambda n: shaped(n, 0, 0, 0))
    one_call = await memory_per_response(count, lambda n: shaped(n, 1, 0, 0))
    many_calls = await memory_per_response(count, lambda n: shaped(n, 11, 0, 0))
    many_messages = await memory_per_response(count, lambda n: shaped(n, 1, 10, 0))
    many_inputs = await memory_per_response(count, lambda n: shaped(n, 1, 0, 10))
    typical = await memory_per_response(count, lambda n: (response(n), []))
    return [
        ("a response with nothing to pair (its tools by hash)", empty),
        ("a response with one call", one_call),
        ("a typical tool turn: reasoning, a call, a message", typical),
        ("each further call in its output", (many_calls - one_call) / 10),
        ("each message id in its output", (many_messages - one_call) / 10),
        ("each unanswered call of the request's input", (many_inputs - one_call) / 10),
    ]


async def turn_cost(store: Store) -> tuple[float, float]:
    """Median µs to record a response, and to read the ledger view of its follow-up."""
    ledger = Ledger(store, max_chain=64, fail_open=False)
    record_us, view_us = [], []
    for n in range(SAMPLES):
        started = time.perf_counter()
        await ledger.record("tenant", response(n))
        recorded = time.perf_counter()
        view = await ledger.view("tenant", follow_up(n), provenance=False)
        done = time.perf_counter()
        assert view is not None
        assert view.calls(f"call_{n:012d}"), "the follow-up must pair"
        record_us.append((recorded - started) * 1e6)
        view_us.append((done - recorded) * 1e6)
    return statistics.median(record_us), statistics.median(view_us)


async def main() -> None:
    costs = await memory_costs(10_000)
    memory = await turn_cost(MemoryStore(max_responses=100_000, ttl_s=3600))
    with ExitStack() as stack:
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        log = stack.enter_context((directory / "redis.log").open("wb"))
        redis = stack.enter_context(started_redis(directory, log))
        store = RedisStore(f"redis://127.0.0.1:{redis.port}/0", ttl_s=3600, timeout_s=1.0)
        try:
            shared = await turn_cost(store)
        finally:
            await store.close()
    lines = ["| measure | memory | redis | redis - memory |", "| :--- | ---: | ---: | ---: |"]
    for label, m, r in (
        ("record a response, µs", memory[0], shared[0]),
        ("view of its follow-up (a 64-response chain), µs", memory[1], shared[1]),
        ("per turn, µs", sum(memory), sum(shared)),
    ):
        lines.append(f"| {label} | {m:,.1f} | {r:,.1f} | {r - m:,.1f} |")
    lines += ["", "| memory store, per recorded | bytes |", "| :--- | ---: |"]
    lines += [f"| {label} | {cost:,.0f} |" for label, cost in costs]
    lines.append("\n(tracemalloc over 10,000 responses of each shape; tools stored once per hash.)")
    print("\n".join(lines))  # noqa: T201


if __name__ == "__main__":
    asyncio.run(main())
