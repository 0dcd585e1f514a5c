"""The ledger: what the proxy recorded of the upstream responses it relayed, per tenant, kept
in a store under the rules of the config (chain depth, failing open), with its own counts."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence, Sized
from typing import TYPE_CHECKING, Any, Protocol

from proxy.gate import items
from proxy.gate.items import Item
from proxy.state.ledger_view import LedgerView, Wanted
from proxy.state.recording import NO_CONTEXT, Context, RecordedResponse

if TYPE_CHECKING:
    from proxy.state.metrics import Metrics

log = logging.getLogger("replay_proxy")


class LedgerFault(Exception):
    """The store could not be read or written in time."""


class LedgerStats:
    """What a ledger counts of itself as it happens: the responses it recorded, and its store's
    faults by operation.

    With `metrics`, each is counted in the service's series at that moment too: in
    multiprocess mode a worker's series are files only that worker writes, so a scrape that
    lands on another could not bring them up to date. `own` is a store of this process's own,
    whose size is set there at each write for the same reason (a shared store's is read at a
    scrape).
    """

    def __init__(self, metrics: Metrics | None = None, *, own: Sized | None = None) -> None:
        self.writes = 0
        self.faults: Counter[str] = Counter()
        self.metrics = metrics
        self.own = own

    def wrote(self) -> None:
        """One response recorded."""
        self.writes += 1
        if self.metrics is not None:
            self.metrics.recorded()
            if self.own is not None:
                self.metrics.ledger_responses.set(len(self.own))

    def faulted(self, operation: str) -> None:
        """One fault of the store's, in `operation` (read, write, size, ...)."""
        self.faults[operation] += 1
        if self.metrics is not None:
            self.metrics.ledger_faults.labels(operation).inc()


class Store(Protocol):
    """A ledger backend. Every method may raise LedgerFault."""

    async def put(
        self, tenant: str, recording: RecordedResponse, tools: Sequence[tuple[str, Any]] = ()
    ) -> None:
        """Record a response; `tools` (stored once per hash) are those `recording.tools` names."""
        ...

    async def tools(self, tenant: str, keys: Sequence[str]) -> dict[str, list[tuple[str, Any]]]:
        """The recorded tools under each of `keys` that is still known."""
        ...

    async def chain(self, tenant: str, response_id: str, depth: int) -> list[RecordedResponse]:
        """The named response and its predecessors, newest first; empty when it is unknown."""
        ...

    async def lookup(
        self,
        tenant: str,
        item_ids: Sequence[str],
        call_ids: Sequence[str],
        *,
        upstream: str | None = None,
    ) -> tuple[dict[str, Item], list[Item]]:
        """The items `upstream` made (or that went to it) recorded by id, and every recorded
        call with one of `call_ids`, whichever upstream emitted it."""
        ...

    async def close(self) -> None: ...

    async def size(self) -> int:
        """How many responses the store holds now (every process's, for a shared store)."""
        ...

    async def ping(self) -> None:
        """Return once the store answers (a LedgerFault when it does not): for readiness."""
        ...


class Ledger:
    """The store plus the rules: tenants, chain depth, and what a missing history means."""

    def __init__(
        self,
        store: Store,
        *,
        max_chain: int,
        fail_open: bool,
        stats: LedgerStats | None = None,
    ) -> None:
        self.store = store
        self.max_chain = max_chain
        self.fail_open = fail_open
        self.stats = LedgerStats() if stats is None else stats

    def fault(self, operation: str, exc: LedgerFault) -> None:
        """Log and count a fault of the store's; what it costs depends on the operation."""
        if operation == "tool_list":
            cost = "an MCP session's tool list is not recorded"
        elif operation != "read":
            cost = "the response is not recorded" if operation == "write" else "not known"
        elif self.fail_open:
            cost = "failing open: an unpaired output is let through"
        else:
            cost = "the request is answered 503 ledger_unavailable"
        log.warning("ledger %s failed (%s): %s", operation, cost, exc)
        self.stats.faulted(operation)

    async def view(
        self,
        tenant: str,
        body: Mapping[str, Any],
        *,
        provenance: bool,
        upstream: str | None = None,
    ) -> LedgerView | None:
        """What the gate may pair this request's outputs with; None when it names no history.
        Its `item_reference`s resolve only to items recorded from `upstream` (the route's).

        A store that cannot answer is logged and counted, then raises LedgerFault, unless
        `fail_open`: then what could not be read counts as not recorded."""
        wanted = Wanted.of(body, provenance=provenance)
        if wanted is None:
            return None
        return await self.read(tenant, body, wanted, upstream)

    async def read(
        self, tenant: str, body: Mapping[str, Any], wanted: Wanted, upstream: str | None = None
    ) -> LedgerView:
        """`view` of what `body` wants (`wanted`, its `Wanted` or more)."""
        previous = wanted.previous
        view = LedgerView()
        if previous is None and not wanted.reference_ids:
            view.calls_alone = tuple(wanted.call_ids)
        missing = False
        try:
            if previous is not None:
                chain = await self.store.chain(tenant, previous, self.max_chain)
                missing = not chain
                view.origin = chain[0].upstream if chain else None
                view.add_chain(chain)
            if wanted.reference_ids or wanted.call_ids:
                by_id, calls = await self.store.lookup(
                    tenant, wanted.reference_ids, wanted.call_ids, upstream=upstream
                )
                view.by_id.update(by_id)
                for call in calls:
                    view.add_emitted(call)
            # Only a recorded call may want its tool's schemas: a request whose calls were all
            # sent inline (a Chat body's, most) reads no tools of its own for it.
            if view.chain_calls or view.by_id:
                offered = (name for name, _ in items.declared_tools(body))
                if tools := view.tools_wanted(offered):
                    view.tools.update(await self.store.tools(tenant, sorted(tools)))
                    view.attach_tools()
        except LedgerFault as exc:
            self.fault("read", exc)
            if not self.fail_open:
                raise
            missing = True
            view.faulted = True
        # Only an unknown previous response is waived; a request that names none pairs inline.
        view.trust_unpaired = self.fail_open and missing and previous is not None
        return view

    async def history(self, tenant: str, response_id: str) -> list[Any] | None:
        """The whole conversation up to and with a recorded response, oldest item first: each
        response's input, then its output, from the first of its chain. None when it cannot be
        had whole: a response of it unknown, recorded without its whole items, or the chain
        longer than `max_chain`. Raises LedgerFault (logged and counted)."""
        try:
            chain = await self.store.chain(tenant, response_id, self.max_chain)
        except LedgerFault as exc:
            self.fault("read", exc)
            raise
        if not chain or chain[-1].previous_response_id is not None:
            return None
        found: list[Any] = []
        for recording in reversed(chain):
            if recording.whole is None:
                return None
            found += recording.whole
        return found

    async def record(
        self,
        tenant: str,
        response: Mapping[str, Any],
        context: Context | None = None,
        upstream: str | None = None,
    ) -> None:
        """Record a response `upstream` relayed to `tenant`, with the `context` of the request
        that created it; None when it is read again (`GET /v1/responses/{id}`): then the
        context recorded when it was created is kept."""
        recording = RecordedResponse.of(response, context or NO_CONTEXT, upstream)
        if recording is None:
            return
        try:
            if context is None:
                earlier = await self.store.chain(tenant, recording.response_id, 1)
                if earlier:
                    recording = recording.with_inputs_of(earlier[0])
            await self.store.put(tenant, recording, context.tools if context else ())
        except LedgerFault as exc:
            self.fault("write", exc)
            return
        self.stats.wrote()
