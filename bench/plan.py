"""How long and how often the load benchmark drives each target: bounded in count and time."""

from __future__ import annotations

from dataclasses import dataclass

from workload import Body


@dataclass(frozen=True)
class Plan:
    """How long and how often: bounded in count (rounds, samples) and in time (seconds)."""

    rounds: int
    duration_s: int  # per wrk run (wrk takes whole seconds)
    large_duration_s: int  # per wrk run with a 1 MB body: 32 of them take a second to arrive
    large_failing: bool  # also drive the failing variants of the 1 MB body
    warmup: bool
    connections: int
    unloaded_s: int
    # Cells per target and body each round, interleaved: a one-connection p50 is the wake-ups
    # between wrk, the proxy and the upstream on other cores, and drifts from second to second
    # by more than the 0.25 ms it is held to; the median of many short cells settles it.
    unloaded_cells: int
    stream_samples: int
    stream_gap_ms: float
    retry_s: float  # time that re-running cells a neighbour disturbed may take, at most
    open_streams: int = 1000  # SSE streams held open at once to see what they cost in memory

    # A run during which others (other processes, the host's other guests) took more than
    # this many cores is re-run once.
    disturbed_cores: float = 0.25

    def duration(self, body: Body) -> int:
        return self.large_duration_s if body.pairs >= 400 else self.duration_s


FULL = Plan(
    rounds=3,
    duration_s=2,
    large_duration_s=3,
    large_failing=True,
    warmup=True,
    connections=32,
    unloaded_s=1,
    unloaded_cells=5,
    stream_samples=60,
    stream_gap_ms=2.0,
    retry_s=40,
)
QUICK = Plan(
    rounds=1,
    duration_s=1,
    large_duration_s=3,
    large_failing=False,
    warmup=False,
    connections=32,
    unloaded_s=1,
    unloaded_cells=3,
    stream_samples=15,
    stream_gap_ms=2.0,
    retry_s=15,
)
