"""`serve --workers 2`: a scrape of any worker describes the whole service."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from proxy.running.workers import free_port
from tests.builders import clean_body
from tests.running.test_serve import redis_config, start
from tests.server.checks import metric
from tests.server.test_metrics_page import page_metrics, scraped_metrics
from tests.servers.recording import RecordingUpstream
from tests.servers.redis_server import RedisServer

REQUESTS = "replay_proxy_requests_total"


def one_connection() -> aiohttp.ClientSession:
    """A session on one keep-alive connection: every request on it reaches the same worker."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))


def started_at(pid: int) -> float:
    """When a process started, since the epoch, read as prometheus-client's collector does."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        parts = stat.read().split(b")")[-1].split()
    with open("/proc/stat", "rb") as system:
        [btime] = [line.split()[1] for line in system if line.startswith(b"btime ")]
    return float(parts[19]) / os.sysconf("SC_CLK_TCK") + float(btime)


async def pid_of(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url + "/-/healthy") as response:
        pid: int = (await response.json())["pid"]
        return pid


async def test_every_scrape_of_either_worker_reads_the_whole_service(
    recording_upstream: RecordingUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    redis_server: RedisServer,
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # where the supervisor makes the metrics directory
    port = free_port("127.0.0.1")
    args = ["--config", redis_config(tmp_path, redis_server), "--upstream", recording_upstream.url]
    args += ["--workers", "2", "--port", str(port)]
    proxy = await start(*args, listeners=2)
    try:
        # Requests on connections whose worker is known, until both workers took some.
        sent: Counter[int] = Counter()
        for _ in range(100):
            async with one_connection() as session:
                pid = await pid_of(session, proxy.url)
                for _ in range(3):
                    async with session.post(proxy.url + "/v1/responses", json=clean_body()) as r:
                        assert r.status == 200
                sent[pid] += 3
            if len(sent) == 2:
                break
        assert len(sent) == 2, sent
        total = sum(sent.values())

        # Scrapes of each worker, several times each.
        scrapes: dict[int, list[str]] = {}
        for _ in range(200):
            async with one_connection() as session:
                pid = await pid_of(session, proxy.url)
                async with session.get(proxy.url + "/-/metrics") as response:
                    scrapes.setdefault(pid, []).append(await response.text())
            if len(scrapes) == 2 and min(len(texts) for texts in scrapes.values()) >= 3:
                break
        assert set(scrapes) == set(sent)
        texts = [text for texts in scrapes.values() for text in texts]

        forwarded = {
            "route": "responses",
            "outcome": "forward",
            "upstream": "default",
            "dialect": "responses",
        }
        assert {metric(t, REQUESTS, **forwarded) for t in texts} == {total}
        assert {metric(t, "replay_proxy_gate_seconds_count") for t in texts} == {total}
        upstream = {"upstream": "default", "route": "responses", "status": "200"}
        assert {metric(t, "replay_proxy_upstream_answers_total", **upstream) for t in texts} == {
            total
        }
        # Gauges add up the workers alive: no stream open anywhere. The ledger they share is
        # read once, not summed: it holds the one response the upstream names.
        assert {metric(t, "replay_proxy_open_streams") for t in texts} == {0}
        assert {metric(t, "replay_proxy_ledger_responses") for t in texts} == {1}
        assert all(t.count("replay_proxy_build_info{") == 1 for t in texts)
        # Readiness is each worker's newest reading, not their sum: the scraped worker has just
        # checked the upstream and the Redis they share.
        assert all(t.count("\nreplay_proxy_ready ") == 1 for t in texts)
        assert {metric(t, "replay_proxy_ready") for t in texts} <= {0, 1}
        for check in ("upstream:default", "ledger"):
            assert {metric(t, "replay_proxy_ready_check", check=check) for t in texts} == {1}
        assert "_created" not in "".join(texts)
        # The process figures are the service's: its start is the first worker's, whichever
        # worker is scraped (each wrote its own when it started).
        first = min(started_at(pid) for pid in sent)
        assert {metric(t, "process_start_time_seconds") for t in texts} == {first}
        # Every family docs/metrics.md lists, and no other, with its type (those with no sample yet,
        # a label set never used, have no file to be read from).
        table = {name: kind for name, (kind, _) in page_metrics().items()}
        for text in texts:
            shown = {name: kind for name, (kind, _) in scraped_metrics(text).items()}
            assert shown.items() <= table.items()
            assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= set(shown)
            assert {"python_info", "python_gc_collections_total"} <= set(shown)
        assert len(recording_upstream.received) == total

        # In the directory the supervisor shares with its workers (their slots are there too).
        [shared] = temp.iterdir()
        [directory] = shared.glob("replay-proxy-metrics-*")
        assert any(directory.glob("counter_*.db"))
    finally:
        assert await proxy.stop() == 0
    assert list(temp.iterdir()) == []  # the supervisor removed its directory


def test_a_metrics_directory_that_is_not_one_stops_the_start(tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--port", "0"],
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(missing)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"replay-proxy: PROMETHEUS_MULTIPROC_DIR: '{missing}' is not a directory"
    ]
