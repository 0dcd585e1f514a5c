"""`replay-proxy serve` as a real process: start, config errors, graceful stop on SIGTERM."""

from __future__ import annotations

import asyncio
import platform
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from proxy.running.config_file import parse_config
from proxy.running.serving import give_back_free_memory, trim_heap_every
from proxy.running.workers import free_port
from proxy.server.in_force import InForceHolder
from tests.builders import SALES_TOOL, sales_call, sales_output
from tests.servers.recording import RecordingUpstream, held_stream
from tests.servers.redis_server import RedisServer

REPO = Path(__file__).resolve().parents[2]


class Proxy:
    """A `replay-proxy serve` process; `url` once it has said where it listens."""

    def __init__(self, process: asyncio.subprocess.Process, url: str) -> None:
        self.process = process
        self.url = url
        self.signalled = False

    def terminate(self) -> None:
        """SIGTERM, once: a second one while the process exits could land after its handler."""
        if not self.signalled and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        self.signalled = True

    async def stop(self) -> int:
        self.terminate()
        return await asyncio.wait_for(self.process.wait(), timeout=30)


async def start(
    *args: str, listeners: int = 1, port: str | None = "0", env: dict[str, str] | None = None
) -> Proxy:
    """Start `replay-proxy serve` (on `--port port`, unless None) and return once `listeners`
    processes (one per worker) have said where they listen."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "serve",
        *(["--port", port] if port is not None else []),
        *args,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
        env=env,
    )
    assert process.stderr is not None
    seen = []
    urls: list[str] = []
    while len(urls) < listeners:
        line = (await asyncio.wait_for(process.stderr.readline(), timeout=30)).decode()
        seen.append(line)
        if not line:
            raise AssertionError("the proxy exited before listening: " + "".join(seen))
        found = re.search(r"listening on (https?://\S+),", line)
        if found:
            urls.append(found.group(1))
    return Proxy(process, urls[0])


@pytest.fixture
async def served(recording_upstream: RecordingUpstream) -> AsyncIterator[Proxy]:
    proxy = await start("--upstream", recording_upstream.url)
    yield proxy
    await proxy.stop()


async def test_serve_forwards_and_stops_cleanly_on_sigterm(
    served: Proxy, recording_upstream: RecordingUpstream
) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(served.url + "/-/healthy") as response:
            assert response.status == 200
        async with session.post(served.url + "/v1/responses", json={"input": "hi"}) as response:
            assert response.status == 200

    assert [r.target for r in recording_upstream.received] == ["/v1/responses"]
    assert await served.stop() == 0


async def test_sigterm_lets_a_stream_in_flight_finish(
    served: Proxy, recording_upstream: RecordingUpstream
) -> None:
    release = asyncio.Event()

    recording_upstream.handler = held_stream(release, b"data: two\n\ndata: [DONE]\n\n")
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            served.url + "/v1/responses", json={"input": "hi", "stream": True}
        ) as response,
    ):
        assert await response.content.readline() == b"data: one\n"
        served.terminate()

        # The proxy stops accepting: a new connection is refused while the stream goes on.
        async def refused() -> None:
            while True:
                try:
                    async with (
                        aiohttp.ClientSession() as other,
                        other.get(served.url + "/-/healthy"),
                    ):
                        await asyncio.sleep(0.05)
                except aiohttp.ClientConnectionError:
                    return

        await asyncio.wait_for(refused(), timeout=20)
        release.set()
        rest = await asyncio.wait_for(response.content.read(), timeout=20)
    assert rest == b"\ndata: two\n\ndata: [DONE]\n\n"
    assert await served.stop() == 0


@pytest.mark.parametrize(
    ("config", "message"),
    [
        pytest.param("gate:\n  actons: {}\n", "gate.actons: unknown key", id="misspelled-key"),
        pytest.param("gate:\n  action: drop\n", "gate.action", id="bad-action"),
        pytest.param("tools:\n  t: {type: 12}\n", "tools.t", id="invalid-schema"),
        pytest.param("listen:\n  port: 99999\n", "listen.port", id="bad-port"),
        pytest.param("upstream:\n  url: ftp://x\n", "upstream.url", id="bad-url"),
    ],
)
def test_a_bad_config_stops_the_start_naming_the_key(
    tmp_path: Path, config: str, message: str
) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(config)

    done = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )

    assert done.returncode == 2
    assert message in done.stderr


def test_the_example_config_starts_a_valid_config() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "check", "--config", "config.example.yaml", "-"],
        input='{"input": []}',
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr


async def two_turns(first: str, second: str) -> str:
    """Turn 1 (the model calls a tool) via `first`, turn 2 (only the output) via `second`."""
    async with (
        AsyncOpenAI(base_url=first + "/v1", api_key="sk-x", max_retries=0) as one,
        AsyncOpenAI(base_url=second + "/v1", api_key="sk-x", max_retries=0) as two,
    ):
        tools: list[Any] = [SALES_TOOL]
        response = await one.responses.create(model="m", input="sales?", tools=tools)
        [call] = [item for item in response.output if item.type == "function_call"]
        answer = await two.responses.create(
            model="m",
            previous_response_id=response.id,
            input=[sales_output(call.call_id, "across processes")],  # type: ignore[list-item]
            tools=tools,
        )
    return answer.output_text


def redis_config(tmp_path: Path, redis_server: RedisServer) -> str:
    path = tmp_path / "proxy.yaml"
    path.write_text(
        f"ledger: {{backend: redis, url: '{redis_server.url}'}}\n"
        f"audit: {{path: '{tmp_path / 'audit.jsonl'}'}}\n"
    )
    return str(path)


async def test_two_proxy_processes_share_the_ledger_through_redis(
    scripted_upstream: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    config = redis_config(tmp_path, redis_server)
    first = await start("--config", config, "--upstream", scripted_upstream)
    second = await start("--config", config, "--upstream", scripted_upstream)
    try:
        assert await two_turns(first.url, second.url) == "tool said: across processes"
    finally:
        assert await first.stop() == 0
        assert await second.stop() == 0


async def test_workers_share_one_port(
    scripted_upstream: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    port = free_port("127.0.0.1")
    config = redis_config(tmp_path, redis_server)
    proxy = await start(
        "--config",
        config,
        "--upstream",
        scripted_upstream,
        "--workers",
        "2",
        "--port",
        str(port),
        listeners=2,  # the second worker may bind after the first has answered
    )
    try:
        pids = set()
        for _ in range(200):
            async with (
                aiohttp.ClientSession() as session,
                session.get(proxy.url + "/-/healthy") as response,
            ):
                pids.add((await response.json())["pid"])
            if len(pids) == 2:
                break
        assert len(pids) == 2
        assert proxy.process.pid not in pids
        assert await two_turns(proxy.url, proxy.url) == "tool said: across processes"
    finally:
        assert await proxy.stop() == 0


async def test_sighup_reloads_a_valid_config_and_keeps_the_old_one_when_invalid(
    recording_upstream: RecordingUpstream, tmp_path: Path
) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(f"audit: {{path: '{tmp_path / 'audit.jsonl'}'}}\ngate: {{action: block}}\n")
    proxy = await start("--config", str(path), "--upstream", recording_upstream.url)
    failing = {
        "model": "m",
        "tools": [SALES_TOOL],
        "input": [sales_call("c1", "global"), sales_output("c1")],
    }

    async def status() -> tuple[int, str | None]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(proxy.url + "/v1/responses", json=failing) as response,
        ):
            return response.status, response.headers.get("x-replay-gate")

    async def stderr_until(text: str) -> None:
        assert proxy.process.stderr is not None
        while text not in (await proxy.process.stderr.readline()).decode():
            pass

    try:
        assert await status() == (400, None)
        path.write_text(f"audit: {{path: '{tmp_path / 'audit.jsonl'}'}}\ngate: {{action: log}}\n")
        proxy.process.send_signal(signal.SIGHUP)
        await asyncio.wait_for(stderr_until("config reloaded"), timeout=30)
        assert await status() == (200, "logged=1")

        path.write_text("gate: {actons: {}}\n")
        proxy.process.send_signal(signal.SIGHUP)
        await asyncio.wait_for(stderr_until("gate.actons: unknown key"), timeout=30)
        assert await status() == (200, "logged=1")
    finally:
        assert await proxy.stop() == 0
    assert len(recording_upstream.received) == 2


# Run in a process of its own: whether glibc maps a buffer depends on the thresholds set.
_MAPPED_BUFFERS = """
import ctypes, socket
from proxy.running.serving import return_large_buffers

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
print(return_large_buffers())
mapped = lambda: libc.mallinfo2().hblks
libc.malloc_trim(0)  # no free memory left at the heap's top: a large buffer needs more
before = mapped()
a, b = socket.socketpair()
a.sendall(b"x" * 100)
read = b.recv(256 * 1024)  # asyncio's read of a socket: 256 KiB, shrunk to what arrived
print(len(read), mapped() - before)
large = bytearray(2 << 20)  # a 2 MB body
print(mapped() - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc setting")
def test_large_buffers_are_mapped_and_a_socket_read_is_not() -> None:
    """The serving process fixes glibc's mmap threshold (see `return_large_buffers`): a 2 MB
    buffer is mapped (and so given back to the system when freed), while the 256 KiB buffer
    of each socket read comes from the heap, not from an mmap, mremap and munmap per read."""
    done = subprocess.run(
        [sys.executable, "-c", _MAPPED_BUFFERS],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    took, read, large = done.stdout.splitlines()
    assert took == "True"
    assert read == "100 0"  # the read's buffer is not a mapping of its own
    assert large == "1"


async def test_the_heap_is_trimmed_every_period_until_cancelled() -> None:
    """`serve` gives the heap's free pages back on a period (`trim_heap_every`): a trim per
    period, none once the task is cancelled."""
    trims = 0
    third = asyncio.Event()

    def trim() -> None:
        nonlocal trims
        trims += 1
        if trims == 3:
            third.set()

    task = asyncio.create_task(trim_heap_every(0, trim))
    await asyncio.wait_for(third.wait(), timeout=30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    done = trims
    await asyncio.sleep(0)
    assert trims == done >= 3


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc call")
def test_the_free_pages_are_given_back_on_glibc() -> None:
    assert give_back_free_memory() is True


async def test_a_replaced_upstream_closes_after_its_last_request() -> None:
    """A reload that names another upstream leaves requests in flight their pool, and closes
    it when the last of them is done: reloads do not pile up open pools."""
    live = InForceHolder()
    await live.start(parse_config({"upstream": {"url": "http://127.0.0.1:9"}}))
    first = live.current.upstream
    first.acquire()  # a request in flight, as `proxy()` does when it reads the config
    await live.swap(parse_config({"upstream": {"url": "http://127.0.0.1:10"}}))
    second = live.current.upstream
    assert second is not first
    assert not first.closed
    await first.release()
    assert first.closed
    # One that no request uses is closed at once; the one in force only at shutdown.
    await live.swap(parse_config({"upstream": {"url": "http://127.0.0.1:11"}}))
    assert second.closed
    assert not live.current.upstream.closed
    await live.close()
    assert live.current.upstream.closed


async def test_a_request_done_on_the_config_in_force_has_nothing_to_close() -> None:
    """A request's end awaits nothing unless it was the last one on a retired upstream."""
    live = InForceHolder()
    await live.start(parse_config({"upstream": {"url": "http://127.0.0.1:9"}}))
    old = live.current
    old.acquire()
    old.acquire()
    assert old.release() is None
    await live.swap(parse_config({"upstream": {"url": "http://127.0.0.1:10"}}))
    assert not old.upstream.closed
    closing = old.release()
    assert closing is not None
    await closing
    assert old.upstream.closed
    live.current.acquire()
    assert live.current.release() is None
    await live.close()


async def test_the_start_warns_then_says_what_is_in_force(
    recording_upstream: RecordingUpstream, tmp_path: Path
) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(
        f"upstream: {{url: '{recording_upstream.url}/v1'}}\n"
        f"audit: {{path: '{tmp_path / 'audit.jsonl'}'}}\n"
        "gate: {action: strip, actions: {orphan: block, namespaced: log}}\n"
        "tools: {anything: {}, get_weather: {type: object}}\n"
    )
    process = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "proxy", "serve", "--config", str(path), "--port", "0"],
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    proxy = Proxy(process, "")
    assert process.stderr is not None
    lines: list[str] = []
    try:
        while not lines or " in force: " not in lines[-1]:
            line = (await asyncio.wait_for(process.stderr.readline(), timeout=30)).decode()
            assert line, lines
            lines.append(line.rstrip("\n"))
    finally:
        assert await proxy.stop() == 0
    said = [line.split(": ", 1)[1] for line in lines]
    levels = [line.split()[2] for line in lines]
    assert levels == ["WARNING", "WARNING", "INFO", "INFO"]
    assert said[0].startswith(f"upstream.url: {recording_upstream.url}/v1 ends in /v1")
    assert "goes to /v1/v1/responses" in said[0]
    assert said[1].startswith("tools.anything: the pinned schema accepts every call")
    assert said[2].startswith("listening on http://127.0.0.1:")
    assert said[3] == (
        f"in force: upstreams default={recording_upstream.url}/v1; 1 route; "
        f"ledger memory (this process only); audit {tmp_path / 'audit.jsonl'}; "
        "gate strip (namespaced: log, orphan: block); 2 pinned tools; 1 worker; TLS off"
    )
