"""`serve --workers N`: N proxy processes on one port (SO_REUSEPORT), supervised by this one."""

from __future__ import annotations

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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import FrameType

from proxy.state.workers import Missing, Slots, failure_of, serving_pid, write_slots

log = logging.getLogger("replay_proxy")

# A worker that served at least this long and then died is replaced at once; one that died
# sooner (or never served: a config on disk that no longer loads, a port taken) is retried
# after a delay that doubles from the first to the last of these, then stays there.
_STEADY_S = 5.0
_FIRST_RETRY_S = 1.0
_LAST_RETRY_S = 30.0
_POLL_S = 0.2
# Where prometheus-client's multiprocess mode keeps each process's metrics.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def retry_delay(failures: int) -> float:
    """Seconds before the next start of a slot whose worker failed `failures` times in a row."""
    return min(_FIRST_RETRY_S * 2.0 ** max(failures - 1, 0), _LAST_RETRY_S)


@dataclass
class _Slot:
    number: int
    process: subprocess.Popen[bytes] | None = None
    serving_since: float | None = None
    failures: int = 0
    next_start: float = 0.0
    detail: str = "not started"
    hangup: bool = False  # a SIGHUP to pass on once the worker serves


class Supervisor:
    """Keeps `workers` copies of `python -m proxy serve <worker_args>` running.

    A worker that exits is logged and started again, after a delay when it had not served for
    long (`retry_delay`); the others keep serving. Only when no worker has served yet does a
    failure end the supervisor: a start that cannot work is reported as one. Which slots are
    missing is written to the directory the workers share (`proxy.state.workers`).
    """

    def __init__(self, worker_args: Sequence[str], workers: int, directory: str) -> None:
        self.directory = directory
        self.command = [sys.executable, "-m", "proxy", "serve", *worker_args]
        self.slots = [_Slot(n) for n in range(1, workers + 1)]
        self.stopping = False
        self.served = False
        self._written: Slots | None = None

    def run(self) -> int:
        """Supervise until `stop`; the exit status is the worst of the workers' last."""
        for slot in self.slots:
            self._start(slot)
        self._report()  # before any worker can ask
        log.info(
            "supervising %d workers: %s",
            len(self.slots),
            ", ".join(str(s.process.pid) for s in self.slots if s.process is not None),
        )
        status = 0
        while not self.stopping:
            failed = self._tend(time.monotonic())
            if failed is not None:
                log.error("no worker could start; stopping")
                self.stop()
                status = failed
                break
            time.sleep(_POLL_S)
        for slot in self.slots:
            if slot.process is not None:
                status = max(status, slot.process.wait())
        return status

    def stop(self) -> None:
        self.stopping = True
        for slot in self.slots:
            if slot.process is not None and slot.process.poll() is None:
                slot.process.send_signal(signal.SIGTERM)

    def hangup(self) -> None:
        """Pass SIGHUP on (each worker re-reads the config), and try missing slots again now:
        a reload is how an operator says the config on disk was fixed."""
        now = time.monotonic()
        for slot in self.slots:
            if slot.serving_since is None:
                slot.failures, slot.next_start = 0, now  # one starting now retries in 1 s
                # Not before it serves: until its handler is installed, SIGHUP would end it.
                slot.hangup = slot.process is not None
            elif slot.process is not None and slot.process.poll() is None:
                slot.process.send_signal(signal.SIGHUP)

    def _tend(self, now: float) -> int | None:
        """One look at every slot; the exit status of a failed start when none has served."""
        # Who serves first, so that a worker that came up is counted before another's exit.
        for slot in self.slots:
            process = slot.process
            if process is None or slot.serving_since is not None:
                continue
            if serving_pid(self.directory, slot.number) == process.pid:
                slot.serving_since = now
                self.served = True
                if slot.failures:
                    log.info("worker slot %d serves again (pid %d)", slot.number, process.pid)
                slot.failures = 0
                if slot.hangup:
                    slot.hangup = False
                    process.send_signal(signal.SIGHUP)
        for slot in self.slots:
            process = slot.process
            if process is None:
                if now >= slot.next_start and not self.stopping:
                    self._start(slot)
                continue
            code = process.poll()
            if code is None or self.stopping:
                continue
            if not self.served:
                log.error("worker %d exited with %d before any worker served", process.pid, code)
                return code
            self._exited(slot, process, code, now)
        self._report()
        return None

    def _exited(self, slot: _Slot, process: subprocess.Popen[bytes], code: int, now: float) -> None:
        reason = failure_of(self.directory, slot.number, process.pid)
        steady = slot.serving_since is not None and now - slot.serving_since >= _STEADY_S
        slot.failures = 0 if steady else slot.failures + 1
        delay = 0.0 if steady else retry_delay(slot.failures)
        slot.process, slot.serving_since, slot.next_start = None, None, now + delay
        slot.hangup = False  # the next worker reads the config as it is then
        said = f"exited with {code}" + (f": {reason}" if reason else "")
        at = datetime.now(UTC) + timedelta(seconds=delay)
        slot.detail = f"{said}; next start at {at.isoformat(timespec='seconds')}"
        if steady:
            log.warning(
                "worker slot %d (pid %d) %s; starting another", slot.number, process.pid, said
            )
        else:
            log.error(
                "worker slot %d (pid %d) %s; the other workers go on, next try in %g s",
                slot.number,
                process.pid,
                said,
                delay,
            )

    def _start(self, slot: _Slot) -> None:
        slot.process = subprocess.Popen(
            [*self.command, "--worker-slot", str(slot.number), "--worker-dir", self.directory]
        )
        slot.detail = f"starting (pid {slot.process.pid})"

    def _report(self) -> None:
        missing = tuple(
            Missing(slot.number, slot.detail) for slot in self.slots if slot.serving_since is None
        )
        slots = Slots(len(self.slots), missing)
        if slots != self._written:
            write_slots(self.directory, slots)
            self._written = slots


def share_metrics(directory: str) -> str:
    """A fresh directory in `directory` where the workers started from now on keep their
    metrics (prometheus multiprocess mode), so that a scrape of any of them reads the whole
    service; it goes when `directory` does."""
    metrics = tempfile.mkdtemp(prefix="replay-proxy-metrics-", dir=directory)
    os.environ[MULTIPROC_ENV] = metrics  # inherited by every worker
    return metrics


def supervise(worker_args: Sequence[str], workers: int) -> int:
    """Run `workers` copies of `python -m proxy serve <worker_args>` until SIGTERM/SIGINT.

    The signal is passed on to every worker, which stops accepting and lets its requests in
    flight finish; the exit status is the worst of theirs. SIGHUP is passed on too: each
    worker re-reads the config.
    """
    directory = tempfile.mkdtemp(prefix="replay-proxy-workers-")
    share_metrics(directory)
    supervisor = Supervisor(worker_args, workers, directory)

    def stop(signum: int, frame: FrameType | None) -> None:
        supervisor.stop()

    def hangup(signum: int, frame: FrameType | None) -> None:
        supervisor.hangup()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, hangup)
    try:
        status = supervisor.run()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    log.info("supervisor stopped, exit status %d", status)
    return status
