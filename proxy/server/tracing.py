"""Traces (the `otel` extra): a span per request, its W3C `traceparent` sent upstream.

OpenTelemetry is imported only when `tracing.enabled` is set: the proxy runs without it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from aiohttp import web
from multidict import CIMultiDict

from proxy.settings import ConfigError, TracingSettings

log = logging.getLogger("replay_proxy")

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import Span
    from opentelemetry.sdk.trace.export import SpanExporter

    from proxy.admission.access import Access


class Tracing:
    """A tracer provider of the proxy's own (the process's global one is left alone), its spans
    exported over OTLP/HTTP, or to `exporter` as they end (a test's in-memory one)."""

    def __init__(self, settings: TracingSettings, exporter: SpanExporter | None = None) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        resource = Resource.create({"service.name": settings.service_name})
        self._provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        if exporter is None:
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
            except ImportError as exc:  # not installed, or its generated code overwritten
                raise ConfigError(
                    f"tracing.enabled: the OTLP exporter does not load: {exc} (pip install "
                    "'replay-proxy[otel]'; when it is installed, another package overwrote its "
                    "generated modules: pip install --force-reinstall opentelemetry-proto)"
                ) from None
            # Exported from a thread of the SDK's, in batches: never on the event loop.
            processor: Any = BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.endpoint))
        else:
            processor = SimpleSpanProcessor(exporter)
        self._provider.add_span_processor(processor)
        self._tracer = self._provider.get_tracer("replay_proxy")
        self._propagator = TraceContextTextMapPropagator()
        self._server = SpanKind.SERVER

    @contextmanager
    def span(self, request: web.Request, access: Access) -> Iterator[Span]:
        """The request's span, current while it is handled; a client's `traceparent` is its
        parent. Its attributes are set from `access` when the request is done."""
        parent = self._propagator.extract(request.headers)
        with self._tracer.start_as_current_span(
            request.method,  # named for its route once known: a path may name a response
            context=parent,
            kind=self._server,
            attributes={"http.request.method": request.method, "url.path": access.path},
            # A client that hangs up cancels its handler: not an error of the proxy's.
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span  # type: ignore[misc]  # the SDK's tracer makes SDK spans

    def describe(self, span: Span, access: Access) -> None:
        """The span's attributes: what the request did (no header, query or body value)."""
        fields = access.fields()
        attributes: dict[str, str | int | float] = {
            "replay_proxy.request_id": access.request_id,
            "replay_proxy.findings": fields["findings"],
        }
        for name in ("route", "outcome", "code", "tenant", "upstream", "frames", "gate_ms"):
            if name in fields:
                attributes[f"replay_proxy.{name}"] = fields[name]
        for action, count in access.findings.items():
            attributes[f"replay_proxy.findings.{action}"] = count
        if access.status is not None:
            attributes["http.response.status_code"] = access.status
        span.set_attributes(attributes)
        if access.route is not None:
            span.update_name(f"{access.method} {access.route}")
        if access.status is not None and access.status >= 500:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, access.code))

    def inject(self, headers: CIMultiDict[str]) -> None:
        """The current span's `traceparent` (and `tracestate`) into the upstream's headers, in
        place of any the client sent."""
        for name in ("traceparent", "tracestate"):
            headers.popall(name, None)
        self._propagator.inject(headers)

    async def close(self) -> None:
        """Export what is left, for at most `CLOSE_S`: a collector that cannot be reached must
        not hold the stop (the exporter retries for its whole timeout, 10 s by default).

        The SDK's shutdown runs in a daemon thread of its own, left behind if it takes longer
        (the loop's executor would be waited for at exit)."""
        ending = threading.Thread(
            target=self._provider.shutdown, name="replay-proxy-traces", daemon=True
        )
        ending.start()
        await asyncio.to_thread(ending.join, CLOSE_S)
        if ending.is_alive():
            log.warning("traces: the last spans were not exported within %g s", CLOSE_S)


TRACING = web.AppKey("tracing", Tracing)
# How long a stop waits for the last spans to be exported (docs/configuration.md, "Stopping").
CLOSE_S = 1.0
