"""The metrics a scrape shows, on real servers: gate time from the body's arrival, upstream
answers by status, the ledger's writes and size, reloads, audit write failures, build info."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.running.config_file import parse_config
from proxy.running.workers import free_port
from proxy.server.app import make_app
from proxy.server.keys import IN_FORCE
from proxy.settings import ConfigError
from proxy.state.metrics import package_version
from tests.builders import (
    DEADLINE_S,
    HANG_GUARD_S,
    JSON_HEADERS,
    at,
    clean_body,
    compact,
    failing_body,
)
from tests.fixture_types import ProxyFactory
from tests.server.checks import metric, scrape
from tests.servers.recording import Received, RecordingUpstream
from tests.servers.redis_server import RedisServer


async def test_gate_time_starts_when_the_body_has_arrived(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """The client's upload is not the gate's time: the gate's time is no longer than from the
    body's last byte leaving the client to the answer arriving (the proxy runs in this process,
    on the same clock), however long the client took before that byte."""
    base = await start_proxy(recording_upstream.url)
    whole = compact(clean_body())
    last_sent = 0.0

    async def slow_upload() -> AsyncIterator[bytes]:
        nonlocal last_sent
        yield whole[:10]
        await asyncio.sleep(0.3)  # the client is slow; nothing asserts how slow
        last_sent = time.perf_counter()
        yield whole[10:]

    async with client.post(
        at(base, "/v1/responses"), data=slow_upload(), headers=JSON_HEADERS
    ) as resp:
        assert resp.status == 200
        await resp.read()
    answered = time.perf_counter()

    text = await scrape(client, base)
    assert metric(text, "replay_proxy_gate_seconds_count") == 1
    gate_s = metric(text, "replay_proxy_gate_seconds_sum")
    assert gate_s is not None
    assert 0 < gate_s <= answered - last_sent
    assert [r.body for r in recording_upstream.received] == [whole]


async def _not_found(request: web.Request, received: Received) -> web.StreamResponse:
    return web.json_response({"error": {"message": "no such model"}}, status=404)


async def _hangs(request: web.Request, received: Received) -> web.StreamResponse:
    await asyncio.sleep(HANG_GUARD_S)
    raise AssertionError("the proxy's read deadline should have ended this request")


@dataclass(frozen=True)
class UpstreamCase:
    upstream: str  # "recording" or "closed" (a port nothing listens on)
    method: str
    target: str
    body: Any
    route: str
    status: str  # the label
    answered: int  # what the client got
    handler: Any = None


UPSTREAM_CASES = [
    pytest.param(
        UpstreamCase("recording", "POST", "/v1/responses", clean_body(), "responses", "200", 200),
        id="gated-200",
    ),
    pytest.param(
        UpstreamCase(
            "recording", "GET", "/v1/models/x", None, "passthrough", "404", 404, _not_found
        ),
        id="passthrough-404",
    ),
    pytest.param(
        UpstreamCase(
            "closed", "POST", "/v1/responses", clean_body(), "responses", "unreachable", 502
        ),
        id="unreachable",
    ),
    pytest.param(
        UpstreamCase(
            "recording",
            "POST",
            "/v1/responses/compact",
            clean_body(),
            "responses_compact",
            "timeout",
            504,
            _hangs,
        ),
        id="timeout",
    ),
]


@pytest.mark.parametrize("case", UPSTREAM_CASES)
async def test_upstream_answers_by_upstream_route_and_status(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    case: UpstreamCase,
) -> None:
    if case.handler is not None:
        recording_upstream.handler = case.handler
    url = recording_upstream.url
    if case.upstream == "closed":
        url = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    base = await start_proxy(url, upstream={"read_timeout_s": DEADLINE_S})

    async with client.request(case.method, at(base, case.target), json=case.body) as resp:
        assert resp.status == case.answered

    text = await scrape(client, base)
    labels = {"upstream": "default", "route": case.route}
    assert metric(text, "replay_proxy_upstream_answers_total", **labels, status=case.status) == 1
    assert metric(text, "replay_proxy_upstream_seconds_count", **labels) == 1
    # Nothing else was sent upstream, and nothing counted twice.
    answers = [
        line
        for line in text.splitlines()
        if line.startswith("replay_proxy_upstream_answers_total{")
    ]
    assert len(answers) == 1


def _numbered(ids: list[str]) -> Any:
    """An upstream handler that answers each request with the next of `ids` as its response."""

    async def answer(request: web.Request, received: Received) -> web.StreamResponse:
        return web.json_response({"object": "response", "id": ids.pop(0), "output": []})

    return answer


async def test_ledger_counts_writes_and_holds_responses(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """Three responses recorded, one of them twice: three writes, two held."""
    recording_upstream.handler = _numbered(["resp_a", "resp_b", "resp_a"])
    base = await start_proxy(recording_upstream.url)
    for _ in range(3):
        async with client.post(at(base, "/v1/responses"), json=clean_body()) as resp:
            assert resp.status == 200

    text = await scrape(client, base)
    assert metric(text, "replay_proxy_ledger_writes_total") == 3
    assert metric(text, "replay_proxy_ledger_responses") == 2


async def test_a_redis_ledger_size_is_what_redis_holds(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    """Two proxies on one Redis: the one that wrote nothing still sees what the store holds."""
    recording_upstream.handler = _numbered(["resp_a", "resp_b", "resp_a"])
    ledger = {"backend": "redis", "url": redis_server.url}
    writer = await start_proxy(recording_upstream.url, ledger=ledger)
    reader = await start_proxy(recording_upstream.url, ledger=ledger)
    for _ in range(3):
        async with client.post(at(writer, "/v1/responses"), json=clean_body()) as resp:
            assert resp.status == 200

    wrote, read = await scrape(client, writer), await scrape(client, reader)
    assert metric(wrote, "replay_proxy_ledger_writes_total") == 3
    assert metric(read, "replay_proxy_ledger_writes_total") == 0
    assert metric(wrote, "replay_proxy_ledger_responses") == 2
    assert metric(read, "replay_proxy_ledger_responses") == 2


async def test_a_redis_ledger_down_counts_a_fault_and_the_scrape_still_answers(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    base = await start_proxy(
        recording_upstream.url, ledger={"backend": "redis", "url": redis_server.url}
    )
    redis_server.stop()

    text = await scrape(client, base)

    assert metric(text, "replay_proxy_ledger_faults_total", operation="size") == 1


@pytest.fixture
async def served_app(tmp_path: Path) -> AsyncIterator[tuple[web.Application, str]]:
    config = parse_config(
        {"upstream": {"url": "http://127.0.0.1:9"}, "audit": {"path": str(tmp_path / "a.jsonl")}}
    )
    app = make_app(config)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield app, str(server.make_url("")).rstrip("/")
    await server.close()


async def test_reloads_are_counted_applied_or_rejected(
    served_app: tuple[web.Application, str], client: aiohttp.ClientSession
) -> None:
    app, base = served_app
    config = app[IN_FORCE].current.config

    def broken() -> Any:
        raise ConfigError("gate.actons: unknown key")

    assert await app[IN_FORCE].reload(lambda: config)
    assert await app[IN_FORCE].reload(lambda: config)
    assert not await app[IN_FORCE].reload(broken)

    text = await scrape(client, base)
    assert metric(text, "replay_proxy_config_reloads_total", result="applied") == 2
    assert metric(text, "replay_proxy_config_reloads_total", result="rejected") == 1


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
async def test_an_audit_record_not_written_is_counted_and_nothing_goes_upstream(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """/dev/full takes no write (ENOSPC): a request with findings is not forwarded unrecorded."""
    base = await start_proxy(
        recording_upstream.url, audit={"path": "/dev/full"}, gate={"action": "log"}
    )

    failing, clean = compact(failing_body()), compact(clean_body())
    async with client.post(at(base, "/v1/responses"), data=failing, headers=JSON_HEADERS) as resp:
        assert resp.status == 500
        error = (await resp.json())["error"]
    async with client.post(at(base, "/v1/responses"), data=clean, headers=JSON_HEADERS) as resp:
        assert resp.status == 200  # a request with nothing to audit goes on

    assert (error["type"], error["code"]) == ("server_error", "internal_error")
    text = await scrape(client, base)
    assert metric(text, "replay_proxy_audit_write_failures_total") == 1
    assert [r.body for r in recording_upstream.received] == [clean]


async def test_build_info_and_the_process_and_python_collectors(
    served_app: tuple[web.Application, str], client: aiohttp.ClientSession
) -> None:
    _, base = served_app
    text = await scrape(client, base)

    [info] = [line for line in text.splitlines() if line.startswith("replay_proxy_build_info{")]
    assert f'version="{package_version()}"' in info
    assert info.endswith(" 1.0")
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"):
        assert f"# TYPE {name} " in text


@pytest.mark.parametrize(
    ("target", "route"),
    [
        pytest.param("/v1/responses", "websocket", id="gated"),
        pytest.param("/v1/realtime", "passthrough", id="passthrough"),
    ],
)
async def test_a_websocket_upgrade_is_an_upstream_answer(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    target: str,
    route: str,
) -> None:
    base = await start_proxy(recording_upstream.url)
    async with client.ws_connect(base + target) as ws:
        await ws.close()

    text = await scrape(client, base)
    labels = {"upstream": "default", "route": route}
    assert metric(text, "replay_proxy_upstream_answers_total", **labels, status="101") == 1
    assert metric(text, "replay_proxy_upstream_seconds_count", **labels) == 1
    assert recording_upstream.upgrades == 1
