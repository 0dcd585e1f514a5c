"""asyncio against uvloop in one run: replay-proxy and the pass-through, each on both loops.

Run from the repository root: `python bench/loop_ab.py` (needs `wrk`; about 40 s). The four
servers run side by side, in front of one stub upstream. Each body gets `wrk -c32 -d2s` on
each server, the order rotated each round, 3 rounds. The medians of CPU per request are
printed. Everything listens on 127.0.0.1 and is stopped at the end.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import yaml
from servers import (
    Server,
    free_port,
    served_by_proxy,
    served_by_stub,
    settle,
    started,
    started_stub,
)
from workload import GATE_CONFIG, bodies
from wrk import run_wrk, write_script

BENCH = Path(__file__).resolve().parent
ROUNDS = 3
DURATION_S = 2
BODIES = ("small", "10 pairs", "small, SSE")


def main() -> int:
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="replay-ab-")))
        log = stack.enter_context((tmp / "servers.log").open("wb"))
        config = tmp / "proxy.yaml"
        audit = {"path": str(tmp / "audit.jsonl")}
        config.write_text(yaml.safe_dump({**GATE_CONFIG, "audit": audit}), encoding="utf-8")
        stub = stack.enter_context(started_stub(log, "direct"))
        servers: dict[str, tuple[Server, Callable[[], int]]] = {}
        for loop in ("asyncio", "uvloop"):
            port = free_port()
            argv = [sys.executable, str(BENCH / "passthrough.py"), "--upstream", stub.url]
            argv += ["--port", str(port), *(["--uvloop"] if loop == "uvloop" else [])]
            server = stack.enter_context(started(f"pass-through {loop}", argv, port, log))
            servers[f"pass-through {loop}"] = (server, served_by_stub(stub.url))
        for loop in ("asyncio", "uvloop"):
            port = free_port()
            argv = [sys.executable, *([str(BENCH / "on_uvloop.py")] if loop == "uvloop" else [])]
            argv += ["-m", "proxy", "serve", "--upstream", stub.url, "--port", str(port)]
            argv += ["--config", str(config), "--log-level", "WARNING"]
            server = stack.enter_context(started(f"replay-proxy {loop}", argv, port, log))
            servers[f"replay-proxy {loop}"] = (server, served_by_proxy(server.url))
        pids = [server.pid for server, _ in servers.values()]
        chosen = [b for b in bodies() if b.name in BODIES]
        scripts = {b.name: write_script(tmp, i, b) for i, b in enumerate(chosen)}
        cpu: dict[tuple[str, str], list[float]] = {}
        names = list(servers)
        for round_no in range(ROUNDS):
            order = names[round_no % len(names) :] + names[: round_no % len(names)]
            for body in chosen:
                for name in order:
                    server, served = servers[name]
                    settle(pids)
                    script = scripts[body.name]
                    run = run_wrk(script, server.url, server.pid, served, 32, DURATION_S)
                    cpu.setdefault((body.name, name), []).append(run.cpu_us)
    print("| body | " + " | ".join(f"{n} µs" for n in names) + " | uvloop / asyncio, proxy |")  # noqa: T201
    print("| :--- |" + " ---: |" * (len(names) + 1))  # noqa: T201
    for body in chosen:
        med = {n: statistics.median(cpu[body.name, n]) for n in names}
        ratio = med["replay-proxy uvloop"] / med["replay-proxy asyncio"]
        cells = " | ".join(f"{med[n]:,.0f}" for n in names)
        print(f"| {body.name} | {cells} | {ratio:.2f}x |")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
