"""A bounded soak of a real `replay-proxy serve`: mixed load for a set time, then every check.

`python bench/soak.py --seconds 300` drives concurrent clean, stripped and blocked requests
and SSE streams (the workload's bodies, each with arguments of its own) through the proxy (a
subprocess) to the stub upstream on 127.0.0.1, both started by `servers.py`, then checks:
no 5xx from the proxy, exactly one audit record per rejected request (and an intact hash
chain), the ledger and verdict cache within their bounds, RSS flat after warm-up, and open
file descriptors back to baseline. Prints a JSON report; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from host import ROOT
from servers import Server, free_port, memory_mb, metric, served_by_stub, started, started_stub
from workload import GATE_CONFIG, HEADERS, PATH, numbered

MAX_RESPONSES = 200
MAX_VERDICTS = 300
KINDS = {"clean": "clean", "strip": "strip", "block": "block", "stream": "sse"}  # -> workload's


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kb(pid: int) -> int:
    return round(memory_mb(pid, "VmRSS") * 1024)


def soak(seconds: float, concurrency: int) -> dict[str, Any]:
    """Start the stub upstream and the proxy (the workload's gate config, an audit log, small
    ledger and verdict cache bounds), drive them, and stop both."""
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="replay-soak-")))
        log = stack.enter_context((workdir / "servers.log").open("wb"))
        audit = workdir / "audit.jsonl"
        config = workdir / "proxy.yaml"
        sections = {
            **GATE_CONFIG,
            "gate": {**GATE_CONFIG["gate"], "max_cached_verdicts": MAX_VERDICTS},
            "audit": {"path": str(audit)},
            "ledger": {"max_responses": MAX_RESPONSES},
        }
        config.write_text(yaml.safe_dump(sections), encoding="utf-8")
        stub = stack.enter_context(started_stub(log))
        port = free_port()
        argv = [sys.executable, "-m", "proxy", "serve", "--config", str(config)]
        argv += ["--port", str(port), "--upstream", stub.url]
        proxy = stack.enter_context(started("proxy", argv, port, log))
        report = asyncio.run(_drive(proxy, seconds, concurrency))
        # Idle: every client connection closed; the proxy's pool to the upstream may stay open.
        time.sleep(0.5)
        rss_end, fds_end = rss_kb(proxy.pid), fds(proxy.pid)
        records = audit.read_text().splitlines() if audit.exists() else []
        verify = subprocess.run(
            [sys.executable, "-m", "proxy", "audit", "verify", str(audit)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        served = served_by_stub(stub.url)()
    statuses: Counter[str] = report.pop("statuses")
    rss_start, fds_start = report.pop("rss_start"), report.pop("fds_start")
    ledger, verdicts = report.pop("ledger"), report.pop("verdicts")
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
        "upstream_served": served,
        "ledger_responses": ledger,
        "verdict_cache_entries": verdicts,
        "rss_kb": {"after_warmup": rss_start, "end": rss_end},
        "fds": {"after_warmup": fds_start, "end": fds_end},
        "checks": checks,
        "ok": all(checks.values()),
    }


async def _drive(proxy: Server, seconds: float, concurrency: int) -> dict[str, Any]:
    """Warm up, then every kind of request in turn from `concurrency` clients for `seconds`;
    the answers by kind and status, and the proxy's memory, descriptors and bounds."""
    statuses: Counter[str] = Counter()
    kinds = list(KINDS)
    counter = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            nonlocal counter
            counter += 1
            kind = kinds[counter % len(kinds)]
            data = numbered(KINDS[kind], counter)
            async with session.post(proxy.url + PATH, data=data, headers=HEADERS) as response:
                await response.read()
                statuses[f"{kind} {response.status}"] += 1

        async def worker(until: float) -> None:
            while time.monotonic() < until:
                await one()

        warmup = min(2.0, seconds / 4)
        await asyncio.gather(*(worker(time.monotonic() + warmup) for _ in range(concurrency)))
        rss_start, fds_start = rss_kb(proxy.pid), fds(proxy.pid)
        await asyncio.gather(*(worker(time.monotonic() + seconds) for _ in range(concurrency)))
    return {
        "statuses": statuses,
        "rss_start": rss_start,
        "fds_start": fds_start,
        "ledger": metric(proxy.url, "replay_proxy_ledger_responses"),
        "verdicts": metric(proxy.url, "replay_proxy_verdict_cache_entries"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="load time after warm-up")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    if not 0 < args.seconds <= 3600 or not 0 < args.concurrency <= 256:
        parser.error("--seconds must be in (0, 3600] and --concurrency in (0, 256]")
    report = soak(args.seconds, args.concurrency)
    print(json.dumps(report, indent=2))  # noqa: T201
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
