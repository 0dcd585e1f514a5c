"""`serve --workers 2` as real processes: a worker that cannot start fails alone, the slots
are reported in readiness and metrics, and each worker keeps its own audit chain on stdout."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.running.workers import free_port, retry_delay
from proxy.state.audit import verify
from proxy.state.workers import Missing, Slots, WorkerSlot, read_slots, write_slots
from tests.builders import failing_body
from tests.running.test_serve import REPO, Proxy, start, two_turns
from tests.server.checks import metric
from tests.servers.recording import RecordingUpstream
from tests.servers.redis_server import RedisServer

# How long a test waits for the supervisor to see a change (it looks every 0.2 s, a worker
# takes a second or two to start on a busy machine): a bound, never an expectation.
PATIENCE_S = 60


async def until(check: Callable[[], Awaitable[Any]], *, timeout_s: float = PATIENCE_S) -> Any:
    """The first truthy result of `check`, asked again every 0.1 s."""
    async with asyncio.timeout(timeout_s):
        while True:
            found = await check()
            if found:
                return found
            await asyncio.sleep(0.1)


async def get(url: str) -> tuple[int, Any]:
    """A GET on a connection of its own (so that it may land on either worker)."""
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        body = await response.read()
        is_json = response.content_type == "application/json"
        return response.status, json.loads(body) if is_json else body.decode()


def config_file(tmp_path: Path, upstream: str, redis: RedisServer, extra: str = "") -> Path:
    """A config for workers: they share a Redis ledger (a memory one is refused)."""
    path = tmp_path / "proxy.yaml"
    path.write_text(
        f"upstream: {{url: '{upstream}'}}\naudit: {{path: '{tmp_path / 'audit.jsonl'}'}}\n"
        f"ledger: {{backend: redis, url: '{redis.url}'}}\n{extra}"
    )
    return path


async def worker_pids(url: str, n: int) -> set[int]:
    """The pids of the workers behind `url`, once `n` of them have answered."""
    pids: set[int] = set()

    async def seen() -> bool:
        try:
            pids.add((await get(url + "/-/healthy"))[1]["pid"])
        except aiohttp.ClientConnectionError:  # not listening yet
            return False
        return len(pids) == n

    await until(seen)
    return pids


async def missing_gauge(base: str, value: float, times: int = 1) -> bool:
    """Whether `times` scrapes in a row (on connections of their own: either worker) read
    `value` as replay_proxy_workers_missing."""
    for _ in range(times):
        _, scraped = await get(base + "/-/metrics")
        if metric(scraped, "replay_proxy_workers_missing") != value:
            return False
    return True


def workers_check(body: Any) -> dict[str, Any]:
    [check] = [c for c in body["checks"] if c["name"] == "workers"]
    return dict(check)


async def test_a_worker_that_cannot_start_fails_alone_and_is_reported(
    recording_upstream: RecordingUpstream, tmp_path: Path, redis_server: RedisServer
) -> None:
    path = config_file(tmp_path, recording_upstream.url, redis_server)
    port = free_port("127.0.0.1")
    proxy = await start("--config", str(path), "--workers", "2", "--port", str(port), listeners=2)
    try:
        ready = await until(lambda: _ready_when(proxy.url, lambda b: workers_check(b)["ok"]))
        assert ready["status"] == "ready"
        assert workers_check(ready) == {
            "name": "workers", "ok": True, "detail": "2 of 2 slots serving", "required": True
        }  # fmt: skip
        pids = await worker_pids(proxy.url, 2)

        # A typo saved on disk, never loaded; then one worker dies.
        path.write_text(path.read_text() + "gate: {actons: {}}\n")
        dead = min(pids)
        os.kill(dead, signal.SIGKILL)

        body = await until(
            lambda: _ready_when(proxy.url, lambda b: "exited with 2" in workers_check(b)["detail"])
        )
        assert (body["status"], workers_check(body)["ok"]) == ("not_ready", False)
        detail = workers_check(body)["detail"]
        assert detail.startswith("1 of 2 slots missing: slot ")
        assert "exited with 2: " in detail
        assert "gate.actons: unknown key" in detail
        # The other worker serves on, whatever connection lands on it.
        (survivor,) = pids - {dead}
        for _ in range(5):
            status, healthy = await get(proxy.url + "/-/healthy")
            assert (status, healthy["pid"]) == (200, survivor)
        async with (
            aiohttp.ClientSession() as session,
            session.post(proxy.url + "/v1/responses", json={"input": "hi"}) as response,
        ):
            assert response.status == 200
        assert [r.target for r in recording_upstream.received] == ["/v1/responses"]
        assert await until(lambda: missing_gauge(proxy.url, 1))
        assert proxy.process.returncode is None

        # Fixed on disk and reloaded: the missing slot is tried again at once.
        path.write_text(path.read_text().replace("gate: {actons: {}}\n", ""))
        proxy.process.send_signal(signal.SIGHUP)
        body = await until(lambda: _ready_when(proxy.url, lambda b: workers_check(b)["ok"]))
        assert body["status"] == "ready"
        assert len(await worker_pids(proxy.url, 2)) == 2
        # Each worker's gauge follows the supervisor's view within a second.
        assert await until(lambda: missing_gauge(proxy.url, 0, times=4))
    finally:
        code = await proxy.stop()
    assert code == 0
    assert proxy.process.stderr is not None
    said = (await proxy.process.stderr.read()).decode()
    assert f"exited with -{signal.SIGKILL.value}" in said
    assert "exited with 2: " in said
    assert "the other workers go on, next try in 1 s" in said
    assert said.rstrip().splitlines()[-1].endswith("supervisor stopped, exit status 0")


async def _ready_when(base: str, wanted: Callable[[Any], bool]) -> Any:
    status, body = await get(base + "/-/ready")
    assert status in (200, 503), body
    return body if wanted(body) else None


def test_a_start_where_no_worker_can_listen_exits_2_naming_the_key(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    config = config_file(tmp_path, "http://127.0.0.1:9", redis_server)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["serve", "--config", str(config), "--workers", "2", "--port", str(port)]
        done = subprocess.run(
            [sys.executable, "-m", "proxy", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
    assert done.returncode == 2
    assert f"--port: cannot listen on 127.0.0.1:{port}: Address already in use" in done.stderr
    assert done.stderr.rstrip().splitlines()[-1].endswith("supervisor stopped, exit status 2")


async def test_workers_on_stdout_keep_a_chain_each_that_verifies(
    recording_upstream: RecordingUpstream, tmp_path: Path, redis_server: RedisServer
) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(
        f"upstream: {{url: '{recording_upstream.url}'}}\naudit: {{path: '-'}}\n"
        f"ledger: {{backend: redis, url: '{redis_server.url}'}}\n"
    )
    port = free_port("127.0.0.1")
    process = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "proxy", "serve", "--config", str(path)],
        *["--workers", "2", "--port", str(port)],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        cwd=REPO,
    )
    proxy = Proxy(process, f"http://127.0.0.1:{port}")
    assert process.stdout is not None
    lines: list[bytes] = []
    try:
        await worker_pids(proxy.url, 2)
        # Blocked requests, each on a connection of its own, until both workers wrote some.
        for _ in range(200):
            async with (
                aiohttp.ClientSession() as session,
                session.post(proxy.url + "/v1/responses", json=failing_body()) as response,
            ):
                assert response.status == 400
            # The record is flushed before the answer is sent.
            lines.append(await asyncio.wait_for(process.stdout.readline(), timeout=30))
            if len({json.loads(line)["chain"] for line in lines}) == 2:
                break
    finally:
        assert await proxy.stop() == 0
    lines += (await process.stdout.read()).splitlines(keepends=True)

    chains = {json.loads(line)["chain"] for line in lines}
    assert len(chains) == 2
    assert all(name.startswith(("w1-", "w2-")) for name in chains)
    done = verify(lines)
    assert (done.broken, done.records, set(done.chains)) == (None, len(lines), chains)
    assert recording_upstream.received == []


@pytest.mark.parametrize(
    ("failures", "delay"),
    [
        pytest.param(1, 1, id="first"),
        pytest.param(2, 2, id="second"),
        pytest.param(5, 16, id="fifth"),
        pytest.param(6, 30, id="capped"),
        pytest.param(100, 30, id="stays-capped"),
    ],
)
def test_retries_back_off_to_a_bound(failures: int, delay: float) -> None:
    assert retry_delay(failures) == delay


@pytest.mark.parametrize(
    "slots",
    [
        pytest.param(Slots(2), id="all-serving"),
        pytest.param(Slots(3, (Missing(2, "exited with 2: x"), Missing(3, "starting"))), id="two"),
    ],
)
def test_the_slots_file_reads_back_what_was_written(tmp_path: Path, slots: Slots) -> None:
    write_slots(str(tmp_path), slots)
    assert read_slots(str(tmp_path)) == slots
    assert [p.name for p in tmp_path.iterdir()] == ["workers.json"]  # nothing staged is left


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("[]", id="not-an-object"),
        pytest.param('{"workers": 2}', id="no-missing"),
        pytest.param('{"workers": 2, "missing": [{"slot": 1}]}', id="no-detail"),
    ],
)
def test_a_slots_file_that_is_not_one_is_a_value_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "workers.json").write_text(text)
    with pytest.raises(ValueError):  # noqa: PT011 - json's own errors and ours alike
        read_slots(str(tmp_path))


def test_a_worker_names_its_chain_by_slot_and_pid(tmp_path: Path) -> None:
    slot = WorkerSlot(str(tmp_path), 2)
    assert slot.chain == f"w2-{os.getpid()}"
    assert slot.stdout_lock == str(tmp_path / "stdout.lock")


def test_more_than_one_worker_with_the_memory_ledger_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--workers", "2", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 2
    assert done.stderr == (
        "replay-proxy: --workers 2: the memory ledger is each worker's own, so a follow-up turn "
        "(previous_response_id) landing on another worker than its first turn would miss it: "
        "set ledger.backend: redis\n"
    )


async def test_follow_ups_pass_through_two_workers_sharing_a_redis_ledger(
    scripted_upstream: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    path = config_file(tmp_path, scripted_upstream, redis_server)
    port = free_port("127.0.0.1")
    proxy = await start("--config", str(path), "--workers", "2", "--port", str(port), listeners=2)
    try:
        await worker_pids(proxy.url, 2)
        # Each turn on a client of its own: a connection of its own, on either worker.
        said = [await two_turns(proxy.url, proxy.url) for _ in range(20)]
    finally:
        assert await proxy.stop() == 0
    assert said == ["tool said: across processes"] * 20
    # Each worker's start said what it serves with (the last one's after its "listening on").
    assert proxy.process.stderr is not None
    rest = (await proxy.process.stderr.read()).decode()
    assert f"ledger redis redis://127.0.0.1:{redis_server.port}; " in rest
    assert "; 2 workers; TLS off" in rest
