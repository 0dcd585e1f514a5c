"""A worker's process and Python metrics kept in the multiprocess directory, so that a scrape of
any worker reads the whole service's CPU time, memory, descriptors and garbage collections
(prometheus-client's own collectors describe only the process that is scraped)."""

from __future__ import annotations

import asyncio
import gc
import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector

# How often each worker writes its figures; the one scraped writes them at the scrape too.
REFRESH_S = 5.0


class WorkerProcess:
    """The standard process and GC families under their usual names, as the service's:
    counters add up every worker since the service started, gauges the workers alive, and the
    start time is the first worker's."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.cpu = Counter(
            "process_cpu_seconds",
            "User and system CPU time of every worker since the service started, in seconds.",
            registry=registry,
        )
        self.resident = self._gauge(registry, "process_resident_memory_bytes", "Resident memory")
        self.virtual = self._gauge(registry, "process_virtual_memory_bytes", "Virtual memory")
        self.open_fds = self._gauge(registry, "process_open_fds", "Open file descriptors")
        self.max_fds = Gauge(
            "process_max_fds",
            "The lowest limit on open file descriptors of the workers alive.",
            multiprocess_mode="livemin",
            registry=registry,
        )
        self.start_time = Gauge(
            "process_start_time_seconds",
            "Start time of the service's first worker since the unix epoch, in seconds.",
            multiprocess_mode="min",
            registry=registry,
        )
        self.gc_collected = self._gc(registry, "python_gc_objects_collected", "Objects collected")
        self.gc_uncollectable = self._gc(
            registry, "python_gc_objects_uncollectable", "Uncollectable objects found"
        )
        self.gc_collections = self._gc(registry, "python_gc_collections", "Collections")
        self._process = ProcessCollector(registry=None)
        # What each counter was last seen at in this process: counters only go up by the rest.
        self._seen: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()  # a scrape refreshes in a thread, the timer on the loop

    @staticmethod
    def _gauge(registry: CollectorRegistry, name: str, what: str) -> Gauge:
        return Gauge(
            name,
            f"{what} of the workers alive, added up, in the unit the name says.",
            multiprocess_mode="livesum",
            registry=registry,
        )

    @staticmethod
    def _gc(registry: CollectorRegistry, name: str, what: str) -> Counter:
        return Counter(
            name,
            f"{what} by the garbage collector of every worker, by generation.",
            ["generation"],
            registry=registry,
        )

    async def keep_refreshed(self) -> None:
        """Write this process's figures now and every REFRESH_S seconds, until cancelled."""
        while True:
            self.refresh()
            await asyncio.sleep(REFRESH_S)

    def refresh(self) -> None:
        """Write this process's figures now."""
        with self._lock:
            self._refresh()

    def _refresh(self) -> None:
        gauges = {
            "process_resident_memory_bytes": self.resident,
            "process_virtual_memory_bytes": self.virtual,
            "process_open_fds": self.open_fds,
            "process_max_fds": self.max_fds,
            "process_start_time_seconds": self.start_time,
        }
        for family in self._process.collect():
            for sample in family.samples:
                if sample.name == "process_cpu_seconds_total":
                    self._grow(self.cpu, "cpu", "", sample.value)
                elif sample.name in gauges:
                    gauges[sample.name].set(sample.value)
        for generation, stats in enumerate(gc.get_stats()):
            label = str(generation)
            self._grow(self.gc_collected, "collected", label, stats["collected"])
            self._grow(self.gc_uncollectable, "uncollectable", label, stats["uncollectable"])
            self._grow(self.gc_collections, "collections", label, stats["collections"])

    def _grow(self, counter: Counter, key: str, label: str, value: float) -> None:
        grown = value - self._seen.get((key, label), 0.0)
        if grown > 0:
            (counter.labels(label) if label else counter).inc(grown)
        self._seen[(key, label)] = value
