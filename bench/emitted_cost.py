"""What door 2 costs on the SSE benchmark: replay-proxy with it against the commit before it.

Run from the repository root: `python bench/emitted_cost.py [--base REV] [--rounds N]` (needs
`wrk` and git; about a minute). The tree at REV (default: the merge base with `main`) is
exported to a temporary directory and served with `python -P` so that it imports its own
`proxy`; the working tree is served beside it, with the same config, in front of one stub
upstream. Each round drives every stream on both, the order rotated: the small SSE answer
without a call, with a `lookup_order` call that passes its schema, and with one that fails it
(door 2 writes an audit record). CPU per request and latency are medians over the rounds.
Everything listens on 127.0.0.1 and is stopped (by PID) at the end.

First, in this process, door 2's own steps are timed one by one (medians of `SAMPLES`, each
call's arguments never seen before): judging a call that passes and one that fails, and writing
the audit record of a failing response. Those figures hold still when the machine is busy; the
wrk figures, which include everything around them, do not.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import yaml
from host import ROOT, Others
from servers import Server, free_port, served_by_proxy, settle, started, started_stub
from trees import export
from workload import GATE_CONFIG, TOOLS, bodies
from wrk import Run, run_wrk, write_script

from proxy.admission.emitted import EmittedCalls, EmittedChecks
from proxy.config import Config
from proxy.gate.caches import GateCaches
from proxy.gate.emitted import ToolSchemas, emitted_calls, iter_emitted
from proxy.gate.items import tool_schemas
from proxy.gate.verdict import inspect
from proxy.running.config_file import parse_config
from proxy.state.audit import AuditLog, Relayed
from proxy.state.metrics import Metrics
from proxy.state.recording import Context

CONNECTIONS = 32
DURATION_S = 2
SAMPLES = 2000
STREAMS = {"no call": None, "a call that passes": "ok", "a call that fails": "bad"}


def _order(n: int, field: str) -> dict[str, object]:
    arguments = f'{{"order_id":"ORD-{n:06d}","fields":["status","{field}"]}}'
    return {
        "type": "function_call",
        "call_id": f"c{n}",
        "name": "lookup_order",
        "arguments": arguments,
    }


def in_process(tmp: Path) -> dict[str, float]:
    """Door 2's steps on this process, µs each (medians)."""
    config: Config = parse_config({**GATE_CONFIG, "upstream": {"url": "http://127.0.0.1:9"}})
    policy = config.gate
    caches = GateCaches.for_policy(policy)
    tools = tuple(tool_schemas(TOOLS))
    schemas = ToolSchemas(tools, policy, caches)
    out: dict[str, float] = {}
    for name, field in (
        ("judge a call that passes", "lines"),
        ("judge a call that fails", "price"),
    ):
        samples = []
        for n in range(SAMPLES):
            calls = emitted_calls(
                [{"type": "message"}, _order(n + (0 if field == "lines" else SAMPLES), field)]
            )
            started = time.perf_counter_ns()
            list(iter_emitted(calls, schemas))
            samples.append(time.perf_counter_ns() - started)
        out[name] = statistics.median(samples) / 1000
    log = AuditLog(str(tmp / "in-process.jsonl"))
    checks = EmittedChecks(log, Metrics())
    context = Context.of((), tools, compacts=False)
    relayed = Relayed("req_1", "http", "/v1/responses", "t_1", b"{}" * 400)

    async def start_and_wait(n: int, field: str) -> int:
        calls = EmittedCalls(relayed)
        calls.add({"id": f"resp_{n}", "output": [_order(n, field)]}, context)
        started = time.perf_counter_ns()
        checks.start(calls, policy, caches)
        await checks.wait()
        return time.perf_counter_ns() - started

    async def run(field: str, offset: int) -> float:
        samples = [await start_and_wait(offset + n, field) for n in range(SAMPLES)]
        return statistics.median(samples) / 1000

    out["whole check, a response whose call passes (schemas looked up, judge, count)"] = (
        asyncio.run(run("lines", 4 * SAMPLES))
    )
    out["whole check, a response whose call fails (the same, and its audit record)"] = asyncio.run(
        run("price", 6 * SAMPLES)
    )
    log.close()
    # The next turn replays the call: the gate's verdict on it, without door 2 (the arguments
    # never judged) and after it (door 2 left its verdict in the shared cache).
    for name, judged_first in (
        ("the next turn's gate on the call, without door 2", False),
        ("the next turn's gate on the call, after door 2", True),
    ):
        samples = []
        for n in range(SAMPLES):
            call = _order(8 * SAMPLES + (2 * n if judged_first else 2 * n + 1), "lines")
            if judged_first:
                list(iter_emitted(emitted_calls([call]), schemas))
            output = {"type": "function_call_output", "call_id": call["call_id"], "output": "x"}
            body = {"tools": TOOLS, "input": [{**call, "status": "completed"}, output]}
            started = time.perf_counter_ns()
            inspect(body, policy, caches=caches)
            samples.append(time.perf_counter_ns() - started)
        out[name] = statistics.median(samples) / 1000
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", default=None, help="the revision without door 2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--in-process", action="store_true", help="only the in-process steps")
    args = parser.parse_args()
    if args.in_process:
        with tempfile.TemporaryDirectory(prefix="replay-emitted-") as scratch:
            for step, us in in_process(Path(scratch)).items():
                print(f"| {step} | {us:,.1f} |")  # noqa: T201
        return 0
    base = (
        args.base
        or subprocess.run(
            ["git", "merge-base", "HEAD", "main"], cwd=ROOT, capture_output=True, check=True
        )
        .stdout.decode()
        .strip()
    )
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="replay-emitted-")))
        log = stack.enter_context((tmp / "servers.log").open("wb"))
        steps = in_process(tmp)
        (tmp / "base").mkdir()
        short = export(base, tmp / "base")
        stub = stack.enter_context(started_stub(log))
        servers: dict[str, Server] = {}
        for name, path in ((f"before ({short})", tmp / "base"), ("door 2", None)):
            config = tmp / f"proxy-{len(servers)}.yaml"
            audit = {"path": str(tmp / f"audit-{len(servers)}.jsonl")}
            config.write_text(yaml.safe_dump({**GATE_CONFIG, "audit": audit}), encoding="utf-8")
            port = free_port()
            argv = [sys.executable, *(["-P"] if path else []), "-m", "proxy", "serve"]
            argv += ["--upstream", stub.url, "--port", str(port), "--config", str(config)]
            argv += ["--log-level", "WARNING"]
            env = {"PYTHONPATH": str(path)} if path else None
            servers[name] = stack.enter_context(started(name, argv, port, log, env=env))
        [sse] = [b for b in bodies() if b.name == "small, SSE"]
        scripts = {
            stream: write_script(tmp, i, sse, {"x-bench-call": call} if call else None)
            for i, (stream, call) in enumerate(STREAMS.items())
        }
        pids = [s.pid for s in servers.values()]
        runs: dict[tuple[str, str], list[Run]] = {}
        names = list(servers)
        others = Others([stub.pid, *pids])
        for round_no in range(args.rounds):
            order = names[round_no % 2 :] + names[: round_no % 2]
            for stream, script in scripts.items():
                for name in order:
                    server = servers[name]
                    settle(pids)
                    run = run_wrk(
                        script,
                        server.url,
                        server.pid,
                        served_by_proxy(server.url),
                        CONNECTIONS,
                        DURATION_S,
                    )
                    if run.errors or run.non_2xx:
                        raise SystemExit(f"{name}, {stream}: {run.errors} errors, {run.non_2xx}")
                    runs.setdefault((stream, name), []).append(run)
        cores = others.cores()
        records = [
            sum(1 for _ in (tmp / f"audit-{i}.jsonl").open())
            if (tmp / f"audit-{i}.jsonl").exists()
            else 0
            for i in range(len(names))
        ]
    print("| door 2's step, in process | µs |")  # noqa: T201
    print("| :--- | ---: |")  # noqa: T201
    for step, us in steps.items():
        print(f"| {step} | {us:,.1f} |")  # noqa: T201
    print()  # noqa: T201
    before, after = names
    print(  # noqa: T201
        f"wrk -c{CONNECTIONS} -d{DURATION_S}s, {args.rounds} rounds, medians; "
        f"others took {cores:.2f} cores on average; audit records written: "
        f"{before} {records[0]}, {after} {records[1]}"
    )
    print(  # noqa: T201
        f"| SSE answer | CPU µs/request, {before} | CPU µs/request, {after} | added | "
        f"p50 ms, {before} | p50 ms, {after} | requests/s, {before} | requests/s, {after} |"
    )
    print("| :--- |" + " ---: |" * 7)  # noqa: T201
    for stream in STREAMS:
        b, a = runs[stream, before], runs[stream, after]
        cpu_b = statistics.median(r.cpu_us for r in b)
        cpu_a = statistics.median(r.cpu_us for r in a)
        p50_b = statistics.median(r.p50_ms for r in b)
        p50_a = statistics.median(r.p50_ms for r in a)
        rps_b = statistics.median(r.window_rps for r in b)
        rps_a = statistics.median(r.window_rps for r in a)
        print(  # noqa: T201
            f"| {stream} | {cpu_b:,.0f} | {cpu_a:,.0f} | {cpu_a - cpu_b:+,.0f} "
            f"({cpu_a / cpu_b:.2f}x) | {p50_b:.2f} | {p50_a:.2f} | {rps_b:,.0f} | {rps_a:,.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
