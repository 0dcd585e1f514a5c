"""`serve --workers N`: N proxy processes on one port (SO_REUSEPORT), supervised by this one."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from types import FrameType

log = logging.getLogger("replay_proxy")

# A worker that dies within this many seconds of its start is not restarted (it would only
# die again: a port in use, a broken config); one that ran longer is replaced.
_MIN_UPTIME_S = 5.0
# Where prometheus-client's multiprocess mode keeps each process's metrics.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def share_metrics() -> str:
    """A fresh directory where the workers started from now on keep their metrics (prometheus
    multiprocess mode), so that a scrape of any of them reads the whole service; removed when
    this process exits."""
    directory = tempfile.mkdtemp(prefix="replay-proxy-metrics-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    os.environ[MULTIPROC_ENV] = directory  # inherited by every worker
    return directory


def supervise(worker_args: Sequence[str], workers: int) -> int:
    """Run `workers` copies of `python -m proxy serve <worker_args>` until SIGTERM/SIGINT.

    The signal is passed on to every worker, which stops accepting and lets its requests in
    flight finish; the exit status is the worst of theirs. SIGHUP is passed on too: each
    worker re-reads the config.
    """
    command = [sys.executable, "-m", "proxy", "serve", *worker_args]
    share_metrics()
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for process, _ in running:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)

    running: list[tuple[subprocess.Popen[bytes], float]] = []

    def hangup(signum: int, frame: FrameType | None) -> None:
        for process, _ in running:
            if process.poll() is None:
                process.send_signal(signal.SIGHUP)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, hangup)
    for _ in range(workers):
        running.append((subprocess.Popen(command), time.monotonic()))
    log.info("supervising %d workers: %s", workers, ", ".join(str(p.pid) for p, _ in running))
    while not stopping:
        for index, (process, started) in enumerate(running):
            code = process.poll()
            if code is None or stopping:
                continue
            if time.monotonic() - started < _MIN_UPTIME_S:
                log.error(
                    "worker %d exited with %d right after starting; stopping", process.pid, code
                )
                stop(signal.SIGTERM, None)
                break
            log.warning("worker %d exited with %d; starting another", process.pid, code)
            running[index] = (subprocess.Popen(command), time.monotonic())
        time.sleep(0.2)
    return max(process.wait() for process, _ in running)
