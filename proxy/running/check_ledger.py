"""`check --ledger`: the proxy's Redis ledger read offline, so that a follow-up's outputs pair
with the calls only the ledger holds, as they would in the proxy."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from proxy import settings
from proxy.config import DEFAULT_UPSTREAM
from proxy.gate.pairing import NOTHING_RECORDED, Recorded
from proxy.state.ledger import Ledger, LedgerFault

__all__ = ["LedgerFault", "LedgerReader"]


class LedgerReader:
    """One tenant's records in a Redis ledger, read on one event loop for the whole run.

    Raises LedgerFault when the ledger cannot be read at all."""

    def __init__(
        self,
        url: str,
        tenant: str,
        ledger: settings.LedgerSettings,
        *,
        provenance: bool,
        upstream: str = DEFAULT_UPSTREAM,
    ) -> None:
        # Imported here: `check` without --ledger never loads the Redis client.
        from proxy.state.stores import RedisStore

        self.tenant = tenant
        self.upstream = upstream  # references resolve to the items it made
        self.provenance = provenance
        self.runner = asyncio.Runner()
        self.store = RedisStore(url, ttl_s=ledger.ttl_s, timeout_s=ledger.timeout_s)
        self.ledger = Ledger(self.store, max_chain=ledger.max_chain, fail_open=False)
        try:
            # A chain no response id names: an answer at all says the ledger is there.
            self.runner.run(self.store.chain(tenant, "", 1))
        except LedgerFault:
            self.close()
            raise

    @property
    def faults(self) -> int:
        """How many reads of the ledger failed."""
        return self.ledger.stats.faults.total()

    def recorded(self, body: Mapping[str, Any]) -> Recorded:
        try:
            view = self.runner.run(
                self.ledger.view(
                    self.tenant, body, provenance=self.provenance, upstream=self.upstream
                )
            )
        except LedgerFault:  # counted: the run says how many reads failed
            return NOTHING_RECORDED
        return NOTHING_RECORDED if view is None else view

    def close(self) -> None:
        try:
            self.runner.run(self.store.close())
        finally:
            self.runner.close()
