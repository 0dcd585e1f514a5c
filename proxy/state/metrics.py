"""Prometheus metrics of the proxy: one process's registry, or, when its workers share a
multiprocess directory, the whole service as every worker's files describe it."""

from __future__ import annotations

import math
import os
import platform
import re
from bisect import bisect_left
from collections.abc import Container, Iterable, Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import NamedTuple

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from proxy.gate.reasons import Outcome
from proxy.state.worker_process import WorkerProcess

CONTENT_TYPE = CONTENT_TYPE_LATEST

# The gate's own work takes microseconds; a Redis read or a schema compiled for the first time
# takes longer. Upstream answers start within milliseconds to minutes.
_GATE_FINEST_S = 0.00005
_UPSTREAM_FINEST_S = 0.001
# The `tool` of a finding whose call names a tool the config does not pin (the request's own
# `tools` are the client's to name: as labels they would be without bound), and of one about no
# call at all (an orphan output, an envelope, a foreign item).
UNPINNED_TOOL = "(unpinned)"
NO_TOOL = "-"
# A worker's gauge file, `gauge_<mode>_<pid>.db`, in the multiprocess directory.
_LIVE_GAUGE_FILE = re.compile(r"gauge_live[a-z]+_(\d+)\.db")


class Family(NamedTuple):
    """A metric family as a scrape names it (a counter with `_total`), for the reference page."""

    name: str
    type: str
    labels: tuple[str, ...]
    help: str


# The families prometheus-client's own collectors add to every scrape, with what they mean for
# the proxy (their help is prometheus-client's). `--workers N` makes them the service's.
COLLECTED = (
    Family("process_cpu_seconds_total", "counter", (), "User and system CPU time, in seconds."),
    Family("process_resident_memory_bytes", "gauge", (), "Resident memory."),
    Family("process_virtual_memory_bytes", "gauge", (), "Virtual memory."),
    Family("process_open_fds", "gauge", (), "Open file descriptors."),
    Family("process_max_fds", "gauge", (), "The limit on open file descriptors."),
    Family("process_start_time_seconds", "gauge", (), "When the process started, since the epoch."),
    Family(
        "python_info",
        "gauge",
        ("implementation", "major", "minor", "patchlevel", "version"),
        "Always 1: the Python that runs the proxy.",
    ),
    Family(
        "python_gc_objects_collected_total",
        "counter",
        ("generation",),
        "Objects collected by the garbage collector.",
    ),
    Family(
        "python_gc_objects_uncollectable_total",
        "counter",
        ("generation",),
        "Uncollectable objects the garbage collector found.",
    ),
    Family("python_gc_collections_total", "counter", ("generation",), "Garbage collections."),
)


def bucket_bounds(finest: float, longest: float) -> tuple[float, ...]:
    """Histogram bounds 1, 2.5, 5 per decade from `finest`, ending with `longest` (a timeout:
    nothing the histogram times waits longer)."""
    if not 0 < finest < longest:
        raise ValueError(f"bucket_bounds: need 0 < finest ({finest}) < longest ({longest})")
    bounds: list[float] = []
    exponent = math.floor(math.log10(finest))
    while True:
        for mantissa in (1.0, 2.5, 5.0):
            # Rounded so that a bound reads as written (0.00025, not 0.00025000000000000006).
            bound = float(f"{mantissa * 10.0**exponent:.6g}")
            if bound < finest:
                continue
            if bound >= longest:
                return (*bounds, float(longest))
            bounds.append(bound)
        exponent += 1


class Metrics:
    """What the proxy counts (requests, findings, upstream answers, ledger and audit writes,
    reloads), times (the gate, the upstream) and holds (open streams, ledger and cache sizes).

    With `multiprocess_dir` (prometheus-client's multiprocess mode, chosen by the environment
    before any metric is made) a scrape reads every worker's files: counters and histograms
    add up over every worker since the service started, gauges over the workers alive.
    """

    def __init__(
        self,
        *,
        body_timeout_s: float = 60.0,
        upstream_timeout_s: float = 610.0,
        shared_ledger: bool = False,
        multiprocess_dir: str | None = None,
    ) -> None:
        self.multiprocess_dir = multiprocess_dir
        self.registry = CollectorRegistry()
        # What every request counts and times (its outcome, the gate's time, its upstream's
        # answer, the response recorded) is held here in plain Python and added to its series
        # when the registry is collected: prometheus-client's own update checks the metric,
        # takes a lock and walks a histogram's bounds in Python, some 30 k instructions a
        # request (`python bench/instructions.py`). A worker writes its file at once: a scrape
        # another worker answers reads it there.
        self._deferred = multiprocess_dir is None
        self._held: list[_Tally | _Timings] = []  # each series' counts, for `flush`
        # Registered first, so collected first: any reading of the registry sees every count.
        self.registry.register(_Pending(self))
        self.requests = Counter(
            "replay_proxy_requests",
            "Requests handled (`upstream`: the name of the upstream its route chose, `-` for a "
            "request answered before a route was chosen). `route`: `responses`, "
            "`responses_compact`, `chat_completions` (the Chat Completions dialect), "
            "`websocket` (a gated frame), `passthrough`, `any` (refused "
            "before a route was chosen); `outcome`: `forward`, `strip`, `rewrite`, `block`, "
            "`invalid`, `ledger_unavailable` (answered 503: the ledger could not be read), "
            "`upstream_error`, `not_found`, `unauthorized`, `invalid_target`; `dialect`: the API "
            "its body speaks, `responses` (Open Responses, over HTTP or a WebSocket) or `chat` "
            "(Chat Completions), `-` for a request no dialect reads (passed through, refused "
            "before its route was known).",
            ["route", "outcome", "upstream", "dialect"],
            registry=self.registry,
        )
        self.findings = Counter(
            "replay_proxy_findings",
            "Replay gate findings, by reason (the replay gate's, docs/gate.md) and the action "
            "taken; `tool` is the call's tool when the config pins its schema (`tools:`, a "
            "route's `gate.tools`: a set the operator bounds), "
            f"`{UNPINNED_TOOL}` for any other name (a request's own `tools` are the client's to "
            f"name), `{NO_TOOL}` for a finding about no call (an orphan output, an envelope, an "
            "item-level reason). `dialect`: `responses` or `chat`, the API of the request's body.",
            ["reason", "action", "tool", "dialect"],
            registry=self.registry,
        )
        self.gate_seconds = Histogram(
            "replay_proxy_gate_seconds",
            "Time from a gated body's arrival (whole: the client's upload is not counted) to "
            "the gate's verdict: decoding, parsing, ledger reads, schema compiles, checks. "
            "Bounds 50 µs … `limits.body_timeout_s`.",
            buckets=bucket_bounds(_GATE_FINEST_S, body_timeout_s),
            registry=self.registry,
        )
        self.upstream_seconds = Histogram(
            "replay_proxy_upstream_seconds",
            "Time from sending a request upstream to the head of its answer (or its failure), "
            "by upstream and route; a streamed body's duration is not in it. Bounds 1 ms … "
            "`upstream.connect_timeout_s` + `upstream.read_timeout_s`.",
            ["upstream", "route"],
            buckets=bucket_bounds(_UPSTREAM_FINEST_S, upstream_timeout_s),
            registry=self.registry,
        )
        self.upstream_answers = Counter(
            "replay_proxy_upstream_answers",
            "Requests sent upstream, by how the answer began: its HTTP status (`101` for a "
            "WebSocket upgrade), or `unreachable`, `timeout`, `bad_response` when none was had. "
            "`upstream` is `default` for the one upstream of `upstream:`.",
            ["upstream", "route", "status"],
            registry=self.registry,
        )
        self._answered: dict[tuple[str, str, str], tuple[_Tally, _Timings]] = {}
        # The children of `requests` by their labels, a few dozen at most: labels() validates
        # and locks on every call.
        self._counted: dict[tuple[str, str, str, str], _Tally] = {}
        self.open_streams = Gauge(
            "replay_proxy_open_streams",
            "Answers (and WebSockets) being relayed from the upstream now.",
            multiprocess_mode="livesum",
            registry=self.registry,
        )
        # Those answers, counted here: one process's scrape reads the count, a worker writes
        # each change to its file (the scrapes other workers answer read it there).
        self.streams = 0

        self.ledger_faults = Counter(
            "replay_proxy_ledger_faults",
            "Ledger operations that failed or timed out: `read` (the request was answered 503 "
            "`ledger_unavailable`, unless `ledger.fail_open`), `write` (the response was not "
            "recorded), `size` (the scrape's reading of a Redis ledger).",
            ["operation"],
            registry=self.registry,
        )
        self.ledger_writes = Counter(
            "replay_proxy_ledger_writes",
            "Responses recorded to the ledger (memory or Redis).",
            registry=self.registry,
        )
        self._gated = self._timings(self.gate_seconds)
        self._recorded = self._tally(self.ledger_writes)
        # Every worker's memory ledger is its own: the service holds their sum. A Redis
        # ledger is one store: the newest reading of it is what it holds.
        self.ledger_responses = Gauge(
            "replay_proxy_ledger_responses",
            "Responses the ledger holds now: every worker's memory ledger added up, or what "
            "the shared Redis ledger holds (the same on every proxy that uses it).",
            multiprocess_mode="livemostrecent" if shared_ledger else "livesum",
            registry=self.registry,
        )

        self.verdict_cache = Gauge(
            "replay_proxy_verdict_cache_entries",
            "Remembered (schema, arguments) verdicts of the gate config in force.",
            multiprocess_mode="livesum",
            registry=self.registry,
        )
        self._verdicts_held: int | None = None  # what `verdict_cache` was last set to
        self.prefix_sessions = Gauge(
            "replay_proxy_prefix_sessions",
            "Stateless sessions whose last clean body is held, so that the next turn is read and "
            "judged only past it (`limits.max_prefix_sessions`).",
            multiprocess_mode="livesum",
            registry=self.registry,
        )
        self.prefix_bytes = Gauge(
            "replay_proxy_prefix_bytes",
            "The bytes those sessions hold: their bodies (each at most "
            "`limits.max_prefix_bytes`), call ids, and the arguments the ledger said it relayed "
            "their calls with when it was asked.",
            multiprocess_mode="livesum",
            registry=self.registry,
        )
        self.reloads = Counter(
            "replay_proxy_config_reloads",
            "Config reloads (SIGHUP), by `result`: `applied` or `rejected`.",
            ["result"],
            registry=self.registry,
        )
        self.audit_write_failures = Counter(
            "replay_proxy_audit_write_failures",
            "Audit records that could not be written; each such request was answered 500 and "
            "not forwarded.",
            registry=self.registry,
        )
        self.emitted_calls = Counter(
            "replay_proxy_emitted_calls",
            "Function calls the upstream emitted on the gated routes, checked after the answer "
            "was relayed (door 2), and an MCP tool's results: `verdict` is `ok` or the reason "
            "it fails; `tool` is `(unknown)` with no schema known, `(other)` past 256 names; "
            "`dialect` is `responses`, `chat` or `mcp`.",
            ["tool", "verdict", "dialect"],
            registry=self.registry,
        )
        self.workers_missing = Gauge(
            "replay_proxy_workers_missing",
            "The slots of `serve --workers N` without a serving worker, as the supervisor last "
            "saw them; 0 with one process.",
            registry=self.registry,
            multiprocess_mode="mostrecent",  # every worker reads the same supervisor's view
        )
        # Each worker checks at its own probes and scrapes, and the checks look at what the
        # workers share (the upstreams, Redis, the supervisor's view): the newest reading is the
        # service's, as the worker that answers a scrape has just checked.
        self.ready = Gauge(
            "replay_proxy_ready",
            "1 when `/-/ready` would answer 200, 0 when 503: every check readiness depends on "
            "holds. Checked at each `/-/ready` probe and each scrape (the network checks are "
            "cached for 3 s).",
            multiprocess_mode="livemostrecent",
            registry=self.registry,
        )
        self.ready_check = Gauge(
            "replay_proxy_ready_check",
            "Each check of `/-/ready`, by its name (`draining`, `upstream:<name>`, `ledger`, "
            "`workers`): 1 when it holds, 0 when not, whether or not readiness depends on it "
            "(the ledger only with `readiness.ledger: required`).",
            ["check"],
            multiprocess_mode="livemostrecent",
            registry=self.registry,
        )
        self.build_info = Gauge(
            "replay_proxy_build_info",
            "Always 1: the proxy's version and the Python it runs on.",
            ["version", "python"],
            multiprocess_mode="livemax",
            registry=self.registry,
        )
        self.build_info.labels(package_version(), platform.python_version()).set(1)
        # In multiprocess mode each worker writes its process figures where the scrape reads
        # them; a process of its own has prometheus-client's collectors read it at the scrape.
        self.process = WorkerProcess(self.registry) if multiprocess_dir is not None else None

    def stream_opened(self) -> None:
        """An answer (or a WebSocket) begins to be relayed."""
        self.streams += 1
        if self.multiprocess_dir is not None:
            self.open_streams.inc()

    def stream_closed(self) -> None:
        """An answer (or a WebSocket) is done with."""
        self.streams -= 1
        if self.multiprocess_dir is not None:
            self.open_streams.dec()

    def count(self, route: str, outcome: Outcome, upstream: str, dialect: str) -> None:
        """One request handled (`replay_proxy_requests_total`); `upstream` is `-` when none
        was chosen, `dialect` when no dialect read it."""
        key = (route, outcome, upstream, dialect)
        tally = self._counted.get(key)
        if tally is None:
            child = self.requests.labels(route, outcome, upstream, dialect)
            tally = self._counted[key] = self._tally(child)
        if self._deferred:
            tally.count += 1
        else:
            tally.counter.inc()

    def gated(self, seconds: float) -> None:
        """The gate's time on one body (`replay_proxy_gate_seconds`)."""
        if self._deferred:
            self._gated.observe(seconds)
        else:
            self.gate_seconds.observe(seconds)

    def recorded(self) -> None:
        """One response recorded to the ledger (`replay_proxy_ledger_writes_total`)."""
        if self._deferred:
            self._recorded.count += 1
        else:
            self.ledger_writes.inc()

    def found(
        self, reason: str, action: str, tool: str | None, pinned: Container[str], dialect: str
    ) -> None:
        """One gate finding (`replay_proxy_findings_total`) about a call of `tool`, named only
        when it is `pinned` (a set the config bounds), in a body of `dialect`."""
        label = NO_TOOL if tool is None else tool if tool in pinned else UNPINNED_TOOL
        self.findings.labels(reason, action, label, dialect).inc()

    def verdicts_held(self, count: int) -> None:
        """The verdicts the gate remembers now (`replay_proxy_verdict_cache_entries`); set only
        when it changed: on every request it would take a lock and a write for the same value."""
        if count != self._verdicts_held:
            self._verdicts_held = count
            self.verdict_cache.set(count)

    def upstream_answered(self, upstream: str, route: str, status: str, seconds: float) -> None:
        """One request sent upstream: how its answer began (or failed), and after how long."""
        key = (upstream, route, status)
        held = self._answered.get(key)
        if held is None:
            # Looked up once per (upstream, route, status), a few of each: labels() validates
            # and locks on every call.
            answers = self.upstream_answers.labels(upstream, route, status)
            timed = self.upstream_seconds.labels(upstream, route)
            held = self._answered[key] = (self._tally(answers), self._timings(timed))
        tally, timings = held
        if self._deferred:
            tally.count += 1
            timings.observe(seconds)
        else:
            tally.counter.inc()
            timings.histogram.observe(seconds)

    def _tally(self, counter: Counter) -> _Tally:
        tally = _Tally(counter)
        self._held.append(tally)
        return tally

    def _timings(self, histogram: Histogram) -> _Timings:
        timings = _Timings(histogram)
        self._held.append(timings)
        return timings

    def flush(self) -> None:
        """Add the counts and times held since the last collection to their series. On the
        thread that counts (the event loop): the registry's collection calls it."""
        for held in self._held:
            held.flush()

    def render(self) -> bytes:
        """The scrape: this process's registry and its process and Python collectors, or, in
        multiprocess mode, every worker's files (their process figures too)."""
        if self.multiprocess_dir is None:
            self.open_streams.set(self.streams)
            sources: list[Collector] = [self.registry, PROCESS_COLLECTOR, PLATFORM_COLLECTOR]
            sources.append(GC_COLLECTOR)
        else:
            forget_dead_workers(self.multiprocess_dir)
            if self.process is not None:
                self.process.refresh()
            service = CollectorRegistry()
            MultiProcessCollector(service, path=self.multiprocess_dir)  # type: ignore[no-untyped-call]
            sources = [service, PLATFORM_COLLECTOR]
        scrape = CollectorRegistry(auto_describe=False)
        scrape.register(_WithoutCreated(sources))
        return generate_latest(scrape)


class _Tally:
    """A counter's increments since the last collection."""

    __slots__ = ("count", "counter")

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self.count = 0

    def flush(self) -> None:
        if self.count:
            self.counter.inc(self.count)
            self.count = 0


class _Timings:
    """A histogram's observations since the last collection: a count per bucket, their sum."""

    __slots__ = ("bounds", "counts", "histogram", "total")

    def __init__(self, histogram: Histogram) -> None:
        self.histogram = histogram
        self.bounds: list[float] = histogram._upper_bounds  # ends with +Inf
        self.counts = [0] * len(self.bounds)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        # Its first bound at or over `seconds`, as prometheus-client's `observe` finds it.
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def flush(self) -> None:
        # A histogram adds one observation at a time; its buckets and sum are its values.
        histogram, counts = self.histogram, self.counts
        if not any(counts):
            return
        histogram._sum.inc(self.total)
        for bucket, count in zip(histogram._buckets, counts, strict=True):
            if count:
                bucket.inc(count)
        self.counts = [0] * len(counts)
        self.total = 0.0


class _Pending(Collector):
    """Collected before the proxy's series: adds what `Metrics` holds to them."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        self.metrics.flush()
        return iter(())


def iter_families() -> Iterator[Family]:
    """Every family a scrape shows: the proxy's own, in the order they are made, then those of
    prometheus-client's collectors (docs/metrics.md is generated from these)."""
    for collector in Metrics().registry._collector_to_names:  # no public listing of them
        if isinstance(collector, Counter | Gauge | Histogram):
            kind = collector._type
            name = collector._name + ("_total" if kind == "counter" else "")
            labels = tuple(collector._labelnames)
            yield Family(name, kind, labels, collector._documentation)
    yield from COLLECTED


def package_version() -> str:
    try:
        return version("replay-proxy")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


class _WithoutCreated(Collector):
    """The samples of `sources` without the `_created` series: a counter's start time is a
    second series per label set that no dashboard reads, and it differs between workers."""

    def __init__(self, sources: Iterable[Collector]) -> None:
        self.sources = tuple(sources)

    def collect(self) -> Iterator[Metric]:
        for source in self.sources:
            for family in source.collect():
                family.samples = [s for s in family.samples if not s.name.endswith("_created")]
                yield family


def forget_dead_workers(directory: str) -> list[int]:
    """Remove the live gauges of workers that are gone (a worker that crashed could not), so
    that the service's gauges add up the workers alive. The pids forgotten."""
    dead = sorted(
        {
            pid
            for path in Path(directory).iterdir()
            if (found := _LIVE_GAUGE_FILE.fullmatch(path.name))
            if not _alive(pid := int(found.group(1)))
        }
    )
    for pid in dead:
        mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]
    return dead


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process has the pid now: the worker is gone
        return False
    return True
