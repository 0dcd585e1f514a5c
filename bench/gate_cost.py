"""In-process cost of the replay gate per request: strict parse and inspect, cold and warm.

Run from the repository root: `python bench/gate_cost.py [--quick]`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
from host import Others, describe, wait_for_quiet
from report import median, table, write_section
from workload import GATE_CONFIG, Body, bodies, encode, iter_pairs, request_body

from proxy.admission.body import loads as strict_loads
from proxy.gate.policy import Policy
from proxy.gate.verdict import Verdict, inspect
from proxy.running.config_file import parse_config

SESSION_TURNS = 200
CHECKPOINTS = (1, 50, 100, 150, 200)


class Sampler:
    """Times one call per sample with perf_counter_ns, bounded in samples and in seconds.

    A figure measured while other processes competed for the core this one runs on (they took
    more than all the other cores) is measured again once they are quiet, as long as `retry_s`
    lasts; `disturbed` counts the figures that stay so.
    """

    DISTURBED_CORES = (os.cpu_count() or 1) - 1 + 0.1

    def __init__(
        self, *, min_samples: int, max_samples: int, budget_s: float, retry_s: float
    ) -> None:
        self.min_samples = min_samples
        self.max_samples = max_samples
        self.budget_ns = int(budget_s * 1e9)
        self.retry_left_s = retry_s
        self.figures = 0
        self.disturbed = 0

    def median_us(self, prepare: Callable[[], Callable[[], object]]) -> float:
        """Median µs of the call `prepare()` returns; `prepare` itself is not timed."""
        self.figures += 1
        others = Others()
        figure = self._median_us(prepare)
        if others.cores() <= self.DISTURBED_CORES:
            return figure
        started = time.monotonic()
        quiet = self.retry_left_s > 1 and wait_for_quiet(min(10.0, self.retry_left_s))
        if quiet:
            others = Others()
            figure = self._median_us(prepare)
            quiet = others.cores() <= self.DISTURBED_CORES
        self.retry_left_s -= time.monotonic() - started
        self.disturbed += not quiet
        return figure

    def _median_us(self, prepare: Callable[[], Callable[[], object]]) -> float:
        samples: list[int] = []
        deadline = time.perf_counter_ns() + self.budget_ns
        while len(samples) < self.max_samples and (
            len(samples) < self.min_samples or time.perf_counter_ns() < deadline
        ):
            call = prepare()
            start = time.perf_counter_ns()
            call()
            samples.append(time.perf_counter_ns() - start)
        return median(samples) / 1000


def fresh_policy() -> Policy:
    """A Policy as the proxy builds it at start: pinned schemas compiled, caches empty."""
    return parse_config(GATE_CONFIG).gate


def checked(verdict: Verdict) -> Verdict:
    if verdict.outcome != "forward" or verdict.findings:
        raise SystemExit(f"bench body is not clean: {verdict}")
    return verdict


def measure_body(body: Body, sampler: Sampler) -> list[str]:
    data = body.data
    parsed = strict_loads(data)
    warm = fresh_policy()
    checked(inspect(parsed, warm))

    def same(call: Callable[[], object]) -> Callable[[], Callable[[], object]]:
        return lambda: call

    def cold(with_parse: bool) -> Callable[[], Callable[[], object]]:
        def prepare() -> Callable[[], object]:
            policy = fresh_policy()
            if with_parse:
                return lambda: inspect(strict_loads(data), policy)
            return lambda: inspect(parsed, policy)

        return prepare

    figures = [
        sampler.median_us(same(lambda: json.loads(data))),
        sampler.median_us(same(lambda: orjson.loads(data))),
        sampler.median_us(same(lambda: strict_loads(data))),
        sampler.median_us(cold(with_parse=False)),
        sampler.median_us(same(lambda: inspect(parsed, warm))),
        sampler.median_us(cold(with_parse=True)),
        sampler.median_us(same(lambda: inspect(strict_loads(data), warm))),
    ]
    return [body.name, f"{body.kib:,.1f}", str(body.pairs), *(f"{f:,.1f}" for f in figures)]


def with_new_arguments(
    pairs: list[tuple[dict[str, Any], dict[str, Any]]], variant: int
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The history with the newest call's arguments made unseen (a distinct valid value)."""
    call, output = pairs[-1]
    arguments = json.loads(call["arguments"])
    if call["name"] == "lookup_order":
        arguments["order_id"] = f"ORD-{900000 + variant % 100000:06d}"
    else:
        arguments["limit"] = 1 + variant % 10000
    new_call = {**call, "arguments": json.dumps(arguments, separators=(",", ":"))}
    return [*pairs[:-1], (new_call, output)]


def measure_turn(
    sampler: Sampler,
    policy: Policy,
    history: list[tuple[dict[str, Any], dict[str, Any]]],
    variants: Iterator[int],
) -> list[str]:
    """One checkpoint turn: its request gated through a Policy that saw the turns before."""
    turn = len(history)
    data = encode(request_body(history))
    parsed = strict_loads(data)

    def new_turn_bytes() -> bytes:
        # The history so far is cached; the newest call's arguments have not been seen.
        return encode(request_body(with_new_arguments(history, next(variants))))

    def new_turn() -> Callable[[], object]:
        raw = new_turn_bytes()
        return lambda: checked(inspect(strict_loads(raw), policy))

    def new_turn_inspect() -> Callable[[], object]:
        body = strict_loads(new_turn_bytes())
        return lambda: checked(inspect(body, policy))

    def cold() -> Callable[[], object]:
        fresh = fresh_policy()
        return lambda: inspect(parsed, fresh)

    parse_us = sampler.median_us(lambda: lambda: strict_loads(data))
    inspect_us = sampler.median_us(new_turn_inspect)
    total_us = sampler.median_us(new_turn)
    cached_us = sampler.median_us(lambda: lambda: inspect(parsed, policy))
    cold_us = sampler.median_us(cold)
    return [
        str(turn),
        f"{len(data) / 1024:,.1f}",
        f"{parse_us:,.1f}",
        f"{inspect_us:,.1f}",
        f"{total_us:,.1f}",
        f"{inspect_us / turn:,.2f}",
        f"{cached_us:,.1f}",
        f"{cold_us:,.1f}",
    ]


def measure_session(sampler: Sampler) -> list[list[str]]:
    """Replay a session turn by turn through one Policy; at checkpoints, sample the turn."""
    pairs = iter_pairs(SESSION_TURNS, seed=200)
    policy = fresh_policy()
    variants = itertools.count(1)
    rows: list[list[str]] = []
    for turn in range(1, SESSION_TURNS + 1):
        if turn in CHECKPOINTS:
            rows.append(measure_turn(sampler, policy, pairs[:turn], variants))
        checked(inspect(strict_loads(encode(request_body(pairs[:turn]))), policy))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples (~10 s)")
    parser.add_argument("--no-write", action="store_true", help="do not update the docs")
    args = parser.parse_args()
    if args.quick:
        sampler = Sampler(min_samples=5, max_samples=300, budget_s=0.15, retry_s=10)
    else:
        sampler = Sampler(min_samples=25, max_samples=3000, budget_s=1.0, retry_s=60)

    started, others = time.monotonic(), Others()
    body_rows = [measure_body(body, sampler) for body in bodies() if body.kind == "clean"]
    session_rows = measure_session(sampler)
    elapsed, others_cores = time.monotonic() - started, others.cores()

    command = "python bench/gate_cost.py" + (" --quick" if args.quick else "")
    text = "\n".join(
        [
            "## The gate in-process (`bench/gate_cost.py`)",
            "",
            (
                f"`{command}` — {describe()}; medians of up to {sampler.max_samples} samples "
                f"(at least {sampler.min_samples}) per figure, `time.perf_counter_ns`; "
                f"took {elapsed:.0f} s; other processes on the machine took "
                f"{others_cores:.2f} cores on average meanwhile. A figure measured while they "
                f"took more than {Sampler.DISTURBED_CORES:g} cores (so competed for this one's) "
                f"was measured again once they were quiet; {sampler.disturbed} of "
                f"{sampler.figures} remain disturbed."
            ),
            "",
            (
                "Per request, µs. *strict parse* is `proxy.admission.body.loads`, the proxy's own "
                "reader "
                "(jiter refusing duplicate keys, then a walk for numbers that overflowed); "
                "*cold* is a fresh `Policy` per request (pinned `get_latest_sales_report` "
                "compiled at proxy start, outside the timer; inside: compiling the request's "
                "`lookup_order` schema and validating every call's arguments); *warm* has the "
                "verdict cache filled. `json.loads` and `orjson.loads` are references."
            ),
            "",
            table(
                [
                    "body",
                    "KiB",
                    "pairs",
                    "json.loads",
                    "orjson.loads",
                    "strict parse",
                    "inspect cold",
                    "inspect warm",
                    "parse + inspect cold",
                    "parse + inspect warm",
                ],
                body_rows,
            ),
            (
                f"A {SESSION_TURNS}-turn agent session replayed turn by turn through one "
                "`Policy` (each turn adds one call pair to the same history). At each "
                "checkpoint turn, *new turn* is that turn's request with the history's verdicts "
                "cached and the newest call's arguments never seen (as in a live session); "
                "*all cached* repeats an identical request; *cold* uses a fresh `Policy`. "
                "µs per request."
            ),
            "",
            table(
                [
                    "turn",
                    "KiB",
                    "strict parse",
                    "inspect, new turn",
                    "parse + inspect, new turn",
                    "inspect µs per pair, new turn",
                    "inspect, all cached",
                    "inspect cold",
                ],
                session_rows,
            ),
        ]
    )
    print(text)  # noqa: T201
    if not args.no_write:
        doc = write_section("gate_cost", text)
        print(f"\nwritten to {doc}", file=sys.stderr)  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
