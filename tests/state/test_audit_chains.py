"""Several processes on stdout: a named chain each, interleaved, and `audit verify` on them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from proxy.state.audit import GENESIS, AuditLog, line_hash, verify
from tests.state.audit_logs import replay_proxy, write_records

Lines = list[bytes]


def interleaved(capfd: pytest.CaptureFixture[str], n: int = 4) -> Lines:
    """A1 B1 A2 B2 ... : two processes' chains on one stdout, as `serve --workers 2` leaves them."""
    capfd.readouterr()
    a, b = AuditLog("-", chain="w1-101"), AuditLog("-", chain="w2-102")
    for i in range(n):
        write_records(a, 1, tag=f"a{i}")
        write_records(b, 1, tag=f"b{i}")
    a.close()
    b.close()
    return capfd.readouterr().out.encode().splitlines()


def check(lines: Lines) -> tuple[int | None, str | None, int]:
    done = verify(line + b"\n" for line in lines)
    broken = done.broken
    return (None, None, done.records) if broken is None else (broken.line, broken.reason, -1)


def retag(line: bytes, **fields: object) -> bytes:
    entry = json.loads(line)
    entry.update(fields)
    return json.dumps(entry, separators=(",", ":")).encode()


def test_each_writer_names_its_chain_and_chains_from_zeros(
    capfd: pytest.CaptureFixture[str],
) -> None:
    lines = interleaved(capfd, 2)
    entries = [json.loads(line) for line in lines]
    assert [e["chain"] for e in entries] == ["w1-101", "w2-102", "w1-101", "w2-102"]
    assert [e["prev"] for e in entries] == [
        GENESIS, GENESIS, line_hash(lines[0]), line_hash(lines[1])
    ]  # fmt: skip


def test_one_writer_without_a_name_writes_no_chain_field(
    capfd: pytest.CaptureFixture[str],
) -> None:
    capfd.readouterr()
    write_records(AuditLog("-"), 1)
    [line] = capfd.readouterr().out.encode().splitlines()
    assert "chain" not in json.loads(line)


A, B = "chain w1-101: ", "chain w2-102: "


@pytest.mark.parametrize(
    ("tamper", "line", "reason"),
    [
        pytest.param(lambda ls: ls, None, None, id="genuine"),
        pytest.param(
            lambda ls: [*ls[:2], retag(ls[2], action="log"), *ls[3:]],
            5,
            A + "prev is not the hash of line 3: line 3 was edited, or records after it were "
            "deleted",
            id="edited",
        ),
        pytest.param(
            lambda ls: [*ls[:2], *ls[3:]],
            4,
            A + "prev is not the hash of line 1: line 1 was edited, or records after it were "
            "deleted",
            id="deleted",
        ),
        pytest.param(
            lambda ls: [ls[0], *ls[2:]],
            3,
            B + "prev is not a fresh chain's start (64 zeros): records before it were deleted "
            "or edited, or the file continues another one",
            id="deleted-first-of-a-chain",
        ),
        pytest.param(
            lambda ls: [*ls[:3], retag(ls[2], request_id="forged", prev=line_hash(ls[2])), *ls[3:]],
            4,
            A + "inserted: line 6 continues from line 3",
            id="inserted-with-the-right-prev",
        ),
        pytest.param(
            lambda ls: [*ls[:4], ls[2], *ls[4:]],
            3,
            A + "inserted: line 5 continues from line 1",
            id="duplicated",
        ),
        pytest.param(
            lambda ls: [*ls[:2], ls[4], ls[3], ls[2], *ls[5:]],
            3,
            A + "inserted: line 5 continues from line 1",
            id="reordered",
        ),
        pytest.param(
            # Moved to the other chain: it does not continue that one, whose next record
            # gives it away.
            lambda ls: [*ls[:2], retag(ls[2], chain="w2-102"), *ls[3:]],
            3,
            B + "inserted: line 4 continues from line 2",
            id="moved-to-another-chain",
        ),
        pytest.param(
            lambda ls: [*ls[:2], retag(ls[2], chain=7), *ls[3:]],
            3,
            "chain is not a name (a non-empty string)",
            id="chain-not-a-string",
        ),
        pytest.param(
            lambda ls: [*ls[:2], retag(ls[2], chain=""), *ls[3:]],
            3,
            "chain is not a name (a non-empty string)",
            id="chain-empty",
        ),
    ],
)
def test_verify_checks_interleaved_chains_and_names_the_tampered_line(
    capfd: pytest.CaptureFixture[str],
    tamper: Callable[[Lines], Lines],
    line: int | None,
    reason: str | None,
) -> None:
    lines = interleaved(capfd)
    assert check(lines) == (None, None, 8)

    found = check(tamper(list(lines)))

    assert found[:2] == (line, reason)


def test_chains_named_and_unnamed_mix_and_continue_across_files(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Old records without `chain` (one process) and the workers' named chains after them; a
    named chain split over two files (a log shipper's rotation) verifies oldest first."""
    capfd.readouterr()
    write_records(AuditLog("-"), 2, tag="single")
    lines = capfd.readouterr().out.encode().splitlines() + interleaved(capfd)
    first, second = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    first.write_bytes(b"".join(line + b"\n" for line in lines[:6]))
    second.write_bytes(b"".join(line + b"\n" for line in lines[6:]))

    both = replay_proxy("audit", "verify", str(first), str(second))
    alone = replay_proxy("audit", "verify", str(second))

    assert (both.returncode, both.stderr) == (0, "")
    assert both.stdout.splitlines() == [
        (
            f"{first}: ok, 6 records in 3 chains, last hashes (unnamed) {line_hash(lines[1])}, "
            f"w1-101 {line_hash(lines[4])}, w2-102 {line_hash(lines[5])}"
        ),
        (
            f"{second}: ok, 4 records in 3 chains, last hashes (unnamed) {line_hash(lines[1])}, "
            f"w1-101 {line_hash(lines[8])}, w2-102 {line_hash(lines[9])}"
        ),
    ]
    assert (alone.returncode, alone.stdout) == (
        1,
        (
            f"{second}: line 1: chain w1-101: prev is not a fresh chain's start (64 zeros): "
            "records before it were deleted or edited, or the file continues another one\n"
        ),
    )


def test_a_break_in_the_second_file_names_where_the_chain_came_from(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lines = interleaved(capfd)
    first, second = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    first.write_bytes(b"".join(line + b"\n" for line in lines[:4]))
    second.write_bytes(b"".join(line + b"\n" for line in lines[5:]))  # A3 deleted

    done = replay_proxy("audit", "verify", str(first), str(second))

    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == (
        f"{second}: line 2: chain w1-101: prev is not the last hash of chain w1-101 in {first}: "
        "records before it were deleted or edited, or the file continues another one"
    )


WRITER = """
import os, sys, time
from pathlib import Path
from proxy.state.audit import AuditLog, AuditedRequest
from proxy.gate.policy import Policy
from proxy.gate.verdict import inspect

lock, ready, go, tag, n = sys.argv[1:]
# Records longer than a pipe writes at once (4 KiB): only the lock keeps them whole.
output = {"type": "function_call_output", "call_id": "c", "output": "x"}
body = {"model": "m" * 6000, "input": [output]}
verdict = inspect(body, Policy())
log = AuditLog("-", chain=f"{tag}-{os.getpid()}", lock_path=lock)
Path(ready).touch()
deadline = time.monotonic() + 30
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.001)
for i in range(int(n)):
    log.write(AuditedRequest(f"{tag}_{i}", "http", "/v1/responses", body, b"{}", None), verdict)
log.close()
"""


def test_processes_sharing_a_pipe_keep_whole_lines_and_a_chain_each(tmp_path: Path) -> None:
    go, ready, lock = tmp_path / "go", tmp_path / "ready", tmp_path / "stdout.lock"
    ready.mkdir()
    writers, n = ["a", "b", "c"], 100
    read_end, write_end = os.pipe()
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter_read(read_end)))
    reader.start()
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WRITER, *map(str, (lock, ready / tag, go, tag, n))],
                stdout=write_end,
            )
            for tag in writers
        ]
    finally:
        os.close(write_end)  # the writers hold it now; the reader ends when they are done
    try:
        deadline = time.monotonic() + 30
        while not all((ready / tag).exists() for tag in writers):
            assert time.monotonic() < deadline, "the writers did not start"
            time.sleep(0.01)
        go.touch()
        assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    finally:
        for p in procs:
            p.kill()
            p.wait()
        reader.join(timeout=60)
        os.close(read_end)

    lines = b"".join(chunks).splitlines()
    ids = Counter(json.loads(line)["request_id"] for line in lines)
    assert ids == Counter(f"{tag}_{i}" for tag in writers for i in range(n))
    done = verify(line + b"\n" for line in lines)
    assert (done.broken, done.records, len(done.chains)) == (None, 3 * n, 3)


def iter_read(fd: int) -> Iterator[bytes]:
    while chunk := os.read(fd, 1 << 16):
        yield chunk
