"""The ExternalProcessor gRPC service: one ExtprocStream per stream, sharing one Front."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc

from proxy.admission.routing import RouteCaches
from proxy.admission.services import open_services
from proxy.config import Config
from proxy.extproc.exchange import ExtprocStream, Front
from proxy.state.metrics import Metrics

log = logging.getLogger("replay_proxy")


class Processor(ext_proc_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Envoy opens one stream per HTTP request; each message is answered in turn, and Envoy
    waits for each answer before it goes on (a body chunk is passed on only once answered)."""

    def __init__(self, front: Front) -> None:
        self.front = front

    async def Process(  # the gRPC method's own name
        self, request_iterator: AsyncIterable[Any], context: Any
    ) -> AsyncIterator[Any]:
        exchange = ExtprocStream(self.front)
        try:
            async for message in request_iterator:
                yield await exchange.answer(message)
        finally:
            exchange.close()


@contextlib.asynccontextmanager
async def open_front(config: Config, metrics_dir: str | None = None) -> AsyncIterator[Front]:
    """The ledger, audit log, metrics, door 2's checks and gate caches of one processor, as
    `serve` opens its own (the same settings and functions), closed when the processor stops.
    `metrics_dir` is a multiprocess directory its counters are written to (see `Metrics`)."""
    metrics = Metrics(
        body_timeout_s=config.limits.body_timeout_s,
        shared_ledger=config.ledger.backend == "redis",
        multiprocess_dir=metrics_dir,
    )
    async with open_services(config.audit, config.ledger, metrics) as services:
        yield Front(config, services, RouteCaches(config))


def add_to(server: Any, front: Front) -> None:
    """Serve the ExternalProcessor service on a `grpc.aio` server."""
    ext_proc_grpc.add_ExternalProcessorServicer_to_server(Processor(front), server)
