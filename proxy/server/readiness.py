"""Readiness: whether this process should be sent requests now, as a list of named checks."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, replace
from functools import partial
from urllib.parse import urlsplit

from proxy import settings
from proxy.config import Config
from proxy.state.ledger import LedgerFault, Store
from proxy.state.metrics import Metrics
from proxy.state.workers import WorkerSlot, read_slots

# A probe's answer is kept this long, so that probes from several places (a load balancer,
# an orchestrator, an operator) cost the upstream and Redis one connection between them.
CACHE_S = 3.0
# The longest a connect check waits (less when upstream.connect_timeout_s is shorter).
_CONNECT_S = 2.0


@dataclass(frozen=True)
class Check:
    """One thing readiness looks at: its name, whether it holds, what was seen, and whether
    readiness depends on it (one that is only reported may fail and the process stay ready)."""

    name: str
    ok: bool
    detail: str
    required: bool = True

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail, "required": self.required}


def is_ready(checks: list[Check]) -> bool:
    """Whether every check readiness depends on holds."""
    return all(check.ok for check in checks if check.required)


def upstreams_of(config: Config) -> Mapping[str, settings.UpstreamSettings]:
    """The upstreams the config names, by name, its MCP servers' too (`mcp:<name>`): the one
    place readiness learns them."""
    return {**config.upstream_named, **config.mcp_upstreams}


class Readiness:
    """Draining after SIGTERM, the upstreams (a TCP connect each), the Redis ledger (reported,
    or required with `readiness.ledger: required`), and the supervisor's worker slots; the
    network checks are cached for `CACHE_S`."""

    def __init__(
        self, ledger: settings.LedgerSettings, metrics: Metrics, worker: WorkerSlot | None
    ):
        self.ledger = ledger
        self.metrics = metrics
        self.worker = worker
        self.draining = False
        self._cache: dict[str, tuple[float, Check]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._published: set[str] = set()

    async def checks(self, config: Config, store: Store) -> list[Check]:
        """Every check, in order; the readiness gauges follow what they found."""
        found = [
            Check(
                "draining",
                not self.draining,
                "stopping: requests in flight are finishing" if self.draining else "serving",
            )
        ]
        # Probed at once: a probe that waits out its timeout holds none of the others up.
        probes = [
            self._cached(f"upstream:{name}", partial(_connect, upstream))
            for name, upstream in upstreams_of(config).items()
        ]
        *upstreams, ledger = await asyncio.gather(
            *probes, self._cached("ledger", partial(self._ledger, store))
        )
        found.extend(upstreams)
        found.append(replace(ledger, required=config.readiness.ledger == "required"))
        workers = self.workers()
        if workers is not None:
            found.append(workers)
        self._publish(found)
        return found

    def _publish(self, checks: list[Check]) -> None:
        """Set the readiness gauges from `checks`, as `/-/ready` answers from them."""
        self.metrics.ready.set(1 if is_ready(checks) else 0)
        named = {check.name for check in checks}
        # An upstream a reload removed is no longer checked. In multiprocess mode a label set
        # cannot be removed (prometheus-client's files keep it): it keeps its last reading.
        if self.metrics.multiprocess_dir is None:
            for gone in self._published - named:
                self.metrics.ready_check.remove(gone)
        self._published = named
        for check in checks:
            self.metrics.ready_check.labels(check.name).set(1 if check.ok else 0)

    def workers(self) -> Check | None:
        """The supervisor's slots as it last wrote them (None without a supervisor); the
        missing-workers gauge follows what this reads."""
        if self.worker is None:
            return None
        try:
            slots = read_slots(self.worker.directory)
        except (OSError, ValueError) as exc:
            return Check("workers", False, f"the supervisor's view cannot be read: {exc}")
        self.metrics.workers_missing.set(len(slots.missing))
        if not slots.missing:
            return Check("workers", True, f"{slots.workers} of {slots.workers} slots serving")
        said = "; ".join(f"slot {m.slot}: {m.detail}" for m in slots.missing)
        return Check(
            "workers", False, f"{len(slots.missing)} of {slots.workers} slots missing: {said}"
        )

    async def watch(self, every_s: float = 1.0) -> None:
        """Keep the missing-workers gauge current between readiness probes."""
        while self.worker is not None:
            self.workers()
            await asyncio.sleep(every_s)

    async def _cached(self, name: str, probe: Callable[[], Awaitable[Check]]) -> Check:
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:  # one probe at a time per check; the others take its answer
            cached = self._cache.get(name)
            if cached is not None and time.monotonic() - cached[0] < CACHE_S:
                return cached[1]
            check = await probe()
            self._cache[name] = (time.monotonic(), Check(name, check.ok, check.detail))
            return self._cache[name][1]

    async def _ledger(self, store: Store) -> Check:
        if self.ledger.backend != "redis":
            return Check("ledger", True, f"{self.ledger.backend}: in this process")
        where = f"redis at {_address(self.ledger.url)}"
        try:
            await store.ping()
        except LedgerFault as exc:
            if self.ledger.fail_open:
                return Check("ledger", True, f"{where} is down ({exc}); ledger.fail_open: true")
            return Check("ledger", False, f"{where} is down: {exc}")
        return Check("ledger", True, f"{where} answers")


async def _connect(upstream: settings.UpstreamSettings) -> Check:
    """Whether a TCP connection opens to the upstream (to the forward proxy when it goes
    through one): no request is sent, so no upstream sees a probe as traffic."""
    host, port = _endpoint(upstream)
    timeout_s = min(upstream.connect_timeout_s, _CONNECT_S)
    at = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    via = " (the forward proxy)" if upstream.proxy is not None else ""
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return Check("", False, f"no connection to {at}{via} within {timeout_s:g} s")
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc) or type(exc).__name__
        return Check("", False, f"cannot connect to {at}{via}: {reason}")
    writer.close()
    with suppress(OSError):  # connected is all this check asks
        await writer.wait_closed()
    return Check("", True, f"connected to {at}{via}")


def _endpoint(upstream: settings.UpstreamSettings) -> tuple[str, int]:
    """Where the upstream hop connects: the forward proxy when it goes through one."""
    parts = urlsplit(upstream.proxy if upstream.proxy is not None else upstream.url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def _address(url: str) -> str:
    """host:port of a Redis URL, without the credentials it may carry."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname}:{parts.port or 6379}"
