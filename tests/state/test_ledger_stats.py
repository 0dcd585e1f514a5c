"""The ledger counts its own writes and faults, and moves the service's series as they happen:
no front is called back."""

from __future__ import annotations

from pathlib import Path

from proxy import settings
from proxy.admission.services import open_ledger
from proxy.state.ledger import Ledger, LedgerFault, LedgerStats
from proxy.state.metrics import Metrics
from proxy.state.recording import NO_CONTEXT
from proxy.state.stores import MemoryStore
from tests.builders import sales_call
from tests.server.checks import metric
from tests.state.test_ledger_view import BrokenStore


def answer(response_id: str) -> dict[str, object]:
    return {"id": response_id, "output": [sales_call("c")]}


async def test_the_ledger_counts_what_it_recorded_and_what_failed() -> None:
    ledger = Ledger(MemoryStore(max_responses=10, ttl_s=60), max_chain=8, fail_open=True)
    await ledger.record("t", answer("resp_1"), NO_CONTEXT)
    await ledger.record("t", answer("resp_2"), NO_CONTEXT)
    assert ledger.stats.writes == 2
    assert not ledger.stats.faults

    broken = Ledger(BrokenStore(max_responses=10, ttl_s=60), max_chain=8, fail_open=True)
    await broken.record("t", answer("resp_1"))  # read again: its earlier recording is read
    await broken.view("t", {"previous_response_id": "resp_1"}, provenance=False)
    assert broken.stats.writes == 0
    assert broken.stats.faults == {"write": 1, "read": 1}


async def test_the_counts_are_in_the_metrics_at_the_moment_they_happen() -> None:
    metrics = Metrics()
    store = MemoryStore(max_responses=10, ttl_s=60)
    ledger = Ledger(store, max_chain=8, fail_open=True, stats=LedgerStats(metrics, own=store))
    await ledger.record("t", answer("resp_1"), NO_CONTEXT)
    await ledger.record("t", answer("resp_2"), NO_CONTEXT)
    ledger.fault("size", LedgerFault("down"))

    text = metrics.render().decode()
    assert metric(text, "replay_proxy_ledger_writes_total") == 2
    assert metric(text, "replay_proxy_ledger_responses") == 2  # set at the write, no scrape
    assert metric(text, "replay_proxy_ledger_faults_total", operation="size") == 1


async def test_open_ledger_counts_in_the_metrics_it_is_given() -> None:
    metrics = Metrics()
    ledger = open_ledger(settings.LedgerSettings(), metrics)
    try:
        await ledger.record("t", answer("resp_1"), NO_CONTEXT)
    finally:
        await ledger.store.close()

    text = metrics.render().decode()
    assert ledger.stats.writes == 1
    assert metric(text, "replay_proxy_ledger_writes_total") == 1
    # One process's scrape reads the store's size itself (the metrics endpoint does): a write
    # does not set it.
    assert metric(text, "replay_proxy_ledger_responses") == 0


async def test_a_workers_memory_ledger_sets_its_size_at_each_write(tmp_path: Path) -> None:
    # With workers, a scrape lands on any of them: only this one can say what its memory holds.
    metrics = Metrics(multiprocess_dir=str(tmp_path))
    ledger = open_ledger(settings.LedgerSettings(), metrics)
    try:
        await ledger.record("t", answer("resp_1"), NO_CONTEXT)
        await ledger.record("t", answer("resp_2"), NO_CONTEXT)
    finally:
        await ledger.store.close()

    assert metrics.registry.get_sample_value("replay_proxy_ledger_responses") == 2
