"""`audit tail`: records as readable lines, the last few and then, with -f, as they are written."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proxy.running.audit_tail import describe, iter_follow
from proxy.running.report import Entry, UnreadableLine
from proxy.state.audit import AuditLog
from tests.builders import FINDING, HANG_GUARD_S, audit_record, orphan_finding
from tests.state.audit_logs import ORPHAN, replay_proxy, write_records

HEAD = "2026-11-29T09:04:59.897Z block req_1 /v1/responses tenant t_0123456789abcdef"
SALES = "input[2] (call_id call_1) get_latest_sales_report"


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        pytest.param(
            Entry("a", 1, audit_record()),
            [f"{HEAD}: {SALES}: region failed schema: expected one of apac, emea, amer"],
            id="schema",
        ),
        pytest.param(
            Entry("a", 1, audit_record("2026-11-29T09:04:59.897Z", FINDING, orphan_finding())),
            [
                f"{HEAD}: {SALES}: region failed schema: expected one of apac, emea, amer",
                f"{HEAD}: input[1] (call_id call_9): orphan",
            ],
            id="a-line-per-finding",
        ),
        pytest.param(
            Entry("a", 1, audit_record(upstream="openai", tenant=None)),
            [
                (
                    f"{HEAD.removesuffix(' tenant t_0123456789abcdef')} upstream openai: "
                    f"{SALES}: region failed schema: expected one of apac, emea, amer"
                )
            ],
            id="upstream-and-no-tenant",
        ),
        pytest.param(
            Entry("a", 1, audit_record(event="emitted_call_rejected", tenant=None)),
            [
                (
                    f"{HEAD.removesuffix(' tenant t_0123456789abcdef')} emitted_call_rejected: "
                    f"{SALES}: region failed schema: expected one of apac, emea, amer"
                )
            ],
            id="another-event",
        ),
        pytest.param(
            Entry("a", 1, audit_record("t", FINDING | {"message": "region is not one of apac"})),
            [
                (
                    f"t block req_1 /v1/responses tenant t_0123456789abcdef: {SALES}: "
                    "region is not one of apac"
                )
            ],
            id="its-own-message",
        ),
        pytest.param(
            Entry("a", 1, audit_record("t", FINDING | {"name": "evil\x1b[2J"}, tenant=None)),
            [
                (
                    "t block req_1 /v1/responses: input[2] (call_id call_1) evil\\x1b[2J: "
                    "region failed schema: expected one of apac, emea, amer"
                )
            ],
            id="control-characters-escaped",
        ),
        pytest.param(
            Entry(
                "a",
                1,
                audit_record(
                    "t",
                    {"index": None, "reason": "envelope", "param": "messages", "message": "chat"},
                    tenant=None,
                ),
            ),
            ["t block req_1 /v1/responses: messages: chat"],
            id="a-chat-completions-body",
        ),
        pytest.param(
            Entry("a", 1, {"findings": []}),
            ["(none) (none) (none) (none) (none): no findings"],
            id="bare-record",
        ),
        pytest.param(
            UnreadableLine("audit.jsonl", 7, "not JSON"),
            ["audit.jsonl:7: unreadable: not JSON"],
            id="unreadable",
        ),
    ],
)
def test_a_record_as_readable_lines(entry: Entry | UnreadableLine, expected: list[str]) -> None:
    assert list(describe(entry)) == expected


def test_the_last_records(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    lines = [json.dumps(audit_record(request_id=f"req_{i}")) + "\n" for i in range(4)]
    path.write_text("".join([*lines[:2], "garbage\n", *lines[2:]]))
    done = replay_proxy("audit", "tail", "-n", "3", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{path}:3: unreadable: not JSON",
        (
            f"2026-11-29T09:04:59.897Z block req_2 {HEAD.split(' ', 3)[3]}: {SALES}: "
            "region failed schema: expected one of apac, emea, amer"
        ),
        (
            f"2026-11-29T09:04:59.897Z block req_3 {HEAD.split(' ', 3)[3]}: {SALES}: "
            "region failed schema: expected one of apac, emea, amer"
        ),
    ]


def test_a_missing_file_exits_2(tmp_path: Path) -> None:
    done = replay_proxy("audit", "tail", str(tmp_path / "missing.jsonl"))
    assert done.returncode == 2
    assert "missing.jsonl: cannot read" in done.stderr


class Lines:
    """A subprocess's stdout, read a known number of lines at a time under a hang guard."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.fd, selectors.EVENT_READ)
        self.buffer = b""

    def read(self, n: int) -> list[str]:
        deadline = time.monotonic() + HANG_GUARD_S
        while self.buffer.count(b"\n") < n:
            left = deadline - time.monotonic()
            assert left > 0, f"waited for {n} lines, have {self.buffer!r}"
            if self.selector.select(left):
                chunk = os.read(self.fd, 65536)
                assert chunk, f"stdout closed after {self.buffer!r}"
                self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n", n)
        return [line.decode() for line in lines]


def request_ids(lines: list[str]) -> list[str]:
    return [line.split(" ")[2] for line in lines]


def test_follow_prints_records_as_they_are_written_across_a_rotation(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(str(path), max_bytes=1500)
    write_records(log, 2, tag="old")
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "audit", "tail", "-f", "-n", "1", str(path)],
        stdout=subprocess.PIPE,
    )
    try:
        out = Lines(proc)
        # The last record first: the tail has read the file to its end before it prints it.
        assert request_ids(out.read(1)) == ["old_1"]
        write_records(log, 2, tag="new")
        assert request_ids(out.read(2)) == ["new_0", "new_1"]
        # Records one by one while the file rotates under the tail (twice): it follows each time.
        for i in range(6):
            write_records(log, 1, tag=f"more_{i}")
            assert request_ids(out.read(1)) == [f"more_{i}_0"]
        assert (tmp_path / "audit.jsonl.2").exists()
    finally:
        log.close()
        proc.terminate()
        proc.wait(timeout=HANG_GUARD_S)
        assert proc.stdout is not None
        proc.stdout.close()


ORPHAN_LINE = (
    json.dumps(audit_record("t", *[f.as_dict() for f in ORPHAN.findings], tenant=None)).encode()
    + b"\n"
)


class Stop(Exception):
    """Raised by the test's sleep: the follow loop has nothing more to read."""


def follow_with(path: Path, *changes: bytes | None) -> list[str]:
    """What iter_follow shows when each wait for data makes the next change to the file.

    bytes are appended; None empties the file (cut back, as by an outside tool).
    """
    pending = list(changes)

    def sleep(_: float) -> None:
        if not pending:
            raise Stop
        change = pending.pop(0)
        if change is None:
            path.write_bytes(b"")
        else:
            with open(path, "ab") as f:
                f.write(change)

    shown: list[str] = []
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        with contextlib.suppress(Stop):
            shown.extend(
                iter_follow(str(path), f, line=path.read_bytes().count(b"\n"), sleep=sleep)
            )
    return shown


ORPHAN_SHOWN = (
    "t block req_1 /v1/responses: input[0] (call_id call_1): no function_call with call_id "
    "call_1 precedes this output: not inline, not behind an item_reference, not in the "
    "previous_response_id chain the proxy recorded"
)


@pytest.mark.parametrize(
    ("before", "changes", "expected"),
    [
        pytest.param(b"", [ORPHAN_LINE], [ORPHAN_SHOWN], id="appended"),
        pytest.param(
            b"", [ORPHAN_LINE[:30], ORPHAN_LINE[30:]], [ORPHAN_SHOWN], id="half-a-line-waits"
        ),
        pytest.param(
            ORPHAN_LINE * 2,
            [b"garbage\n"],
            ["{path}:3: unreadable: not JSON"],
            id="numbered-after-the-lines-before",
        ),
        pytest.param(
            ORPHAN_LINE * 2, [None, ORPHAN_LINE], [ORPHAN_SHOWN], id="emptied-read-from-start"
        ),
    ],
)
def test_follow(
    tmp_path: Path, before: bytes, changes: list[bytes | None], expected: list[str]
) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(before)
    assert follow_with(path, *changes) == [e.format(path=path) for e in expected]
