"""Changes measured in one run: replay-proxy at revisions and in source trees side by side,
beside the bare pass-through.

Run from the repository root: `python bench/rev_ab.py [--base REV] [--head REV] [--tree DIR]...
[--uvloop] [--rounds N]` (needs `wrk` and git; about a minute with the defaults). The tree at
`--base` (default `HEAD`) is exported to a temporary directory and served with `python -P` so
that it imports its own `proxy`; beside it the working tree (or `--head`), and each `--tree`:
a directory holding a `proxy` package, such as a copy with one step taken out to see what it
costs. `--uvloop` serves each of them, and the pass-through, on uvloop's loop too. All run
with the load benchmark's config in front of one stub upstream. Each round drives every body
on each server with `wrk -c32 -d2s`, the measured server on a CPU of its own, the order
rotated, so that the machine's state falls alike on every side. CPU per request is the median
over the rounds. Everything listens on 127.0.0.1 and is stopped (by PID) at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import yaml
from host import Others
from servers import (
    Server,
    free_port,
    served_by_proxy,
    served_by_stub,
    settle,
    started,
    started_stub,
)
from trees import source_trees
from workload import GATE_CONFIG, bodies
from wrk import Run, run_wrk, write_script

BENCH = Path(__file__).resolve().parent
CONNECTIONS = 32
DURATION_S = 2
BODIES = ("small", "10 pairs", "small, SSE")
PASS = "pass-through"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", default="HEAD", help="the revision to compare against")
    parser.add_argument("--head", default=None, help="a revision instead of the working tree")
    parser.add_argument(
        "--tree", action="append", default=[], help="a directory holding a proxy package"
    )
    parser.add_argument("--uvloop", action="store_true", help="each on uvloop's loop too")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--bodies", default=";".join(BODIES), help="bodies of workload.py, `;` between"
    )
    args = parser.parse_args()
    chosen = [b for b in bodies() if b.name in args.bodies.split(";")]
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="replay-rev-ab-")))
        log = stack.enter_context((tmp / "servers.log").open("wb"))
        trees = source_trees(tmp, args.base, args.head, args.tree)
        stub = stack.enter_context(started_stub(log))
        servers: dict[str, tuple[Server, Callable[[], int]]] = {}
        for loop in ("asyncio", "uvloop") if args.uvloop else ("asyncio",):
            suffix = "" if loop == "asyncio" else " uvloop"
            port = free_port()
            argv = [sys.executable, str(BENCH / "passthrough.py"), "--upstream", stub.url]
            argv += ["--port", str(port), *(["--uvloop"] if suffix else [])]
            server = stack.enter_context(started(PASS + suffix, argv, port, log))
            servers[PASS + suffix] = (server, served_by_stub(stub.url))
            for name, path in trees.items():
                config = tmp / f"proxy-{len(servers)}.yaml"
                audit = {"path": str(tmp / f"audit-{len(servers)}.jsonl")}
                config.write_text(yaml.safe_dump({**GATE_CONFIG, "audit": audit}), "utf-8")
                port = free_port()
                argv = [sys.executable, *(["-P"] if path else [])]
                argv += [*([str(BENCH / "on_uvloop.py")] if suffix else []), "-m", "proxy"]
                argv += ["serve", "--upstream", stub.url, "--port", str(port)]
                argv += ["--config", str(config), "--log-level", "WARNING"]
                env = {"PYTHONPATH": str(path)} if path else None
                server = stack.enter_context(started(name + suffix, argv, port, log, env=env))
                servers[name + suffix] = (server, served_by_proxy(server.url))
        scripts = {b.name: write_script(tmp, i, b) for i, b in enumerate(chosen)}
        pids = [server.pid for server, _ in servers.values()]
        others = Others([stub.pid, *pids])
        names = list(servers)
        runs: dict[tuple[str, str], list[Run]] = {}
        for round_no in range(args.rounds):
            order = names[round_no % len(names) :] + names[: round_no % len(names)]
            for body in chosen:
                for name in order:
                    server, served = servers[name]
                    settle(pids)
                    run = run_wrk(
                        scripts[body.name], server.url, server.pid, served, CONNECTIONS, DURATION_S
                    )
                    if run.errors or run.non_2xx:
                        raise SystemExit(f"{name}, {body.name}: {run.errors} errors, {run.non_2xx}")
                    runs.setdefault((body.name, name), []).append(run)
        cores = others.cores()
    print(  # noqa: T201
        f"wrk -c{CONNECTIONS} -d{DURATION_S}s, {args.rounds} rounds, medians of CPU µs per "
        f"request; others took {cores:.2f} cores on average"
    )
    first = names[1]
    print(  # noqa: T201
        f"| body | server | CPU µs/request | each round | x pass-through | x {first} | "
        "page faults/request | peak RSS MB |"
    )
    print("| :--- | :--- |" + " ---: |" * 6)  # noqa: T201
    for body in chosen:
        cpu = {n: statistics.median(r.cpu_us for r in runs[body.name, n]) for n in names}
        for name in names:
            ran = runs[body.name, name]
            rounds = ", ".join(f"{r.cpu_us:,.0f}" for r in ran)
            faults = statistics.median(r.faults for r in ran)
            peak = max(r.peak_rss_mb for r in ran)
            passing = cpu[PASS + (" uvloop" if name.endswith(" uvloop") else "")]
            print(  # noqa: T201
                f"| {body.name} | {name} | {cpu[name]:,.0f} | {rounds} | "
                f"{cpu[name] / passing:.2f}x | {cpu[name] / cpu[first]:.2f}x | "
                f"{faults:.2f} | {peak:.1f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
