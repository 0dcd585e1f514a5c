"""The services every front opens once and passes down, opened by one function: the metrics,
the audit log, the ledger (its faults and writes counted), the MCP sessions' tool lists (in
the ledger's store) and door 2's checks."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from proxy import settings
from proxy.admission.emitted import EmittedChecks
from proxy.settings import ConfigError
from proxy.state.audit import AuditLog
from proxy.state.ledger import Ledger, LedgerStats
from proxy.state.metrics import Metrics
from proxy.state.stores import MemoryStore, open_lists, open_store
from proxy.state.tool_lists import ToolLists


@dataclass(frozen=True)
class Services:
    """What every exchange of one process shares, whichever front it came through."""

    metrics: Metrics
    audit_log: AuditLog
    ledger: Ledger
    emitted: EmittedChecks
    # What each MCP session's server listed, in the ledger's store.
    tool_lists: ToolLists


@contextlib.asynccontextmanager
async def open_services(
    audit: settings.Audit,
    ledger: settings.LedgerSettings,
    metrics: Metrics,
    *,
    chain: str | None = None,
    lock_path: str | None = None,
) -> AsyncIterator[Services]:
    """The services of one process, closed when it stops (`chain` and `lock_path`: a worker's,
    on a shared stdout)."""
    audit_log = open_audit_log(audit, chain=chain, lock_path=lock_path)
    try:
        opened = open_ledger(ledger, metrics)
        try:
            emitted = EmittedChecks(audit_log, metrics)
            try:
                lists = ToolLists(open_lists(opened.store, ledger), opened)
                yield Services(metrics, audit_log, opened, emitted, lists)
            finally:
                await emitted.close()
        finally:
            await opened.store.close()
    finally:
        audit_log.close()


def open_audit_log(
    audit: settings.Audit, *, chain: str | None = None, lock_path: str | None = None
) -> AuditLog:
    """The audit log of `audit` (`chain` and `lock_path`: a worker's, on a shared stdout);
    ConfigError naming `audit.path` when it cannot be appended to."""
    try:
        return AuditLog(
            audit.path,
            include_arguments=audit.include_arguments,
            max_bytes=audit.max_bytes,
            chain=chain,
            lock_path=lock_path,
        )
    except OSError as exc:
        raise ConfigError(f"audit.path: cannot append to {audit.path!r}: {exc.strerror}") from None


def open_ledger(ledger: settings.LedgerSettings, metrics: Metrics) -> Ledger:
    """The ledger of `ledger` on a store of its own (the caller closes `.store`), each fault
    and each response recorded counted in `metrics`."""
    store = open_store(ledger)
    # A worker's memory store is its own: the service's gauge adds up every worker's latest
    # size, which only that worker can set, so it does at each write. (One process's scrape
    # reads the size itself, as it reads a shared store's.)
    shared_metrics = metrics.multiprocess_dir is not None
    own = store if isinstance(store, MemoryStore) and shared_metrics else None
    return Ledger(
        store,
        max_chain=ledger.max_chain,
        fail_open=ledger.fail_open,
        stats=LedgerStats(metrics, own=own),
    )
