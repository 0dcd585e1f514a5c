"""A bounded soak of a real `replay-proxy serve`: mixed load for a set time, then every check.

`python bench/soak.py --seconds 300` drives concurrent clean, stripped and blocked requests
and SSE streams through the proxy (a subprocess) to an upstream on 127.0.0.1, then checks:
no 5xx from the proxy, exactly one audit record per rejected request (and an intact hash
chain), the ledger and verdict cache within their bounds, RSS flat after warm-up, and open
file descriptors back to baseline. Prints a JSON report; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

REPO = Path(__file__).resolve().parent.parent
SALES = {
    "type": "object",
    "additionalProperties": False,
    "required": ["region"],
    "properties": {"region": {"type": "string", "enum": ["apac", "emea", "amer"]}},
}
TOOLS = [{"type": "function", "name": "get_latest_sales_report", "parameters": SALES}]
MAX_RESPONSES = 200
MAX_VERDICTS = 300


def call(call_id: str, arguments: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": "get_latest_sales_report",
        "status": "completed",
        "arguments": arguments,
    }


def output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "ok"}


def body(kind: str, n: int) -> dict[str, Any]:
    """A request of a kind; `n` makes arguments (and so verdict cache keys) vary."""
    region = ("apac", "emea", "amer")[n % 3]
    clean = call(f"c{n}", json.dumps({"region": region}))
    items: list[Any] = [{"role": "user", "content": f"turn {n}"}, clean, output(f"c{n}")]
    if kind == "strip":
        items += [call(f"s{n}", '{"region":"apac"} trailing'), output(f"s{n}")]
    if kind == "block":
        items += [call(f"b{n}", json.dumps({"region": f"mars-{n}"})), output(f"b{n}")]
    return {"model": "soak", "input": items, "tools": TOOLS, "stream": kind == "stream"}


class Upstream:
    """Answers JSON with a function_call (so the ledger records), or an SSE stream."""

    def __init__(self) -> None:
        self.served = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        self.served += 1
        response = {
            "id": f"resp_{self.served}",
            "object": "response",
            "status": "completed",
            "output": [call(f"u{self.served}", '{"region":"emea"}')],
        }
        if not payload.get("stream"):
            return web.json_response(response)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        for i in range(5):
            event = {"type": "response.output_text.delta", "delta": f"part {i}"}
            await stream.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        done = {"type": "response.completed", "response": response}
        await stream.write(f"event: response.completed\ndata: {json.dumps(done)}\n\n".encode())
        await stream.write(b"data: [DONE]\n\n")
        await stream.write_eof()
        return stream


def rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+)", status)
    return int(found.group(1)) if found else 0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def metric(session: aiohttp.ClientSession, base: str, name: str) -> float:
    async with session.get(base + "/-/metrics") as response:
        text = await response.text()
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else float("nan")


async def soak(seconds: float, concurrency: int) -> dict[str, Any]:
    upstream = Upstream()
    app = web.Application()
    app.router.add_post("/v1/responses", upstream.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    upstream_port = runner.addresses[0][1]
    workdir = Path(tempfile.mkdtemp(prefix="replay-proxy-soak-"))
    audit = workdir / "audit.jsonl"
    config = workdir / "proxy.yaml"
    config.write_text(
        json.dumps(
            {
                "audit": {"path": str(audit)},
                "gate": {
                    "action": "block",
                    "actions": {"arguments_parse": "strip"},
                    "max_cached_verdicts": MAX_VERDICTS,
                },
                "ledger": {"max_responses": MAX_RESPONSES},
            }
        )
    )
    log = workdir / "proxy.log"
    proxy = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "proxy",
            "serve",
            "--config",
            str(config),
            "--port",
            "0",
            "--upstream",
            f"http://127.0.0.1:{upstream_port}",
        ],
        stderr=log.open("wb"),
        cwd=REPO,
    )
    try:
        return await _drive(proxy, log, upstream, audit, seconds, concurrency)
    finally:
        if proxy.poll() is None:
            proxy.terminate()
        proxy.wait(timeout=60)
        await runner.cleanup()


async def _drive(
    proxy: subprocess.Popen[bytes],
    log: Path,
    upstream: Upstream,
    audit: Path,
    seconds: float,
    concurrency: int,
) -> dict[str, Any]:
    base = await _listening(proxy, log)
    statuses: Counter[str] = Counter()
    sent: Counter[str] = Counter()
    kinds = ("clean", "strip", "block", "stream")
    counter = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            nonlocal counter
            counter += 1
            kind = kinds[counter % len(kinds)]
            sent[kind] += 1
            async with session.post(base + "/v1/responses", json=body(kind, counter)) as response:
                await response.read()
                statuses[f"{kind} {response.status}"] += 1

        async def worker(until: float) -> None:
            while time.monotonic() < until:
                await one()

        warmup = min(2.0, seconds / 4)
        await asyncio.gather(*(worker(time.monotonic() + warmup) for _ in range(concurrency)))
        rss_start, fds_start = rss_kb(proxy.pid), fds(proxy.pid)
        await asyncio.gather(*(worker(time.monotonic() + seconds) for _ in range(concurrency)))
        ledger = await metric(session, base, "replay_proxy_ledger_responses")
        verdicts = await metric(session, base, "replay_proxy_verdict_cache_entries")
    # Idle: every client connection closed; the proxy's pool to the upstream may stay open.
    await asyncio.sleep(0.5)
    rss_end, fds_end = rss_kb(proxy.pid), fds(proxy.pid)
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    verify = subprocess.run(
        [sys.executable, "-m", "proxy", "audit", "verify", str(audit)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    rejected = statuses["block 400"] + statuses["strip 200"]
    five_xx = sum(n for key, n in statuses.items() if key.split()[1].startswith("5"))
    checks = {
        "no_5xx": five_xx == 0,
        "every_answer_expected": set(statuses)
        <= {"clean 200", "strip 200", "block 400", "stream 200"},
        "one_audit_record_per_rejection": len(records) == rejected,
        "audit_chain_intact": verify.returncode == 0,
        "ledger_within_bound": ledger <= MAX_RESPONSES,
        "verdict_cache_within_bound": verdicts <= MAX_VERDICTS,
        # Flat: what the proxy holds after warm-up does not keep growing with the requests.
        "rss_flat": rss_end - rss_start < max(16_384, rss_start // 5),
        "fds_back_to_baseline": fds_end <= fds_start,
    }
    return {
        "seconds": seconds,
        "concurrency": concurrency,
        "requests": sum(statuses.values()),
        "by_kind_and_status": dict(sorted(statuses.items())),
        "rejected": rejected,
        "audit_records": len(records),
        "upstream_served": upstream.served,
        "ledger_responses": ledger,
        "verdict_cache_entries": verdicts,
        "rss_kb": {"after_warmup": rss_start, "end": rss_end},
        "fds": {"after_warmup": fds_start, "end": fds_end},
        "checks": checks,
        "ok": all(checks.values()),
    }


async def _listening(proxy: subprocess.Popen[bytes], log: Path) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proxy.poll() is None:
        found = re.search(r"listening on (http://\S+),", log.read_text())
        if found:
            return found.group(1)
        await asyncio.sleep(0.05)
    raise RuntimeError("the proxy did not start: " + log.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="load time after warm-up")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    if not 0 < args.seconds <= 3600 or not 0 < args.concurrency <= 256:
        parser.error("--seconds must be in (0, 3600] and --concurrency in (0, 256]")
    report = asyncio.run(soak(args.seconds, args.concurrency))
    print(json.dumps(report, indent=2))  # noqa: T201
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
