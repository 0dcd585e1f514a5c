"""Load benchmark: replay-proxy vs a bare aiohttp pass-through vs a direct connection, with wrk.

Run from the repository root: `python bench/load.py [--quick]` (needs `wrk` on the PATH).
Everything listens on 127.0.0.1 and is stopped at the end; every load run is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, replace
from pathlib import Path
from typing import IO

import litellm_target
import yaml
from client import check_answers, hold_streams, measure_streams
from host import Others, describe, wait_for_quiet
from load_report import TARGETS, render
from plan import FULL, QUICK, Plan
from report import write_section
from servers import (
    Server,
    free_port,
    memory_mb,
    reset_peak_rss,
    served_by_proxy,
    served_by_stub,
    settle,
    started,
    started_stub,
)
from workload import GATE_CONFIG, Body, bodies, encode, iter_pairs, request_body
from wrk import Run, run_wrk, write_script

BENCH = Path(__file__).resolve().parent


def rotated(items: tuple[str, ...], by: int) -> list[str]:
    by %= len(items)
    return [*items[by:], *items[:by]]


# The bodies of issue 5's LiteLLM row: it has no figure for the 1 MB body.
LITELLM_BODIES = ("small", "10 pairs")


def drive_litellm(
    stack: ExitStack,
    plan: Plan,
    tmp: Path,
    log: IO[bytes],
    stub: Server,
    scripts: dict[str, Path],
    bench_bodies: list[Body],
) -> dict[str, list[Run]]:
    """LiteLLM's proxy in front of the same stub, driven like the others (after them: it takes
    a core and some 350 MB while it runs, and is stopped before this returns)."""
    port = free_port()
    argv, env = litellm_target.argv_and_config(stub.url, port, tmp)
    print("starting LiteLLM (some 10 s)", file=sys.stderr)  # noqa: T201
    with started("litellm", argv, port, log, env=env, ready_s=90) as server:
        served = served_by_stub(stub.url)
        small = next(b for b in bench_bodies if b.name == "small")
        run_wrk(scripts[small.name], server.url, server.pid, served, plan.connections, 2)
        runs: dict[str, list[Run]] = {}
        for round_no in range(plan.rounds):
            for name in LITELLM_BODIES:
                run = run_wrk(scripts[name], server.url, server.pid, served, plan.connections, 3)
                runs.setdefault(name, []).append(run)
                print(  # noqa: T201
                    f"round {round_no + 1} {name:<17} litellm       {run.rps:>9,.0f} req/s  "
                    f"cpu {run.cpu_us:9,.0f} µs/req  non-2xx {run.non_2xx}",
                    file=sys.stderr,
                )
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one short round (~1 minute)")
    parser.add_argument("--rounds", type=int, help="rounds of wrk runs (default 3, quick 1)")
    parser.add_argument("--duration", type=int, help="whole seconds per wrk run")
    parser.add_argument("--no-write", action="store_true", help="do not update the docs")
    parser.add_argument(
        "--no-litellm", action="store_true", help="leave out LiteLLM even if it is installed"
    )
    parser.add_argument(
        "--uvloop",
        action="store_true",
        help="run the pass-through and replay-proxy on uvloop's event loop",
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("load.py needs wrk on the PATH (Debian: apt-get install wrk)", file=sys.stderr)  # noqa: T201
        return 2
    plan = QUICK if args.quick else FULL
    if args.rounds is not None or args.duration is not None:
        plan = Plan(
            **{
                **asdict(plan),
                "rounds": args.rounds or plan.rounds,
                "duration_s": args.duration or plan.duration_s,
            }
        )
    command = "python bench/load.py" + "".join(
        f" {flag}"
        for flag, on in (
            ("--quick", args.quick),
            (f"--rounds {args.rounds}", args.rounds is not None),
            (f"--duration {args.duration}", args.duration is not None),
            ("--uvloop", args.uvloop),
        )
        if on
    )

    bench_bodies = [b for b in bodies() if plan.large_failing or b.pairs < 400 or b.kind == "clean"]
    stream_bodies = [
        next(b for b in bench_bodies if b.kind == "sse"),
        Body("10 pairs, SSE", encode(request_body(iter_pairs(10), stream=True)), 10, "sse"),
    ]
    unloaded_bodies = [b for b in bench_bodies if b.kind == "clean" and b.pairs <= 10]
    started_at = time.monotonic()

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="replay-bench-")))
        log = stack.enter_context((tmp / "servers.log").open("wb"))
        audit = tmp / "audit.jsonl"
        config = tmp / "proxy.yaml"
        config.write_text(
            yaml.safe_dump({**GATE_CONFIG, "audit": {"path": str(audit)}}), encoding="utf-8"
        )
        pass_port, proxy_port = free_port(), free_port()
        stub = stack.enter_context(started_stub(log, "direct"))
        passthrough = stack.enter_context(
            started(
                "pass-through",
                [
                    sys.executable,
                    str(BENCH / "passthrough.py"),
                    "--upstream",
                    stub.url,
                    "--port",
                    str(pass_port),
                    *(["--uvloop"] if args.uvloop else []),
                ],
                pass_port,
                log,
            )
        )
        on_loop = [str(BENCH / "on_uvloop.py")] if args.uvloop else []
        proxy_argv = [
            sys.executable,
            *on_loop,
            "-m",
            "proxy",
            "serve",
            "--upstream",
            stub.url,
            "--port",
            str(proxy_port),
            "--config",
            str(config),
            "--log-level",
            "WARNING",
        ]
        proxy = stack.enter_context(started("replay-proxy", proxy_argv, proxy_port, log))
        servers = {"direct": stub, "pass-through": passthrough, "replay-proxy": proxy}
        idle_rss = {name: memory_mb(s.pid, "VmRSS") for name, s in servers.items()}

        answers = asyncio.run(check_answers(servers, bench_bodies + stream_bodies))
        audit_lines_after_check = len(audit.read_bytes().splitlines())
        if audit_lines_after_check != sum(b.kind in ("block", "strip") for b in bench_bodies):
            raise SystemExit(f"the audit log has {audit_lines_after_check} lines: {audit}")
        can_reset_rss = reset_peak_rss(proxy.pid)

        scripts = {b.name: write_script(tmp, i, b) for i, b in enumerate(bench_bodies)}
        pids = [s.pid for s in servers.values()]
        counters = {
            "direct": served_by_stub(stub.url),
            "pass-through": served_by_stub(stub.url),
            "replay-proxy": served_by_proxy(proxy.url),
        }

        retry_left_s = [0.0]  # none in the warm-up

        def drive(target: str, body: Body, connections: int, duration_s: int) -> Run:
            url, pid = servers[target].url, servers[target].pid
            for attempt in range(2):
                settle(pids)
                others = Others(pids)
                run = run_wrk(
                    scripts[body.name], url, pid, counters[target], connections, duration_s
                )
                run = replace(run, others_cores=others.cores())
                disturbed = run.others_cores > plan.disturbed_cores
                if attempt or not disturbed or retry_left_s[0] < duration_s + 1:
                    break
                # A neighbour took CPU meanwhile: run the cell again once it is quiet, as long as
                # the time set aside for re-runs lasts.
                waited = time.monotonic()
                quiet = wait_for_quiet(min(10.0, retry_left_s[0] - duration_s))
                retry_left_s[0] -= time.monotonic() - waited + duration_s
                if not quiet:
                    break
                print(f"  re-run: others took {run.others_cores:.2f} cores", file=sys.stderr)  # noqa: T201
            return run

        if plan.warmup:
            # Fill the connection pools and grow each process's heap to its working size.
            large = next(b for b in bench_bodies if b.pairs >= 400)
            for target in TARGETS:
                drive(target, large, plan.connections, 2)

        retry_left_s[0] = plan.retry_s
        loaded: dict[tuple[str, str], list[Run]] = {}
        unloaded: dict[tuple[str, str], list[Run]] = {}
        total = (
            plan.rounds
            * len(TARGETS)
            * (len(bench_bodies) + plan.unloaded_cells * len(unloaded_bodies))
        )
        done = 0
        for round_no in range(plan.rounds):
            for body in bench_bodies:
                for target in rotated(TARGETS, round_no):
                    run = drive(target, body, plan.connections, plan.duration(body))
                    loaded.setdefault((body.name, target), []).append(run)
                    done += 1
                    print(  # noqa: T201
                        f"[{done}/{total}] round {round_no + 1} {body.name:<17} {target:<13} "
                        f"{run.rps:>9,.0f} req/s  p50 {run.p50_ms:7.2f} ms  "
                        f"cpu {run.cpu_us:9,.0f} µs/req",
                        file=sys.stderr,
                    )
            for cell in range(plan.unloaded_cells):
                for body in unloaded_bodies:
                    for target in rotated(TARGETS, round_no + cell):
                        run = drive(target, body, 1, plan.unloaded_s)
                        unloaded.setdefault((body.name, target), []).append(run)
                        done += 1
                        print(  # noqa: T201
                            f"[{done}/{total}] round {round_no + 1} {body.name:<17} "
                            f"{target:<13} 1 connection: p50 {run.p50_ms:7.3f} ms",
                            file=sys.stderr,
                        )

        settle(pids)
        print("streaming: time to first event and gaps between events", file=sys.stderr)  # noqa: T201
        stream_others = Others(pids)
        streams = asyncio.run(
            measure_streams(servers, stream_bodies, plan.stream_samples, plan.stream_gap_ms)
        )
        stream_others_cores = stream_others.cores()
        held: dict[str, tuple[float, float]] = {}
        sse_body = stream_bodies[0]
        for target in ("pass-through", "replay-proxy"):
            server = servers[target]
            settle(pids)
            before = memory_mb(server.pid, "VmRSS")
            print(f"holding {plan.open_streams} SSE streams open: {target}", file=sys.stderr)  # noqa: T201
            during = asyncio.run(
                hold_streams(
                    server.url,
                    sse_body.data,
                    plan.open_streams,
                    functools.partial(memory_mb, server.pid, "VmRSS"),
                )
            )
            held[target] = (before, during)
        end_rss = {name: memory_mb(s.pid, "VmRSS") for name, s in servers.items()}
        litellm: dict[str, list[Run]] = {}
        if litellm_target.available() and not args.no_litellm:
            litellm = drive_litellm(stack, plan, tmp, log, stub, scripts, bench_bodies)
        results = {
            "command": command,
            "machine": describe(),
            "plan": asdict(plan),
            "loaded": {f"{b} | {t}": [asdict(r) for r in runs] for (b, t), runs in loaded.items()},
            "unloaded": {
                f"{b} | {t}": [asdict(r) for r in runs] for (b, t), runs in unloaded.items()
            },
            "streams": {f"{b} | {t}": asdict(s) for (b, t), s in streams.items()},
            "streams_others_cores": stream_others_cores,
            "idle_rss_mb": idle_rss,
            "held_streams_rss_mb": held,
            "litellm": {b: [asdict(r) for r in runs] for b, runs in litellm.items()},
            "end_rss_mb": end_rss,
        }

    elapsed = time.monotonic() - started_at
    text = render(
        command=command,
        plan=plan,
        bench_bodies=bench_bodies,
        answers=answers,
        loaded=loaded,
        unloaded=unloaded,
        unloaded_bodies=unloaded_bodies,
        streams=streams,
        stream_others_cores=stream_others_cores,
        idle_rss=idle_rss,
        end_rss=end_rss,
        held=held,
        litellm=litellm,
        can_reset_rss=can_reset_rss,
        elapsed=elapsed,
    )
    print(text)  # noqa: T201
    out_dir = BENCH / "results"
    out_dir.mkdir(exist_ok=True)
    raw = out_dir / time.strftime("load-%Y%m%d-%H%M%S.json")
    raw.write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(f"\nraw results: {raw}", file=sys.stderr)  # noqa: T201
    if not args.no_write:
        print(f"written to {write_section('load', text)}", file=sys.stderr)  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
