"""The load benchmark's Markdown: the main table, issue 5's targets, latency, streaming."""

from __future__ import annotations

import litellm_target
from client import StreamStats
from host import describe
from plan import Plan
from report import median, table
from stub_upstream import SSE_EVENTS
from workload import PATH, Body
from wrk import Run

TARGETS = ("direct", "pass-through", "replay-proxy")


def fmt(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}x" if reference else "—"


def render(
    *,
    command: str,
    plan: Plan,
    bench_bodies: list[Body],
    answers: dict[str, str],
    loaded: dict[tuple[str, str], list[Run]],
    unloaded: dict[tuple[str, str], list[Run]],
    unloaded_bodies: list[Body],
    streams: dict[tuple[str, str], StreamStats],
    stream_others_cores: float,
    idle_rss: dict[str, float],
    end_rss: dict[str, float],
    held: dict[str, tuple[float, float]],
    litellm: dict[str, list[Run]],
    can_reset_rss: bool,
    elapsed: float,
) -> str:
    def quiet(runs: list[Run]) -> list[Run]:
        """The rounds no neighbour disturbed, if there are any; else every round."""
        return [r for r in runs if r.others_cores <= plan.disturbed_cores] or runs

    def med(body: str, target: str, metric: str) -> float:
        return median([getattr(r, metric) for r in quiet(loaded[body, target])])

    def unloaded_p50(body: str, target: str) -> float:
        return median([r.p50_ms for r in quiet(unloaded[body, target])])

    rows: list[list[str]] = []
    for body in bench_bodies:
        for target in TARGETS:
            runs = loaded[body.name, target]
            rps, cpu = med(body.name, target, "rps"), med(body.name, target, "cpu_us")
            pass_rps = med(body.name, "pass-through", "rps")
            pass_cpu = med(body.name, "pass-through", "cpu_us")
            direct_rps = med(body.name, "direct", "rps")
            direct_cpu = med(body.name, "direct", "cpu_us")
            errors = sum(r.errors for r in runs)
            disturbed = all(r.others_cores > plan.disturbed_cores for r in runs)
            rows.append(
                [
                    f"{body.name} ({body.kib:,.0f} KiB)" if target == "direct" else "",
                    target + (" †" if disturbed else ""),
                    answers[body.name] if target == "replay-proxy" else "200",
                    fmt(rps),
                    fmt(med(body.name, target, "p50_ms"), 2),
                    fmt(med(body.name, target, "p99_ms"), 2),
                    fmt(cpu),
                    fmt(max(r.peak_rss_mb for r in runs), 1),
                    "" if target == "pass-through" else ratio(cpu, pass_cpu),
                    "" if target == "direct" else ratio(cpu, direct_cpu),
                    "" if target == "pass-through" else ratio(rps, pass_rps),
                    "" if target == "direct" else ratio(rps, direct_rps),
                    str(errors),
                ]
            )

    unloaded_rows = []
    for body in unloaded_bodies:
        p50 = {t: unloaded_p50(body.name, t) for t in TARGETS}
        unloaded_rows.append(
            [
                body.name,
                *(fmt(p50[t], 3) for t in TARGETS),
                fmt(p50["replay-proxy"] - p50["direct"], 3),
                fmt(p50["replay-proxy"] - p50["pass-through"], 3),
            ]
        )

    summary_rows = []
    for body in unloaded_bodies:
        rps_of = {t: med(body.name, t, "rps") for t in TARGETS}
        p50_of = {t: unloaded_p50(body.name, t) for t in TARGETS}
        summary_rows.append(
            [
                body.name,
                fmt(rps_of["direct"]),
                fmt(rps_of["replay-proxy"]),
                ratio(rps_of["replay-proxy"], rps_of["direct"]),
                fmt(p50_of["replay-proxy"] - p50_of["direct"], 3),
            ]
        )

    stream_rows = []
    for (body_name, target), stats in streams.items():
        direct = streams[body_name, "direct"]
        ttfb, gap = median(stats.ttfb_ms), sum(stats.gaps_ms) / max(1, len(stats.gaps_ms))
        direct_gap = sum(direct.gaps_ms) / max(1, len(direct.gaps_ms))
        stream_rows.append(
            [
                body_name if target == "direct" else "",
                target,
                str(len(stats.ttfb_ms)),
                fmt(ttfb, 3),
                fmt(sorted(stats.ttfb_ms)[int(len(stats.ttfb_ms) * 0.9)], 3),
                fmt(gap, 3),
                fmt(max(stats.gaps_ms), 3),
                "" if target == "direct" else f"{ttfb - median(direct.ttfb_ms):+.3f}",
                "" if target == "direct" else f"{gap - direct_gap:+.3f}",
            ]
        )

    def cpu_ratio(body: str, reference: str = "pass-through") -> str:
        return ratio(med(body, "replay-proxy", "cpu_us"), med(body, reference, "cpu_us"))

    sse_ttfb = {
        t: median(streams["small, SSE", t].ttfb_ms) for t in TARGETS if ("small, SSE", t) in streams
    }
    peak = max(
        max(r.peak_rss_mb for r in runs) for (_, t), runs in loaded.items() if t == "replay-proxy"
    )
    targets_rows = [
        ["small clean: CPU/request vs pass-through", "≤ 1.00x", cpu_ratio("small")],
        ["10 pairs, cache warm: CPU/request vs pass-through", "≤ 1.15x", cpu_ratio("10 pairs")],
        ["400 pairs, cache warm: CPU/request vs pass-through", "≤ 1.6x", cpu_ratio("400 pairs")],
        ["SSE (small): CPU/request vs pass-through", "≤ 1.1x", cpu_ratio("small, SSE")],
        [
            "SSE time to first event, median, vs direct",
            "≤ +1 ms",
            f"{sse_ttfb['replay-proxy'] - sse_ttfb['direct']:+.3f} ms",
        ],
        ["peak RSS of the proxy under load", "< 120 MB", f"{peak:.1f} MB"],
        [
            f"{plan.open_streams:,} open SSE streams add (RSS)",
            "< 60 MB",
            f"{held['replay-proxy'][1] - held['replay-proxy'][0]:+.1f} MB",
        ],
    ]
    if litellm:
        litellm_rps = median([r.rps for r in litellm["small"]])
        targets_rows.append(
            [
                "requests/s vs LiteLLM proxy (small)",
                "≥ 50x",
                ratio(med("small", "replay-proxy", "rps"), litellm_rps),
            ]
        )
    else:
        targets_rows.append(
            ["requests/s vs LiteLLM proxy (small)", "≥ 50x", "not measured (not installed)"]
        )
    litellm_rows = [
        [
            name,
            f"{median([r.rps for r in runs]):,.1f}",
            f"{median([r.cpu_us for r in runs]):,.0f}",
            f"{med(name, 'replay-proxy', 'rps'):,.0f}",
            f"{med(name, 'replay-proxy', 'cpu_us'):,.0f}",
            ratio(med(name, "replay-proxy", "rps"), median([r.rps for r in runs])),
            str(sum(r.non_2xx + r.errors for r in runs)),
        ]
        for name, runs in litellm.items()
    ]
    held_note = (
        f"*{plan.open_streams:,} open SSE streams*: that many streamed requests opened at once "
        "(the upstream's events 10 s apart), RSS read once each has had its first event, minus "
        "RSS just before: replay-proxy "
        + ", pass-through ".join(
            f"{during - before:+.1f} MB ({before:.1f} -> {during:.1f})"
            for before, during in (held["replay-proxy"], held["pass-through"])
        )
        + "."
    )

    rss_note = (
        "per run (VmHWM reset through `/proc/PID/clear_refs` before each run)"
        if can_reset_rss
        else "since start (VmHWM could not be reset here)"
    )
    warmup = ", after a 2 s warm-up per target (400 pairs)" if plan.warmup else ""
    setup = (
        "A stub Open Responses upstream (aiohttp, `bench/stub_upstream.py`) is reached "
        "directly, through a bare aiohttp pass-through (`bench/passthrough.py`: one shared "
        "session, chunk streaming, no parsing) and through replay-proxy "
        "(`python -m proxy serve`, audit log to a file; `get_latest_sales_report` pinned, a "
        "schema failure blocks, an `arguments_parse` failure strips). Each is its own "
        "process; all share the machine with wrk and the upstream, and the one being measured "
        "has a CPU of its own during its run (`servers.pin_apart`; wrk, the upstream and the "
        "rest on the other). "
        f"`wrk -t1 -c{plan.connections} -d{plan.duration_s}s --latency` "
        f"(`-d{plan.large_duration_s}s` for the 1 MB bodies), POST "
        f"`{PATH}`, targets interleaved (order rotated each round), "
        f"{plan.rounds} round(s); medians of rounds{warmup}."
    )
    all_runs = [r for runs in (*loaded.values(), *unloaded.values()) for r in runs]
    others_mean = sum(r.others_cores for r in all_runs) / len(all_runs)
    others_max = max(r.others_cores for r in all_runs)
    others_note = (
        f"Others (other processes on the machine, the host's other guests: its steal time) "
        f"took {others_mean:.2f} cores on average during the wrk runs (at most "
        f"{others_max:.2f} in one run). A run during which they took more "
        f"than {plan.disturbed_cores:g} cores is *disturbed*: it was run again once they were "
        f"quiet (for up to {plan.retry_s:g} s of re-runs in all), and a cell's medians are of "
        "its undisturbed rounds; † marks a cell whose every round was disturbed."
    )
    columns = (
        "*CPU µs/req* is utime+stime of the serving process (`/proc/PID/stat`) over a window "
        "inside each run, divided by the requests that process served in the same window "
        "(replay-proxy's `/-/metrics` request counter; the stub upstream's counter for the "
        "others), so that wrk's start and the requests it cuts off at its end are left out; "
        f"for *direct* it is the upstream's own cost. *peak RSS* is VmHWM {rss_note}, max over "
        "rounds. Ratios: x pass-through and x direct, of CPU/request and of requests/s."
    )
    return "\n".join(
        [
            "## Load (`bench/load.py`)",
            "",
            f"`{command}` — {describe()}; took {elapsed:.0f} s.",
            "",
            setup,
            "",
            others_note,
            "",
            columns,
            "",
            table(
                [
                    "body",
                    "target",
                    "answer",
                    "req/s",
                    "p50 ms",
                    "p99 ms",
                    "CPU µs/req",
                    "peak RSS MB",
                    "CPU x pass",
                    "CPU x direct",
                    "req/s x pass",
                    "req/s x direct",
                    "socket errors",
                ],
                rows,
            ),
            "Idle RSS (MB) at start: "
            + ", ".join(f"{t} {idle_rss[t]:.1f}" for t in TARGETS)
            + "; at the end: "
            + ", ".join(f"{t} {end_rss[t]:.1f}" for t in TARGETS)
            + ".",
            "",
            "### Issue 5 targets (this run)",
            "",
            table(["target", "goal", "measured"], targets_rows),
            held_note,
            "",
            *(
                [
                    "### LiteLLM proxy (same run)",
                    "",
                    (
                        f"LiteLLM {litellm_target.VERSION} (`{litellm_target.install_command()}`), "
                        "one process, in front of the same stub, configured as in "
                        "`bench/litellm_target.py` (native `/v1/responses` pass-through, no "
                        "callbacks, retries or logs). Driven after the other targets with the "
                        f"same wrk settings (`-d3s`), {plan.rounds} round(s); replay-proxy's "
                        "figures are its medians from the table above."
                    ),
                    "",
                    table(
                        [
                            "body",
                            "LiteLLM req/s",
                            "LiteLLM CPU µs/req",
                            "replay-proxy req/s",
                            "replay-proxy CPU µs/req",
                            "req/s x LiteLLM",
                            "LiteLLM non-2xx/errors",
                        ],
                        litellm_rows,
                    ),
                ]
                if litellm
                else [
                    (
                        "LiteLLM was not measured: it is not installed. Its own virtualenv: "
                        f"`{litellm_target.install_command()}`."
                    ),
                    "",
                ]
            ),
            (
                "The 400-pair *cold* target (≤ 2.5x) is not measured under load (every wrk "
                "request repeats one body, so the verdict cache is warm after the first); see "
                "the cold figures of `bench/gate_cost.py`."
            ),
            "",
            "### Throughput and added latency vs a direct connection (same run)",
            "",
            (
                f"Throughput: wrk at {plan.connections} connections (median of rounds). Added "
                f"latency: median (p50) latency over 1 connection (`wrk -c1`, "
                f"the median of {plan.rounds * plan.unloaded_cells} cells of "
                f"{plan.unloaded_s} s, interleaved), proxy minus direct."
            ),
            "",
            table(
                ["body", "direct req/s", "proxy req/s", "proxy/direct", "added p50 ms"],
                summary_rows,
            ),
            "Latency over 1 connection, p50 in ms:",
            "",
            table(
                [
                    "body",
                    *(f"{t} p50" for t in TARGETS),
                    "proxy - direct",
                    "proxy - pass-through",
                ],
                unloaded_rows,
            ),
            "### Streaming through the proxy vs direct",
            "",
            (
                f"An aiohttp client, one request at a time, targets interleaved; the upstream "
                f"sends {len(SSE_EVENTS)} SSE events {plan.stream_gap_ms:g} ms apart. *first "
                f"event* is from sending the request to the first `data:` line; gaps are between "
                f"consecutive `data:` lines. Others took {stream_others_cores:.2f} cores "
                f"meanwhile."
            ),
            "",
            table(
                [
                    "body",
                    "target",
                    "samples",
                    "first event p50 ms",
                    "first event p90 ms",
                    "mean gap ms",
                    "max gap ms",
                    "Δ first event vs direct",
                    "Δ mean gap vs direct",
                ],
                stream_rows,
            ),
        ]
    )
