"""The worker slots of `serve --workers N`, as files in a directory the supervisor shares with
its workers: each worker says there that it serves or why it could not start, the supervisor
writes there which slots are missing, and every worker reads that for readiness and metrics.

Files rather than a pipe or shared memory: a worker reads the supervisor's view whenever it
needs it, without a connection to keep or a message to miss, and a replaced worker finds it
as its predecessor left it. Every file is written whole to a temporary name and renamed over
the old one, so a reader sees the old content or the new, never half of either.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SLOTS_FILE = "workers.json"


@dataclass(frozen=True)
class WorkerSlot:
    """Which slot of the supervisor's this process fills, and the directory they share."""

    directory: str
    number: int

    @property
    def chain(self) -> str:
        """The name of this process's audit chain on a shared stdout: the slot and the pid,
        since a replaced worker cannot continue its predecessor's chain."""
        return f"w{self.number}-{os.getpid()}"

    @property
    def stdout_lock(self) -> str:
        """The file the workers lock while they write an audit record to the shared stdout."""
        return os.path.join(self.directory, "stdout.lock")

    def announce(self) -> None:
        """Say that this process serves (it listens)."""
        _replace(self._path("serving"), str(os.getpid()))

    def failed(self, reason: str) -> None:
        """Say why this process could not start, for the supervisor to log and report."""
        _replace(self._path("failed"), f"{os.getpid()}\n{reason}")

    def _path(self, kind: str) -> Path:
        return Path(self.directory, f"slot-{self.number}.{kind}")


def serving_pid(directory: str, number: int) -> int | None:
    """The pid of the last process that said it serves in slot `number`."""
    try:
        return int(Path(directory, f"slot-{number}.serving").read_text())
    except (OSError, ValueError):
        return None


def failure_of(directory: str, number: int, pid: int) -> str | None:
    """Why process `pid` of slot `number` could not start, when it said so."""
    try:
        said, _, reason = Path(directory, f"slot-{number}.failed").read_text().partition("\n")
    except OSError:
        return None
    return reason if said == str(pid) else None


@dataclass(frozen=True)
class Missing:
    """A slot without a serving worker: which, and why (exited, starting, next try)."""

    slot: int
    detail: str


@dataclass(frozen=True)
class Slots:
    """The supervisor's view: how many slots, and those that are missing."""

    workers: int
    missing: tuple[Missing, ...] = ()

    def encode(self) -> str:
        missing = [{"slot": m.slot, "detail": m.detail} for m in self.missing]
        return json.dumps({"workers": self.workers, "missing": missing})

    @classmethod
    def decode(cls, text: str) -> Slots:
        """The slots a file says; ValueError when it is not what `encode` writes."""
        data: Any = json.loads(text)
        try:
            missing = tuple(Missing(int(m["slot"]), str(m["detail"])) for m in data["missing"])
            return cls(int(data["workers"]), missing)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a slots file: {exc!r}") from None


def write_slots(directory: str, slots: Slots) -> None:
    _replace(Path(directory, SLOTS_FILE), slots.encode())


def read_slots(directory: str) -> Slots:
    """The supervisor's last view; OSError or ValueError when it cannot be read."""
    return Slots.decode(Path(directory, SLOTS_FILE).read_text())


def _replace(path: Path, text: str) -> None:
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    staged.write_text(text)
    os.replace(staged, path)
