"""The machine a benchmark runs on: what it is, and how much CPU others took meanwhile."""

from __future__ import annotations

import os
import platform
import re
import resource
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def describe() -> str:
    """Cores, CPU model, kernel, Python, and the commit of the proxy that was measured."""
    return (
        f"{os.cpu_count()} cores ({_cpu_model() or platform.machine()}), "
        f"Linux {platform.release()}, Python {platform.python_version()}, {_revision()}"
    )


def _cpu_model() -> str | None:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return None
    found = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return found.group(1).strip() if found else None


def _revision() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "proxy")
    except (OSError, subprocess.SubprocessError):
        return "proxy at an unknown revision"
    return f"proxy at {commit}" + (" with uncommitted changes" if dirty else "")


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command's name (which may hold spaces and
    parentheses): element 0 is field 3 (state)."""
    stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    return stat.rsplit(")", 1)[1].split()


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a whole process (every thread), from /proc/PID/stat."""
    fields = _stat_fields(pid)
    # utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def minor_faults(pid: int) -> int:
    """The page faults a process took that needed no disk (field 10 of /proc/PID/stat): each
    page of memory it touched for the first time since it was mapped."""
    return int(_stat_fields(pid)[7])


def _busy_seconds() -> tuple[float, float]:
    """CPU time of every process on the machine (user, nice, system; not idle, irq), and the
    time the host ran others on this machine's CPUs (steal: a virtual machine's neighbours)."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = f.readline().split()
    user, nice, system = (int(v) for v in fields[1:4])
    steal = int(fields[8]) if len(fields) > 8 else 0
    return (user + nice + system) / CLK_TCK, steal / CLK_TCK


def _own_seconds() -> float:
    """This process and its children that have been waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Others:
    """The CPU others took while a measurement ran, in cores on average: other processes, and
    on a virtual machine the host's other guests (its steal time).

    Ours are this process, its waited-for children (wrk), and `pids` (the servers, still
    running). A busy neighbour on a 2-core machine skews every figure; this says how much. (A
    host's neighbours slowed one run's every figure 1.6-fold, the direct connection's too,
    with no other process running here.)
    """

    def __init__(self, pids: Sequence[int] = ()) -> None:
        self.pids = list(pids)
        self._start = self._sample()

    def _sample(self) -> tuple[float, float, float, float]:
        ours = _own_seconds() + sum(process_cpu_seconds(pid) for pid in self.pids)
        busy, stolen = _busy_seconds()
        return time.monotonic(), busy, stolen, ours

    def cores(self) -> float:
        """Cores used by others since this object was made."""
        t0, busy0, stolen0, ours0 = self._start
        t1, busy1, stolen1, ours1 = self._sample()
        taken = max(0.0, (busy1 - busy0) - (ours1 - ours0)) + (stolen1 - stolen0)
        return taken / max(t1 - t0, 1e-9)


def wait_for_quiet(limit_s: float, below_cores: float = 0.1) -> bool:
    """Wait (at most `limit_s`) for a second in which other processes take under `below_cores`."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        others = Others()
        time.sleep(1.0)
        if others.cores() < below_cores:
            return True
    return False
