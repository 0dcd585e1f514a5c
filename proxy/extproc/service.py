"""The ExternalProcessor gRPC service: one Exchange per stream, sharing one Front."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc

from proxy.admission.routing import RouteCaches
from proxy.config import Config
from proxy.extproc.exchange import Exchange, Front
from proxy.settings import ConfigError
from proxy.state.audit import AuditLog
from proxy.state.ledger import Ledger
from proxy.state.metrics import Metrics
from proxy.state.stores import open_store

log = logging.getLogger("replay_proxy")


class Processor(ext_proc_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Envoy opens one stream per HTTP request; each message is answered in turn, and Envoy
    waits for each answer before it goes on (a body chunk is passed on only once answered)."""

    def __init__(self, front: Front) -> None:
        self.front = front

    async def Process(  # the gRPC method's own name
        self, request_iterator: AsyncIterable[Any], context: Any
    ) -> AsyncIterator[Any]:
        exchange = Exchange(self.front)
        async for message in request_iterator:
            yield await exchange.answer(message)


@contextlib.asynccontextmanager
async def open_front(config: Config) -> AsyncIterator[Front]:
    """The ledger, audit log, metrics and gate caches of one processor, as `serve` opens its
    own (the same settings), closed when the processor stops."""
    settings = config.audit
    try:
        audit_log = AuditLog(
            settings.path,
            include_arguments=settings.include_arguments,
            max_bytes=settings.max_bytes,
        )
    except OSError as exc:
        raise ConfigError(
            f"audit.path: cannot append to {settings.path!r}: {exc.strerror}"
        ) from None
    metrics = Metrics()
    store = open_store(config.ledger)
    ledger = Ledger(
        store,
        max_chain=config.ledger.max_chain,
        fail_open=config.ledger.fail_open,
        on_fault=lambda operation: metrics.ledger_faults.labels(operation).inc(),
    )
    try:
        yield Front(config, ledger, audit_log, metrics, RouteCaches(config))
    finally:
        await store.close()
        audit_log.close()


def add_to(server: Any, front: Front) -> None:
    """Serve the ExternalProcessor service on a `grpc.aio` server."""
    ext_proc_grpc.add_ExternalProcessorServicer_to_server(Processor(front), server)
