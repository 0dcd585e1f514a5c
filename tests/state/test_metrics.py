"""The metrics themselves: histogram bounds, no `_created` series, the dead workers' gauges."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.parser import text_string_to_metric_families

from proxy.gate.reasons import Outcome
from proxy.state.metrics import Metrics, bucket_bounds, forget_dead_workers


@pytest.mark.parametrize(
    ("finest", "longest", "expected"),
    [
        pytest.param(
            0.00005,
            60.0,
            (
                *(5e-05, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05),
                *(0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 60.0),
            ),
            id="gate-default-body-timeout",
        ),
        pytest.param(
            0.001,
            1.0,
            (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            id="ends-on-a-step",
        ),
        pytest.param(0.001, 0.004, (0.001, 0.0025, 0.004), id="ends-between-steps"),
        pytest.param(0.003, 0.02, (0.005, 0.01, 0.02), id="starts-between-steps"),
        pytest.param(
            1.0,
            610.0,
            (1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 610.0),
            id="upstream-default-timeouts",
        ),
    ],
)
def test_bucket_bounds(finest: float, longest: float, expected: tuple[float, ...]) -> None:
    assert bucket_bounds(finest, longest) == expected


@pytest.mark.parametrize(
    ("finest", "longest"),
    [
        pytest.param(0.0, 1.0, id="zero-finest"),
        pytest.param(-1.0, 1.0, id="negative-finest"),
        pytest.param(2.0, 1.0, id="longest-below-finest"),
        pytest.param(1.0, 1.0, id="one-bound"),
    ],
)
def test_bucket_bounds_refuses(finest: float, longest: float) -> None:
    with pytest.raises(ValueError, match="bucket_bounds"):
        bucket_bounds(finest, longest)


def test_histograms_reach_the_timeouts_they_time() -> None:
    metrics = Metrics(body_timeout_s=30.0, upstream_timeout_s=130.0)
    metrics.gate_seconds.observe(0.001)
    metrics.upstream_answered("default", "responses", "200", 0.01)
    bounds = {
        family.name: max(
            float(s.labels["le"]) for s in family.samples if s.labels.get("le", "+Inf") != "+Inf"
        )
        for family in text_string_to_metric_families(metrics.render().decode())
        if family.type == "histogram"
    }
    assert bounds == {"replay_proxy_gate_seconds": 30.0, "replay_proxy_upstream_seconds": 130.0}


def _samples(registry: CollectorRegistry, name: str) -> dict[tuple[str, str], float]:
    return {
        (sample.name, sample.labels.get("le", "")): sample.value
        for family in registry.collect()
        if family.name == name
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


# Times on and around the gate's bounds (an observation equal to a bound is within it), and
# between them.
_BOUNDS = bucket_bounds(0.00005, 60.0)
_TIMES = st.one_of(
    st.sampled_from([0.0, *_BOUNDS, *(b * (1 + 1e-12) for b in _BOUNDS), 61.0, 1e9]),
    st.floats(min_value=0.0, max_value=100.0),
)


@given(times=st.lists(_TIMES, max_size=40), requests=st.integers(min_value=0, max_value=30))
def test_held_counts_and_times_read_as_prometheus_client_counts_them(
    times: list[float], requests: int
) -> None:
    """One process holds what each request counts until the registry is read: every reading
    shows what prometheus-client's own updates would have (a bucket's bound includes it)."""
    metrics = Metrics()
    reference = CollectorRegistry()
    gate = Histogram("replay_proxy_gate_seconds", "-", buckets=_BOUNDS, registry=reference)
    labels = ["route", "outcome", "upstream", "dialect"]
    counted = Counter("replay_proxy_requests", "-", labels, registry=reference)
    # Read once part way, then again: nothing is lost or counted twice across a reading.
    half = len(times) // 2
    for index, seconds in enumerate(times):
        if index == half:
            assert _samples(metrics.registry, "replay_proxy_gate_seconds") == _samples(
                reference, "replay_proxy_gate_seconds"
            )
        metrics.gated(seconds)
        gate.observe(seconds)
    for _ in range(requests):
        metrics.count("responses", Outcome.FORWARD, "default", "responses")
        counted.labels("responses", "forward", "default", "responses").inc()

    for name in ("replay_proxy_gate_seconds", "replay_proxy_requests"):
        got = _samples(metrics.registry, name)
        assert got.keys() == _samples(reference, name).keys()
        assert got == pytest.approx(_samples(reference, name))
    scraped = {
        family.name: family for family in text_string_to_metric_families(metrics.render().decode())
    }
    assert scraped["replay_proxy_gate_seconds"].samples[-2].value == len(times)  # its _count


def test_no_created_series() -> None:
    metrics = Metrics()
    metrics.requests.labels("responses", "forward", "default", "responses").inc()
    metrics.found("orphan", "block", None, (), "responses")
    metrics.gate_seconds.observe(0.001)
    metrics.ledger_faults.labels("read").inc()

    text = metrics.render().decode()

    assert "replay_proxy_requests_total" in text
    assert "_created" not in text


def test_dead_workers_gauges_are_forgotten_and_the_living_kept(tmp_path: Path) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    dead = int(gone.stdout)
    alive = os.getpid()
    names = [
        f"gauge_livesum_{dead}.db",
        f"gauge_livemostrecent_{dead}.db",
        f"gauge_livesum_{alive}.db",
        f"counter_{dead}.db",  # what a dead worker counted stays counted
        f"gauge_max_{dead}.db",  # not a live gauge
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")

    assert forget_dead_workers(str(tmp_path)) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"gauge_livesum_{alive}.db", f"counter_{dead}.db", f"gauge_max_{dead}.db"]
    )
