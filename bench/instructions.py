"""Instructions per request: replay-proxy, the pass-through and the floor, under callgrind.

Run from the repository root: `python bench/instructions.py [--base REV] [--tree DIR]...
[--bodies "a;b"] [--seconds S] [--shortcut-off] [--keep DIR]` (needs `wrk` and valgrind:
`apt-get install valgrind`; about half a minute per body and server). Beside the bodies of
`workload.py`, "10 pairs, each new" and "1 pair, each new" send their pairs under a question
numbered anew for each request, so that no body extends a held one: each is read in full, as
a session's first turn is ("10 pairs" repeats one body, which the prefix shortcut takes).
`--shortcut-off` counts each tree again with `limits.max_prefix_bytes: 0`.

CPU time on a shared machine drifts by more than the changes worth making (see
docs/performance.md); the count of user-space instructions a server executes per request does
not: two runs of the same code agree within about 2 %.
It leaves out the kernel's share (the socket calls, much the same on both sides), so read
it beside `load.py`'s CPU figures, not instead of them.

The bodies are workload.py's, the Chat Completions ones (`chat_bodies()`: `small, Chat`,
`10 pairs, Chat`, the same histories as messages) posted to `/v1/chat/completions`.
Each server runs under `valgrind --tool=callgrind` with counting off until it listens. For
each body: a warm-up under `wrk -c8`, the counters zeroed, `wrk -c8 -d{S}s`, and the count
read back (`callgrind_control`), divided by the requests the stub upstream answered
meanwhile. The working tree is measured, beside the pass-through, the tree at `--base` if
given, and each `--tree` (a directory holding a `proxy` package), beside two references: the
pass-through (`passthrough.py`, no parsing) and the floor (`floor.py`: the whole body read and
parsed strictly, outputs paired with calls, verdicts cached). Each proxy's row says how far it
is above the floor. The servers take turns,
one at a time, in front of one stub upstream; all listen on 127.0.0.1 and are stopped (by
PID) at the end.

`--in-process` counts single steps instead, each in a process of its own under callgrind,
per call over `--repeat` calls after a warm-up: the readers a gated body can be parsed with
(`jiter` as the proxy calls it, duplicate keys refused; `orjson`, which reads no duplicate
key), the proxy's strict read (`body.loads`) and the whole admission (`admit`, the ledger in
memory, schemas compiled, verdicts cached).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from callgrind import (
    FLOOR,
    PASS,
    Counted,
    control,
    counted_server,
    dumped,
    instructions,
    served_commands,
)
from host import ROOT
from servers import Server, served_by_stub, started_stub
from trees import source_trees
from workload import (
    GATE_CONFIG,
    QUESTION_NUMBER,
    Body,
    bodies,
    chat_bodies,
    iter_pairs,
    numbered_question,
)
from wrk import write_numbered_script, write_script

BENCH = Path(__file__).resolve().parent
CONNECTIONS = 8
WARM_S = 4
# "10 pairs" is one body repeated: after the first, a proxy that holds a session's verified
# prefix finds each the same as the last and reads nothing of it. "N pairs, each new" sends
# N pairs under a question numbered anew for each request: each is read in full (and held,
# as a session's first turn is).
NEW = {"10 pairs, each new": 10, "1 pair, each new": 1}
BODIES = ("small", "10 pairs", "10 pairs, each new", "small, SSE", "10 pairs, Chat")
STEPS = ("jiter", "orjson", "body.loads", "admit")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", default=None, help="a revision to measure too")
    parser.add_argument(
        "--tree", action="append", default=[], help="a directory holding a proxy package"
    )
    parser.add_argument("--seconds", type=int, default=15, help="of counted load per body")
    parser.add_argument(
        "--bodies", default=";".join(BODIES), help="bodies of workload.py, `;` between"
    )
    parser.add_argument(
        "--keep", type=Path, default=None, help="a directory to copy each callgrind dump into"
    )
    parser.add_argument(
        "--shortcut-off",
        action="store_true",
        help="count each tree again with limits.max_prefix_bytes: 0 (every body read in full)",
    )
    parser.add_argument("--in-process", action="store_true", help="count single steps")
    parser.add_argument("--repeat", type=int, default=200, help="calls per step counted")
    parser.add_argument("--step", choices=STEPS, help=argparse.SUPPRESS)  # in the counted child
    args = parser.parse_args()
    asked = args.bodies.split(";")
    new = [Body(name, numbered_question(iter_pairs(n)), n, "clean") for name, n in NEW.items()]
    chosen = [b for b in [*bodies(), *chat_bodies(), *new] if b.name in asked]
    if args.step is not None:
        return _step(args.step, chosen[0], args.repeat)
    if args.in_process:
        return _in_process(chosen, args.repeat)
    counted: dict[str, dict[str, float]] = {}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="replay-ir-")))
        log = stack.enter_context((tmp / "servers.log").open("wb"))
        trees = source_trees(tmp, args.base, None, args.tree)
        stub = stack.enter_context(started_stub(log))
        served = served_by_stub(stub.url)
        scripts = {b.name: _script(tmp, i, b) for i, b in enumerate(chosen)}
        commands = served_commands(tmp, stub.url, trees, shortcut_off=args.shortcut_off)
        for name, (argv, env) in commands.items():
            with counted_server(name, argv, tmp, log, env) as server:
                counted[name] = {}
                for body in chosen:
                    script = scripts[body.name]
                    counted[name][body.name] = _per_request(
                        server, served, script, body, args.seconds
                    )
                    if args.keep is not None:
                        args.keep.mkdir(parents=True, exist_ok=True)
                        kept = f"{name}-{body.name}.out".replace(" ", "-").replace(",", "")
                        shutil.copyfile(server.last, args.keep / kept)
    print(  # noqa: T201
        f"callgrind, wrk -c{CONNECTIONS} -d{args.seconds}s per body: thousands of user-space "
        "instructions per request"
    )
    names = list(counted)
    proxies = names[2:]
    ratios = " | ".join(f"{n} / pass | {n} - floor" for n in proxies)
    print(f"| body | {' | '.join(names)} | floor / pass | {ratios} |")  # noqa: T201
    print("| :--- |" + " ---: |" * (len(names) + 1 + 2 * len(proxies)))  # noqa: T201
    for body in chosen:
        of = {n: counted[n][body.name] for n in names}
        row = [f"{of[n] / 1000:,.0f}" for n in names] + [f"{of[FLOOR] / of[PASS]:.2f}x"]
        for n in proxies:
            row += [f"{of[n] / of[PASS]:.2f}x", f"{(of[n] - of[FLOOR]) / 1000:+,.0f}"]
        print(f"| {body.name} | " + " | ".join(row) + " |")  # noqa: T201
    return 0


def _script(directory: Path, index: int, body: Body) -> Path:
    if body.name not in NEW:
        return write_script(directory, index, body)
    return write_numbered_script(directory, index, body, QUESTION_NUMBER)


def _per_request(
    server: Counted, served: Callable[[], int], script: Path, body: Body, seconds: int
) -> float:
    """Instructions per request served, over `seconds` of load after a warm-up."""
    _wrk(server.server, script, body.path, WARM_S)
    time.sleep(0.5)  # the warm-up's last answers out
    server.zero()
    before = served()
    _wrk(server.server, script, body.path, seconds)
    time.sleep(0.5)
    requests = served() - before
    if requests <= 0:
        raise SystemExit(f"{server.server.name}, {body.name}: no request served")
    return server.dump() / requests


def _wrk(server: Server, script: Path, path: str, seconds: int) -> None:
    argv = ["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "--timeout", "60s"]
    ran = subprocess.run(
        [*argv, "-s", str(script), server.url + path], capture_output=True, text=True, check=True
    )
    if "Non-2xx" in ran.stdout or "Socket errors" in ran.stdout:
        raise SystemExit(f"{server.name}: wrk saw failures:\n{ran.stdout}")


def _in_process(chosen: list[Body], repeat: int) -> int:
    counted: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory(prefix="replay-ir-") as tmp:
        for body in chosen:
            for step in STEPS:
                out = Path(tmp) / f"step-{len(counted)}.out"
                argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
                argv += [f"--callgrind-out-file={out}", sys.executable, str(Path(__file__))]
                argv += ["--step", step, "--bodies", body.name, "--repeat", str(repeat)]
                subprocess.run(argv, cwd=ROOT, capture_output=True, check=True)
                dump = dumped(out.with_name(f"{out.name}.1"))
                counted[body.name, step] = instructions(dump) / repeat
    print(  # noqa: T201
        f"callgrind, {repeat} calls per step: thousands of user-space instructions per call"
    )
    print(f"| body | {' | '.join(STEPS)} |")  # noqa: T201
    print("| :--- |" + " ---: |" * len(STEPS))  # noqa: T201
    for body in chosen:
        row = " | ".join(f"{counted[body.name, step] / 1000:,.0f}" for step in STEPS)
        print(f"| {body.name} | {row} |")  # noqa: T201
    return 0


def _step(step: str, body: Body, repeat: int) -> int:
    """In the child callgrind runs: `repeat` calls of `step` on `body`, counted alone."""
    import asyncio

    import jiter
    import orjson

    from proxy.admission import pipeline
    from proxy.admission.body import loads
    from proxy.admission.dialect import dialect_of
    from proxy.admission.routing import RouteCaches
    from proxy.running.config_file import parse_config
    from proxy.state.audit import AuditLog
    from proxy.state.ledger import Ledger
    from proxy.state.metrics import Metrics
    from proxy.state.stores import MemoryStore

    raw = body.data
    with tempfile.TemporaryDirectory(prefix="replay-ir-step-") as tmp:
        config = parse_config({**GATE_CONFIG, "upstream": {"url": "http://127.0.0.1:9"}})
        ledger = Ledger(
            MemoryStore(max_responses=10_000, ttl_s=3600), max_chain=64, fail_open=False
        )
        audit_log = AuditLog(str(Path(tmp) / "audit.jsonl"))
        metrics = Metrics()
        caches = RouteCaches(config)
        request = pipeline.Request(
            raw,
            body.path,
            "http",
            "req_bench",
            None,
            "application/json",
            dialect=dialect_of(body.path),
        )

        async def admit(times: int) -> None:
            for _ in range(times):
                await pipeline.admit(
                    request,
                    config,
                    ledger=ledger,
                    audit_log=audit_log,
                    metrics=metrics,
                    caches=caches,
                )

        def run(times: int) -> None:
            if step == "admit":
                asyncio.run(admit(times))
                return
            for _ in range(times):
                if step == "jiter":
                    jiter.from_json(
                        raw, allow_inf_nan=False, catch_duplicate_keys=True, cache_mode="keys"
                    )
                elif step == "orjson":
                    orjson.loads(raw)
                else:
                    loads(raw)

        run(50)  # schemas compiled, verdicts cached, the readers' caches warm
        control(os.getpid(), "--instr=on")
        run(repeat)
        control(os.getpid(), "--dump")
        audit_log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
