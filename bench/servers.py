"""The serving processes of the load benchmark: started, watched (CPU, memory), stopped by PID."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from host import ROOT, process_cpu_seconds

BENCH = Path(__file__).resolve().parent


@dataclass
class Server:
    """One serving process started by this script."""

    name: str
    port: int
    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


# The PIDs of the servers this script started and has not stopped: `pin_apart` keeps them off
# the core of the one being measured.
_RUNNING: set[int] = set()


def pin_apart(measured: int) -> bool:
    """Put the measured server on the last CPU alone and everything else this script runs (the
    other servers, the upstream, this process and the wrk it starts) on the others; False when
    the machine has a single CPU. On two cores, whatever shared the measured server's core
    (wrk, the upstream) slowed it by as much as the effects being measured, and differently
    from run to run."""
    cpus = sorted(os.sched_getaffinity(0) | os.sched_getaffinity(measured))
    if len(cpus) < 2:
        return False
    alone, rest = {cpus[-1]}, set(cpus[:-1])
    os.sched_setaffinity(measured, alone)
    for pid in (0, *(p for p in _RUNNING if p != measured)):
        try:
            os.sched_setaffinity(pid, rest)
        except ProcessLookupError:
            continue
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def started(
    name: str,
    argv: list[str],
    port: int,
    log: IO[bytes],
    env: dict[str, str] | None = None,
    ready_s: float = 20,
) -> Iterator[Server]:
    """Start a server (with `env` added to the environment), wait up to `ready_s` until it
    accepts connections, and stop it (by its PID) at the end."""
    environ = {**os.environ, **env} if env else None
    process = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=log, env=environ)
    server = Server(name, port, process)
    _RUNNING.add(process.pid)
    try:
        deadline = time.monotonic() + ready_s
        while True:
            if process.poll() is not None:
                raise SystemExit(f"{name} exited with {process.returncode}:\n{_tail(log)}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"{name} did not listen on {port} within {ready_s:g} s:\n{_tail(log)}"
                    ) from None
                time.sleep(0.05)
        yield server
    finally:
        _RUNNING.discard(process.pid)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)


def started_stub(log: IO[bytes], name: str = "stub") -> AbstractContextManager[Server]:
    """The stub Open Responses upstream (`stub_upstream.py`) on a free port."""
    port = free_port()
    argv = [sys.executable, str(BENCH / "stub_upstream.py"), "--port", str(port)]
    return started(name, argv, port, log)


def started_redis(directory: Path, log: IO[bytes]) -> AbstractContextManager[Server]:
    """A `redis-server` (Debian's, on PATH) on a free port, keeping nothing on disk; its URL is
    `redis://127.0.0.1:PORT/0`."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    return started("redis", [*argv, "--dir", str(directory)], port, log)


def _tail(log: IO[bytes], lines: int = 20) -> str:
    """The end of the servers' log (it lives in a temporary directory that goes at exit)."""
    log.flush()
    text = Path(log.name).read_text(encoding="utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def memory_mb(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so each run reports its own peak."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5", encoding="ascii")
    except OSError:
        return False
    return True


def settle(pids: list[int], limit_s: float = 10.0) -> None:
    """Wait until none of the processes uses CPU (requests left over from a run are finished)."""
    deadline = time.monotonic() + limit_s
    before = [process_cpu_seconds(pid) for pid in pids]
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = [process_cpu_seconds(pid) for pid in pids]
        if now == before:
            return
        before = now


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:
        text: str = answer.read().decode()
        return text


def served_by_stub(stub_url: str) -> Callable[[], int]:
    """Requests the stub upstream has answered (those of `direct` or of the pass-through)."""
    return lambda: int(http_get(stub_url + "/-/served"))


def metric(proxy_url: str, name: str, missing: float = float("nan")) -> float:
    """The sum of a metric's samples, every label, on replay-proxy's /-/metrics (`missing`
    when it has none)."""
    samples = [
        float(line.rsplit(" ", 1)[1])
        for line in http_get(proxy_url + "/-/metrics").splitlines()
        if line.startswith((name + " ", name + "{"))
    ]
    return sum(samples) if samples else missing


def served_by_proxy(proxy_url: str) -> Callable[[], int]:
    """Requests replay-proxy has finished, every route and outcome (its own /-/metrics)."""
    return lambda: int(metric(proxy_url, "replay_proxy_requests_total", missing=0))
