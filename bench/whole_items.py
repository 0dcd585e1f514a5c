"""What `ledger.whole_items: true` costs: memory per recorded response and per whole item, and the
bytes each Redis value grows by.

`python bench/whole_items.py` — records typical tool turns in the memory store with and without
the whole items (tracemalloc, the JSON parsed inside the measurement as the proxy parses it), and
encodes the same recordings as the Redis backend stores them. Prints Markdown.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from responses import TOOLS, call_item, message_item, response

from proxy.state.encoding import encode
from proxy.state.ledger import Ledger
from proxy.state.recording import Context, RecordedResponse, kept, tools_key
from proxy.state.stores import MemoryStore

COUNT = 10_000


def user_message(n: int) -> dict[str, Any]:
    text = f"What were the sales in EMEA in week 47? (turn {n})"
    return {"type": "message", "role": "user", "content": text}


def turn(n: int) -> tuple[dict[str, Any], list[Any]]:
    """A typical tool turn (reasoning, a call, a message) made by a request that sent one user
    message."""
    return response(n), [user_message(n)]


def with_extra(make: Callable[[int, int], dict[str, Any]], count: int) -> Callable[[int], Any]:
    """The typical turn with `count` more output items made by `make`."""

    def shaped(n: int) -> tuple[dict[str, Any], list[Any]]:
        answer, sent = turn(n)
        answer["output"] += [make(n, k) for k in range(count)]
        return answer, sent

    return shaped


async def per_response(make: Callable[[int], Any], *, whole: bool) -> float:
    """Bytes the memory store holds per recorded response made by `make`."""
    store = MemoryStore(max_responses=COUNT * 2, ttl_s=3600)
    ledger = Ledger(store, max_chain=64, fail_open=False)
    encoded = [tuple(json.dumps(part) for part in make(n)) for n in range(COUNT)]
    key = tools_key(TOOLS)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for answer, sent_text in encoded:
        sent = json.loads(sent_text)
        found = [item for item in (kept(i, key) for i in sent) if item is not None]
        context = Context.of(found, TOOLS, False)
        if whole:
            context = Context(context.items, context.tools, False, context.tools_key, tuple(sent))
        await ledger.record("tenant", json.loads(answer), context, "openai")
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / COUNT


def redis_bytes(make: Callable[[int], Any], *, whole: bool) -> int:
    """The bytes of one response's value in Redis (its items' own keys are kept either way)."""
    answer, sent = make(7)
    context = Context.of([], TOOLS, False)
    if whole:
        context = Context((), context.tools, False, context.tools_key, tuple(sent))
    recording = RecordedResponse.of(answer, context, "openai")
    assert recording is not None
    return len(encode(recording).encode())


async def main() -> None:
    rows = []
    base_off = await per_response(turn, whole=False)
    base_on = await per_response(turn, whole=True)
    rows.append(
        ("a typical tool turn (user message in; reasoning, call, message out)", base_on - base_off)
    )
    for name, make in (("function_call", call_item), ("assistant message", message_item)):
        extra = with_extra(make, 10)
        off = await per_response(extra, whole=False)
        on = await per_response(extra, whole=True)
        rows.append(
            (f"each further {name} in its output", ((on - off) - (base_on - base_off)) / 10)
        )
    redis_base = redis_bytes(turn, whole=True) - redis_bytes(turn, whole=False)
    lines = [
        "| whole items: what each adds | memory | Redis value |",
        "|---|---:|---:|",
        f"| {rows[0][0]} | {rows[0][1] / 1024:.2f} KB | {redis_base / 1024:.2f} KB |",
    ]
    for (name, cost), make in zip(rows[1:], (call_item, message_item), strict=True):
        extra = with_extra(make, 10)
        grown = redis_bytes(extra, whole=True) - redis_bytes(extra, whole=False)
        per_item = (grown - redis_base) / 10
        lines.append(f"| {name} | {cost / 1024:.2f} KB | {per_item / 1024:.2f} KB |")
    lines.append(f"\nwithout whole items, a typical tool turn holds {base_off / 1024:.2f} KB")
    print("\n".join(lines))  # noqa: T201


if __name__ == "__main__":
    asyncio.run(main())
