"""One optimisation's effect measured in one run: replay-proxy at a revision against the working
tree, beside the bare pass-through.

Run from the repository root: `python bench/rev_ab.py [--base REV] [--rounds N]` (needs `wrk`
and git; about a minute with the defaults). The tree at REV (default `HEAD`) is exported to a
temporary directory and served with `python -P` so that it imports its own `proxy`; the working
tree is served beside it, with the load benchmark's config, and the pass-through beside both,
all in front of one stub upstream. Each round drives every body on each server with
`wrk -c32 -d2s`, the order rotated, so that the machine's state falls alike on every side. CPU
per request is the median over the rounds. Everything listens on 127.0.0.1 and is stopped (by
PID) at the end.
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
from emitted_cost import export
from host import Others
from servers import Server, free_port, served_by_proxy, served_by_stub, settle, started
from workload import GATE_CONFIG, bodies
from wrk import run_wrk, write_script

BENCH = Path(__file__).resolve().parent
CONNECTIONS = 32
DURATION_S = 2
BODIES = ("small", "10 pairs", "small, SSE")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", default="HEAD", help="the revision to compare against")
    parser.add_argument("--head", default=None, help="a revision instead of the working tree")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="replay-rev-ab-")))
        log = stack.enter_context((tmp / "servers.log").open("wb"))
        (tmp / "base").mkdir()
        short = export(args.base, tmp / "base")
        head = None
        if args.head is not None:
            (tmp / "head").mkdir()
            head = export(args.head, tmp / "head")
        port = free_port()
        stub_argv = [sys.executable, str(BENCH / "stub_upstream.py"), "--port", str(port)]
        stub = stack.enter_context(started("stub", stub_argv, port, log))
        servers: dict[str, tuple[Server, Callable[[], int]]] = {}
        port = free_port()
        argv = [sys.executable, str(BENCH / "passthrough.py"), "--upstream", stub.url]
        server = stack.enter_context(
            started("pass-through", [*argv, "--port", str(port)], port, log)
        )
        servers["pass-through"] = (server, served_by_stub(stub.url))
        second = ("proxy tree", None) if head is None else (f"proxy {head}", tmp / "head")
        for name, path in ((f"proxy {short}", tmp / "base"), second):
            config = tmp / f"proxy-{len(servers)}.yaml"
            audit = {"path": str(tmp / f"audit-{len(servers)}.jsonl")}
            config.write_text(yaml.safe_dump({**GATE_CONFIG, "audit": audit}), encoding="utf-8")
            port = free_port()
            argv = [sys.executable, *(["-P"] if path else []), "-m", "proxy", "serve"]
            argv += ["--upstream", stub.url, "--port", str(port), "--config", str(config)]
            argv += ["--log-level", "WARNING"]
            env = {"PYTHONPATH": str(path)} if path else None
            server = stack.enter_context(started(name, argv, port, log, env=env))
            servers[name] = (server, served_by_proxy(server.url))
        chosen = [b for b in bodies() if b.name in BODIES]
        scripts = {b.name: write_script(tmp, i, b) for i, b in enumerate(chosen)}
        pids = [server.pid for server, _ in servers.values()]
        others = Others([stub.pid, *pids])
        names = list(servers)
        cpu: dict[tuple[str, str], list[float]] = {}
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
                    cpu.setdefault((body.name, name), []).append(run.cpu_us)
        cores = others.cores()
    base, tree = names[1], names[2]
    print(  # noqa: T201
        f"wrk -c{CONNECTIONS} -d{DURATION_S}s, {args.rounds} rounds, medians of CPU µs per "
        f"request; other processes took {cores:.2f} cores on average"
    )
    print(f"| body | pass-through | {base} | {tree} | tree / base | {base} / pass | tree / pass |")  # noqa: T201
    print("| :--- |" + " ---: |" * 6)  # noqa: T201
    for body in chosen:
        med = {n: statistics.median(cpu[body.name, n]) for n in names}
        p = med["pass-through"]
        print(  # noqa: T201
            f"| {body.name} | {p:,.0f} | {med[base]:,.0f} | {med[tree]:,.0f} | "
            f"{med[tree] / med[base]:.2f}x | {med[base] / p:.2f}x | {med[tree] / p:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
