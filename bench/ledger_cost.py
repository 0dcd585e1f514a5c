"""What the ledger costs: memory per recorded response, and the time the Redis backend adds.

`python bench/ledger_cost.py` — starts its own redis-server on a free loopback port (Debian's
`redis-server` must be installed), records typical responses in the memory store and in Redis,
and times a follow-up turn's ledger work (record the response, then read the chain back), the
per-request cost the ledger adds on top of the gate. Medians of many samples; prints Markdown.
"""

from __future__ import annotations

import asyncio
import gc
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.state.ledger import Ledger, Store
from proxy.state.stores import MemoryStore, RedisStore

SAMPLES = 2000


def response(n: int) -> dict[str, Any]:
    """A typical tool turn: a reasoning item, a function call, and a short message."""
    return {
        "id": f"resp_{n:012d}",
        "object": "response",
        "previous_response_id": f"resp_{n - 1:012d}" if n else None,
        "output": [
            {"type": "reasoning", "id": f"rs_{n:012d}", "summary": []},
            {
                "type": "function_call",
                "id": f"fc_{n:012d}",
                "call_id": f"call_{n:012d}",
                "name": "get_latest_sales_report",
                "status": "completed",
                "arguments": '{"region":"emea","week":"2026-W47"}',
            },
            {
                "type": "message",
                "id": f"msg_{n:012d}",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": "Checking the report.", "annotations": []}
                ],
            },
        ],
    }


def follow_up(n: int) -> dict[str, Any]:
    call = f"call_{n:012d}"
    return {
        "previous_response_id": f"resp_{n:012d}",
        "input": [{"type": "function_call_output", "call_id": call, "output": "ok"}],
    }


async def memory_per_response(count: int) -> float:
    store = MemoryStore(max_responses=count * 2, ttl_s=3600)
    ledger = Ledger(store, max_chain=64, fail_open=False)
    responses = [response(n) for n in range(count)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for r in responses:
        await ledger.record("tenant", r)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / count


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


def start_redis(directory: str) -> tuple[subprocess.Popen[bytes], str]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            directory,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return process, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    process.terminate()
    raise SystemExit("redis-server did not start")


async def main() -> None:
    per_response = await memory_per_response(20_000)
    memory = await turn_cost(MemoryStore(max_responses=100_000, ttl_s=3600))
    with tempfile.TemporaryDirectory() as directory:
        redis, url = start_redis(directory)
        try:
            store = RedisStore(url, ttl_s=3600, timeout_s=1.0)
            try:
                shared = await turn_cost(store)
            finally:
                await store.close()
        finally:
            redis.terminate()
            redis.wait(timeout=30)
    lines = ["| measure | memory | redis | redis - memory |", "| :--- | ---: | ---: | ---: |"]
    for label, m, r in (
        ("record a response, µs", memory[0], shared[0]),
        ("view of its follow-up (a 64-response chain), µs", memory[1], shared[1]),
        ("per turn, µs", sum(memory), sum(shared)),
    ):
        lines.append(f"| {label} | {m:,.1f} | {r:,.1f} | {r - m:,.1f} |")
    lines.append(
        f"\nMemory store: {per_response:,.0f} bytes per recorded response (tracemalloc; 20,000 "
        "responses of a reasoning item, a function call and a message)."
    )
    print("\n".join(lines))  # noqa: T201


if __name__ == "__main__":
    asyncio.run(main())
