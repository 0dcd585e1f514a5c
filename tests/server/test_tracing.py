"""Traces: a span per request with what it did, its `traceparent` sent upstream; collected with
the SDK's in-memory exporter. Without `tracing.enabled` (or without the extra) nothing changes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from proxy.running.config_file import parse_config
from proxy.server.app import make_app
from proxy.server.tracing import TRACING, Tracing
from tests.builders import CLEAN, FAILING, JSON_HEADERS
from tests.server.checks import eventually
from tests.servers.recording import RecordingUpstream

REPO = Path(__file__).resolve().parents[2]
# A client's own trace: the proxy's span is its child.
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"

Traced = Callable[[str], Awaitable[str]]


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
async def traced_proxy(tmp_path: Path, exporter: InMemorySpanExporter) -> AsyncIterator[Traced]:
    """A proxy with `tracing.enabled`, its spans kept in `exporter`."""
    servers: list[TestServer] = []

    async def start(upstream: str) -> str:
        config = parse_config(
            {
                "upstream": {"url": upstream},
                "audit": {"path": str(tmp_path / "audit.jsonl")},
                "tracing": {"enabled": True},
            }
        )
        app = make_app(config)
        app[TRACING] = Tracing(config.tracing, exporter)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return str(server.make_url("")).rstrip("/")

    yield start
    for server in servers:
        await server.close()


def parent_of(header: str) -> tuple[str, str]:
    """(trace id, parent span id) of a W3C `traceparent` value."""
    version, trace_id, span_id, _flags = header.split("-")
    assert version == "00"
    return trace_id, span_id


def the_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    [span] = exporter.get_finished_spans()
    return span


def hex_ids(span: ReadableSpan) -> tuple[str, str]:
    context = span.get_span_context()
    assert context is not None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


async def test_forwarded_request_span_and_its_traceparent_upstream(
    traced_proxy: Traced,
    recording_upstream: RecordingUpstream,
    client: aiohttp.ClientSession,
    exporter: InMemorySpanExporter,
) -> None:
    base = await traced_proxy(recording_upstream.url)
    async with client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS) as r:
        assert r.status == 200
        request_id = r.headers["x-request-id"]
        await r.read()

    span = the_span(exporter)
    [received] = recording_upstream.received
    assert parent_of(received.headers["traceparent"]) == hex_ids(span)
    assert span.parent is None  # the client sent no trace
    attributes = dict(span.attributes or {})
    assert attributes["replay_proxy.route"] == "responses"
    assert attributes["replay_proxy.outcome"] == "forward"
    assert attributes["replay_proxy.findings"] == 0
    assert attributes["replay_proxy.request_id"] == request_id
    assert attributes["http.response.status_code"] == 200
    assert attributes["url.path"] == "/v1/responses"
    assert span.name == "POST responses"  # the route: a path may name a response


async def test_blocked_request_span_counts_its_findings(
    traced_proxy: Traced,
    recording_upstream: RecordingUpstream,
    client: aiohttp.ClientSession,
    exporter: InMemorySpanExporter,
) -> None:
    base = await traced_proxy(recording_upstream.url)
    async with client.post(f"{base}/v1/responses", data=FAILING, headers=JSON_HEADERS) as r:
        assert r.status == 400

    attributes = dict(the_span(exporter).attributes or {})
    assert attributes["replay_proxy.outcome"] == "block"
    assert attributes["replay_proxy.code"] == "replay_rejected"
    assert attributes["replay_proxy.findings"] == 1
    assert attributes["replay_proxy.findings.block"] == 1
    assert recording_upstream.received == []


async def test_a_client_trace_is_the_span_parent(
    traced_proxy: Traced,
    recording_upstream: RecordingUpstream,
    client: aiohttp.ClientSession,
    exporter: InMemorySpanExporter,
) -> None:
    """The upstream sees the proxy's span as the parent, in the client's trace; the client's
    own `traceparent` does not go upstream beside it."""
    base = await traced_proxy(recording_upstream.url)
    headers = {"traceparent": CLIENT_PARENT, "tracestate": "vendor=1"}
    async with client.get(f"{base}/v1/models", headers=headers) as r:
        assert r.status == 200

    span = the_span(exporter)
    assert span.parent is not None
    assert f"{span.parent.span_id:016x}" == "00f067aa0ba902b7"
    [received] = recording_upstream.received
    assert received.headers.getall("traceparent") == [f"00-{CLIENT_TRACE}-{hex_ids(span)[1]}-01"]
    assert received.headers.getall("tracestate") == ["vendor=1"]
    assert dict(span.attributes or {})["replay_proxy.route"] == "passthrough"


async def test_websocket_upgrade_carries_the_traceparent(
    traced_proxy: Traced,
    recording_upstream: RecordingUpstream,
    client: aiohttp.ClientSession,
    exporter: InMemorySpanExporter,
) -> None:
    seen: list[str] = []
    handle = recording_upstream.websocket

    async def websocket(request: Any) -> Any:
        seen.append(request.headers["traceparent"])
        return await handle(request)

    recording_upstream.websocket = websocket  # type: ignore[method-assign]
    base = await traced_proxy(recording_upstream.url)
    frame = {"type": "response.create", **json.loads(CLEAN)}
    async with client.ws_connect(f"{base}/v1/responses") as ws:
        await ws.send_json(frame)
        assert (await ws.receive_json())["type"] == "response.completed"
        await ws.close()
    await eventually(lambda: bool(exporter.get_finished_spans()))  # when the handler ends
    span = the_span(exporter)
    assert [parent_of(header) for header in seen] == [hex_ids(span)]
    attributes = dict(span.attributes or {})
    assert attributes["replay_proxy.route"] == "websocket"
    assert attributes["replay_proxy.frames"] == 1


async def test_without_tracing_the_client_traceparent_passes_unchanged(
    start_proxy: Callable[..., Awaitable[str]],
    recording_upstream: RecordingUpstream,
    client: aiohttp.ClientSession,
) -> None:
    base = await start_proxy(recording_upstream.url)
    async with client.get(f"{base}/v1/models", headers={"traceparent": CLIENT_PARENT}) as r:
        assert r.status == 200
    assert recording_upstream.received[0].headers.getall("traceparent") == [CLIENT_PARENT]


# Runs the proxy with every `opentelemetry` import failing, as without the extra.
WITHOUT_OTEL = """
import asyncio, sys
from importlib.abc import MetaPathFinder


class NoOpenTelemetry(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


sys.meta_path.insert(0, NoOpenTelemetry())

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.running.config_file import parse_config
from proxy.server.app import make_app


async def main():
    upstream = web.Application()
    upstream.router.add_get("/v1/models", lambda request: web.json_response({"data": []}))
    upstream_server = TestServer(upstream, host="127.0.0.1")
    await upstream_server.start_server()
    config = parse_config({"upstream": {"url": str(upstream_server.make_url(""))},
                           "audit": {"path": sys.argv[1]}})
    proxy = TestServer(make_app(config), host="127.0.0.1")
    await proxy.start_server()
    async with aiohttp.ClientSession() as session:
        async with session.get(proxy.make_url("/v1/models")) as response:
            print(response.status)
    await proxy.close()
    await upstream_server.close()
    print(sorted(name for name in sys.modules if name.startswith("opentelemetry")))


asyncio.run(main())
"""


def test_the_proxy_serves_without_opentelemetry(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_OTEL, str(tmp_path / "audit.jsonl")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["200", "[]"]


def cli_without(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`replay-proxy ARGS` run in a process of its own, in which `module` does not import."""
    blocked = (
        f"import sys; sys.modules[{module!r}] = None; "
        "from proxy.running.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    return subprocess.run(
        [sys.executable, "-c", blocked, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )


def test_tracing_enabled_without_opentelemetry_names_the_extra(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("tracing:\n  enabled: true\n")
    done = cli_without("opentelemetry", "config", "check", str(config))
    assert done.returncode == 2
    assert done.stderr == (
        f"replay-proxy: {config}:2:3: tracing.enabled: traces need OpenTelemetry: "
        "pip install 'replay-proxy[otel]'\n"
    )


async def test_spans_reach_a_collector_at_tracing_endpoint(
    tmp_path: Path, recording_upstream: RecordingUpstream, client: aiohttp.ClientSession
) -> None:
    """`tracing.endpoint` as configured: the request's span is posted there over OTLP/HTTP
    (at the latest when the proxy stops)."""
    collector = RecordingUpstream()
    collector_app = web.Application()
    collector_app.router.add_route("*", "/{tail:.*}", collector.handle)
    collector_server = TestServer(collector_app, host="127.0.0.1")
    await collector_server.start_server()
    endpoint = str(collector_server.make_url("/v1/traces"))
    config = parse_config(
        {
            "upstream": {"url": recording_upstream.url},
            "audit": {"path": str(tmp_path / "audit.jsonl")},
            "tracing": {"enabled": True, "endpoint": endpoint, "service_name": "edge-proxy"},
        }
    )
    proxy = TestServer(make_app(config), host="127.0.0.1")
    await proxy.start_server()
    try:
        async with client.get(proxy.make_url("/v1/models")) as r:
            assert r.status == 200
        await proxy.close()  # the last batch is exported on the way out
        # (from a thread that may outlive the stop: the collector waits for it)
        await eventually(lambda: bool(collector.received))
    finally:
        await proxy.close()
        await collector_server.close()
    trace_id, _ = parent_of(recording_upstream.received[0].headers["traceparent"])
    [export] = collector.received
    assert export.method == "POST"
    assert export.target == "/v1/traces"
    assert export.headers["Content-Type"] == "application/x-protobuf"
    assert bytes.fromhex(trace_id) in export.body
    assert b"edge-proxy" in export.body


def test_an_exporter_that_does_not_load_stops_the_start_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        f"tracing:\n  enabled: true\naudit:\n  path: {tmp_path / 'audit.jsonl'}\n"
        "listen:\n  port: 0\n"
    )
    done = cli_without("opentelemetry.exporter", "serve", "--config", str(config))
    assert done.returncode == 2
    assert done.stderr.startswith(
        "replay-proxy: tracing.enabled: the OTLP exporter does not load: "
    ), done.stderr
    assert "Traceback" not in done.stderr
