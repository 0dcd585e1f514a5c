"""`audit tail`: audit records as readable lines, the last few of a file and then as they arrive."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from proxy.running.report import Entry, UnreadableLine, iter_entries, key, printable, shown

POLL_S = 0.2
_RECORD_FIELDS = ("ts", "action", "request_id", "path")


def describe_finding(finding: dict[str, Any]) -> str:
    """The finding as one sentence: its own `message` when the record carries one."""
    if "output_index" in finding:  # the model's own call, in the response's output (door 2)
        where = f"output[{shown(key(finding.get('output_index')))}]"
    elif finding.get("index") is None and isinstance(finding.get("param"), str):
        where = shown(key(finding["param"]))  # the body's own member: a `messages` envelope
    else:
        where = f"input[{shown(key(finding.get('index')))}]"
    call_id = finding.get("call_id")
    if call_id is not None:
        where += f" (call_id {shown(key(call_id))})"
    name = finding.get("name")
    if name is not None:
        where += f" {shown(key(name))}"
    message = finding.get("message")
    if isinstance(message, str):
        return f"{where}: {message}"
    detail = shown(key(finding.get("reason")))
    fail = [v for v in finding.get("fail") or [] if isinstance(v, dict)]
    if fail:
        detail += " at " + ", ".join(
            f"{shown(key(v.get('path'))) or '/'} ({shown(key(v.get('reason')))})" for v in fail
        )
    return f"{where}: {detail}"


def describe(entry: Entry | UnreadableLine) -> Iterator[str]:
    """A record as readable lines, one per finding; a line that is not a record says so."""
    if isinstance(entry, UnreadableLine):
        yield printable(f"{entry.file}:{entry.line}: unreadable: {entry.reason}")
        return
    rec = entry.record
    head = " ".join(shown(key(rec.get(f))) for f in _RECORD_FIELDS)
    event = rec.get("event")
    if event != "replay_rejected":
        head += f" {shown(key(event))}"
    for field in ("tenant", "upstream", "response_id"):
        if rec.get(field) is not None:
            head += f" {field} {shown(key(rec.get(field)))}"
    findings = [f for f in rec["findings"] if isinstance(f, dict)]
    if not findings:
        yield printable(f"{head}: no findings")
    for finding in findings:
        yield printable(f"{head}: {describe_finding(finding)}")


def read_last(name: str, f: BinaryIO, count: int) -> tuple[list[str], int]:
    """The readable lines of the last `count` lines of `f` (left at its end), and its line count."""
    last: deque[tuple[int, bytes]] = deque(maxlen=count)
    total = 0
    for total, raw in enumerate(f, 1):
        last.append((total, raw))
    shown_lines = [
        line
        for number, raw in last
        for entry in iter_entries(name, [raw])
        for line in describe(_renumbered(entry, number))
    ]
    return shown_lines, total


def iter_follow(
    path: str, f: BinaryIO, *, line: int = 0, sleep: Callable[[float], None] = time.sleep
) -> Iterator[str]:
    """Readable lines for what is appended to `path` from `f`'s position on, for ever.

    A rotation (another file now at `path`) is followed once the old file's rest is read; a file
    cut back (emptied) is read again from its start. A line is read once it has its newline.
    """
    pending = b""
    number = line  # the lines of the current file before `f`'s position
    while True:
        chunk = f.read()
        if chunk:
            *whole, pending = (pending + chunk).split(b"\n")
            for raw in whole:
                number += 1
                for entry in iter_entries(path, [raw + b"\n"]):
                    yield from describe(_renumbered(entry, number))
            continue
        try:
            now = os.stat(path)
        except FileNotFoundError:
            sleep(POLL_S)
            continue
        mine = os.fstat(f.fileno())
        if (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
            f.close()
            f = open(path, "rb")  # noqa: SIM115 (closed on the next rotation, or at exit)
            pending, number = b"", 0
            continue
        if now.st_size < f.tell():
            f.seek(0)
            pending, number = b"", 0
            continue
        sleep(POLL_S)


def _renumbered(entry: Entry | UnreadableLine, number: int) -> Entry | UnreadableLine:
    if isinstance(entry, UnreadableLine):
        return UnreadableLine(entry.file, number, entry.reason)
    return Entry(entry.file, number, entry.record)
