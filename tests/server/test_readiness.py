"""`/-/ready`: each check as it holds or fails against real servers; admin endpoints and keys."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.config import Config
from proxy.running.workers import free_port
from proxy.server import readiness as readiness_module
from proxy.server.readiness import Check, Readiness
from proxy.settings import LedgerSettings, UpstreamSettings
from proxy.state.metrics import Metrics
from proxy.state.stores import MemoryStore
from proxy.state.workers import Missing, Slots, WorkerSlot, write_slots
from tests.builders import at
from tests.fixture_types import ProxyFactory
from tests.server.checks import metric, scrape
from tests.servers.recording import RecordingUpstream
from tests.servers.redis_server import RedisServer

# The network checks are cached for a few seconds: a change is seen once that has passed.
PATIENCE_S = 30


async def ready(client: aiohttp.ClientSession, base: str) -> tuple[int, dict[str, Any]]:
    async with client.get(at(base, "/-/ready")) as resp:
        return resp.status, await resp.json()


def check_named(body: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [c for c in body["checks"] if c["name"] == name]
    return dict(found)


async def gauges(client: aiohttp.ClientSession, base: str, *checks: str) -> list[float | None]:
    """The readiness gauge and each named check's gauge, as a scrape reads them."""
    text = await scrape(client, base)
    return [metric(text, "replay_proxy_ready")] + [
        metric(text, "replay_proxy_ready_check", check=name) for name in checks
    ]


async def ready_until(
    client: aiohttp.ClientSession, base: str, wanted: Callable[[dict[str, Any]], bool]
) -> tuple[int, dict[str, Any]]:
    """The first readiness answer that `wanted` accepts, within PATIENCE_S."""
    for _ in range(int(PATIENCE_S / 0.1)):
        status, body = await ready(client, base)
        if wanted(body):
            return status, body
        await asyncio.sleep(0.1)
    raise AssertionError(f"readiness never turned: {body}")


async def test_ready_names_every_check_and_sends_the_upstream_nothing(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    base = await start_proxy(recording_upstream.url)
    port = recording_upstream.url.rsplit(":", 1)[1]

    assert await ready(client, base) == (
        200,
        {
            "status": "ready",
            "checks": [
                {"name": "draining", "ok": True, "detail": "serving", "required": True},
                {
                    "name": "upstream:default",
                    "ok": True,
                    "detail": f"connected to 127.0.0.1:{port}",
                    "required": True,
                },
                {
                    "name": "ledger",
                    "ok": True,
                    "detail": "memory: in this process",
                    "required": False,
                },
            ],
        },
    )
    assert recording_upstream.received == []


async def test_ready_is_503_once_the_upstream_port_closes_and_healthy_stays_200(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    upstream = RecordingUpstream()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", upstream.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    port = server.port
    base = await start_proxy(f"http://127.0.0.1:{port}")
    try:
        assert (await ready(client, base))[0] == 200
        assert await gauges(client, base, "draining", "upstream:default") == [1, 1, 1]
    finally:
        await server.close()

    status, body = await ready_until(
        client, base, lambda b: not check_named(b, "upstream:default")["ok"]
    )

    assert (status, body["status"]) == (503, "not_ready")
    # The scrape's own checks find the port closed too.
    assert await gauges(client, base, "draining", "upstream:default") == [0, 1, 0]
    assert check_named(body, "upstream:default")["detail"] == (
        f"cannot connect to 127.0.0.1:{port}: Connection refused"
    )
    assert check_named(body, "draining")["ok"]
    async with client.get(at(base, "/-/healthy")) as resp:
        assert resp.status == 200


async def test_an_upstream_that_never_listened_is_not_ready_at_the_first_probe(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    port = free_port("127.0.0.1")
    base = await start_proxy(f"http://127.0.0.1:{port}")
    status, body = await ready(client, base)
    assert (status, check_named(body, "upstream:default")["ok"]) == (503, False)


async def test_an_mcp_server_that_takes_no_connection_is_not_ready(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    port = free_port("127.0.0.1")
    servers = {"tools": {"url": f"http://127.0.0.1:{port}/mcp"}}
    base = await start_proxy(recording_upstream.url, mcp={"servers": servers})
    status, body = await ready(client, base)
    assert [c["name"] for c in body["checks"]] == [
        "draining",
        "upstream:default",
        "upstream:mcp:tools",
        "ledger",
    ]
    assert (status, check_named(body, "upstream:mcp:tools")["ok"]) == (503, False)
    assert check_named(body, "upstream:default")["ok"] is True


async def test_a_scrape_checks_readiness_where_nothing_probes_it(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """A Prometheus alone sees readiness: the scrape runs the checks `/-/ready` runs."""
    port = free_port("127.0.0.1")
    base = await start_proxy(f"http://127.0.0.1:{port}")

    assert await gauges(client, base, "upstream:default", "ledger") == [0, 0, 1]
    assert (await ready(client, base))[0] == 503


@pytest.mark.parametrize(
    ("readiness", "fail_open", "ok", "status"),
    [
        pytest.param({}, False, False, 200, id="reported-by-default"),
        pytest.param({"ledger": "required"}, False, False, 503, id="required"),
        pytest.param({"ledger": "required"}, True, True, 200, id="required-but-fails-open"),
    ],
)
async def test_a_redis_ledger_that_stops_is_reported_and_only_required_turns_ready_503(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
    readiness: dict[str, str],
    fail_open: bool,
    ok: bool,
    status: int,
) -> None:
    """Every replica shares one Redis: were it required by default, all of them would leave
    the Service at once, though first turns still work."""
    ledger = {"backend": "redis", "url": redis_server.url, "fail_open": fail_open}
    base = await start_proxy(recording_upstream.url, ledger=ledger, readiness=readiness)
    where = f"redis at 127.0.0.1:{redis_server.port}"
    required = readiness.get("ledger") == "required"
    answered, body = await ready(client, base)
    assert (answered, check_named(body, "ledger")) == (
        200,
        {"name": "ledger", "ok": True, "detail": f"{where} answers", "required": required},
    )
    assert await gauges(client, base, "ledger") == [1, 1]

    redis_server.stop()  # by its pid
    answered, body = await ready_until(
        client, base, lambda b: "is down" in check_named(b, "ledger")["detail"]
    )

    assert (answered, body["status"]) == (status, "ready" if status == 200 else "not_ready")
    assert check_named(body, "ledger")["ok"] is ok
    assert check_named(body, "ledger")["detail"].startswith(f"{where} is down")
    # The gauge says what /-/ready says: a ledger only reported leaves the process ready.
    assert await gauges(client, base, "ledger") == [1 if status == 200 else 0, 1 if ok else 0]
    assert check_named(body, "upstream:default")["ok"]
    # First turns still work while the ledger is down.
    async with client.post(at(base, "/v1/responses"), json={"model": "m", "input": "hi"}) as resp:
        assert resp.status == 200
    assert len(recording_upstream.received) == 1


KEY = "rp-admin-check-0123"
CLIENTS = [{"name": "ops", "key_sha256": hashlib.sha256(KEY.encode()).hexdigest()}]


@pytest.mark.parametrize("path", ["/-/healthy", "/-/ready", "/-/metrics"])
@pytest.mark.parametrize(
    ("headers", "status"),
    [
        pytest.param({}, 401, id="no-key"),
        pytest.param({"Authorization": "Bearer rp-other"}, 401, id="unknown-key"),
        pytest.param({"Authorization": f"Bearer {KEY}"}, 200, id="a-client-key"),
    ],
)
async def test_admin_endpoints_want_a_client_key_when_clients_are_listed(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    path: str,
    headers: dict[str, str],
    status: int,
) -> None:
    base = await start_proxy(recording_upstream.url, clients=CLIENTS)
    async with client.get(at(base, path), headers=headers) as resp:
        assert resp.status == status
        if status == 401:
            assert (await resp.json())["error"]["code"] == "invalid_api_key"
    assert recording_upstream.received == []


def readiness(tmp_path: Path) -> Readiness:
    return Readiness(LedgerSettings(), Metrics(), WorkerSlot(str(tmp_path), 1))


@pytest.mark.parametrize(
    ("slots", "expected", "missing"),
    [
        pytest.param(None, None, None, id="no-supervisor-view"),
        pytest.param(Slots(2), Check("workers", True, "2 of 2 slots serving"), 0, id="all"),
        pytest.param(
            Slots(2, (Missing(2, "exited with 2: proxy.yaml: gate.actons: unknown key"),)),
            Check(
                "workers",
                False,
                "1 of 2 slots missing: slot 2: exited with 2: proxy.yaml: gate.actons: unknown key",
            ),
            1,
            id="one-missing",
        ),
        pytest.param(
            Slots(3, (Missing(1, "starting (pid 7)"), Missing(3, "exited with -9"))),
            Check(
                "workers",
                False,
                "2 of 3 slots missing: slot 1: starting (pid 7); slot 3: exited with -9",
            ),
            2,
            id="two-missing",
        ),
    ],
)
def test_the_workers_check_reads_the_supervisors_view(
    tmp_path: Path, slots: Slots | None, expected: Check | None, missing: int | None
) -> None:
    if slots is not None:
        write_slots(str(tmp_path), slots)
    checked = readiness(tmp_path)

    found = checked.workers()

    assert found is not None
    if expected is None:
        assert (found.name, found.ok) == ("workers", False)
        assert found.detail.startswith("the supervisor's view cannot be read: ")
    else:
        assert found == expected
    gauge = metric(checked.metrics.render().decode(), "replay_proxy_workers_missing")
    assert gauge == (0 if missing is None else missing)


async def test_the_upstreams_are_probed_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The first upstream's probe answers only once the last one's has begun: probed one after
    # the other, the first would wait forever.
    names = ["a", "b", "c"]
    begun = {name: asyncio.Event() for name in names}

    async def probe(upstream: UpstreamSettings) -> Check:
        name = upstream.url.split("//")[1].split(".")[0]
        begun[name].set()
        if name == "a":
            await begun["c"].wait()
        return Check("", True, name)

    monkeypatch.setattr(readiness_module, "_connect", probe)
    config = Config(upstreams={n: UpstreamSettings(url=f"http://{n}.test") for n in names})

    checks = await asyncio.wait_for(
        Readiness(LedgerSettings(), Metrics(), None).checks(
            config, MemoryStore(max_responses=1, ttl_s=1)
        ),
        30,
    )

    assert [(c.name, c.detail) for c in checks[1:4]] == [(f"upstream:{n}", n) for n in names]


def test_one_process_has_no_workers_check() -> None:
    assert Readiness(LedgerSettings(), Metrics(), None).workers() is None
