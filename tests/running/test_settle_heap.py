"""The serving process keeps the collector off its start-up heap and runs it less often."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from proxy.running.serving import settle_heap


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored_gc")
def test_start_up_heap_is_frozen_and_young_passes_are_rarer() -> None:
    started_with = {"kept": object()}
    _, middle, old = gc.get_threshold()
    settle_heap()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (10_000, middle, old)
    assert not gc.is_tracked(started_with) or started_with not in gc.get_objects()
