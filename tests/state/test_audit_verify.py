"""`audit verify`: each tampering found at its line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.state.audit import line_hash
from tests.state.audit_logs import fresh_log, replay_proxy

Lines = list[bytes]


def edit(lines: Lines) -> Lines:
    lines[2] = lines[2].replace(b'"action":"block"', b'"action":"log"')
    return lines


def insert_forged(lines: Lines) -> Lines:
    # Forged with the right prev: the record after it gives it away.
    forged = json.loads(lines[1])
    forged["request_id"], forged["prev"] = "req_forged", line_hash(lines[1])
    return [*lines[:2], json.dumps(forged).encode(), *lines[2:]]


def insert_foreign(lines: Lines) -> Lines:
    # A record from another chain, its prev left as it was.
    foreign = json.loads(lines[0])
    foreign["request_id"] = "req_foreign"
    return [*lines[:2], json.dumps(foreign).encode(), *lines[2:]]


def drop_prev(lines: Lines) -> Lines:
    entry = json.loads(lines[0])
    del entry["prev"]
    return [json.dumps(entry).encode(), *lines[1:]]


@pytest.mark.parametrize(
    ("tamper", "trailer", "line", "reason"),
    [
        pytest.param(
            lambda ls: [*ls[:2], b"garbage", *ls[3:]], b"\n", 3, "not JSON", id="not-json"
        ),
        pytest.param(lambda ls: [*ls[:2], b"", *ls[2:]], b"\n", 3, "not JSON", id="blank-line"),
        pytest.param(
            lambda ls: [*ls[:2], b"[1, 2]", *ls[3:]], b"\n", 3, "not a JSON object", id="array"
        ),
        pytest.param(drop_prev, b"\n", 1, "no prev: not a chained record", id="no-prev"),
        pytest.param(
            edit,
            b"\n",
            4,
            "prev is not the hash of line 3: line 3 was edited, or records after it were deleted",
            id="edited",
        ),
        pytest.param(
            insert_forged, b"\n", 3, "inserted: line 4 continues from line 2", id="inserted"
        ),
        pytest.param(
            insert_foreign,
            b"\n",
            3,
            "inserted: line 4 continues from line 2",
            id="inserted-with-a-foreign-prev",
        ),
        pytest.param(
            lambda ls: ls[:2] + ls[1:],
            b"\n",
            2,
            "inserted: line 3 continues from line 1",
            id="duplicated",
        ),
        pytest.param(
            lambda ls: ls[:2] + ls[3:],
            b"\n",
            3,
            "prev is not the hash of line 2: line 2 was edited, or records after it were deleted",
            id="deleted",
        ),
        pytest.param(
            lambda ls: ls[1:],
            b"\n",
            1,
            "prev is not a fresh chain's start (64 zeros): records before it were deleted or "
            "edited, or the file continues another one",
            id="deleted-first",
        ),
        pytest.param(
            lambda ls: [*ls[:-1], ls[-1][:50]],
            b"",
            5,
            "not JSON (no newline at the end: the record was cut short)",
            id="truncated-last-line",
        ),
        pytest.param(
            lambda ls: ls,
            b"",
            5,
            "truncated (no newline at the end: the record was cut short)",
            id="last-newline-missing",
        ),
    ],
)
def test_verify_finds_the_first_tampered_line(
    tmp_path: Path, tamper: Callable[[Lines], Lines], trailer: bytes, line: int, reason: str
) -> None:
    path = tmp_path / "audit.jsonl"
    lines = fresh_log(path, 5)
    assert replay_proxy("audit", "verify", str(path)).returncode == 0
    path.write_bytes(b"\n".join(tamper(list(lines))) + trailer)

    done = replay_proxy("audit", "verify", str(path))

    assert (done.returncode, done.stdout, done.stderr) == (
        1,
        f"{path}: line {line}: {reason}\n",
        "",
    )


def test_verify_ok_prints_the_records_and_the_last_hash(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    lines = fresh_log(path, 5)
    done = replay_proxy("audit", "verify", str(path))
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        f"{path}: ok, 5 records, last hash {line_hash(lines[-1])}\n",
        "",
    )


def test_a_removed_tail_is_seen_only_in_the_last_hash(tmp_path: Path) -> None:
    # The chain cannot show that its last records were removed: the last hash, kept
    # elsewhere, can.
    path = tmp_path / "audit.jsonl"
    lines = fresh_log(path, 5)
    path.write_bytes(b"".join(line + b"\n" for line in lines[:4]))
    done = replay_proxy("audit", "verify", str(path))
    assert done.returncode == 0
    assert done.stdout.endswith(f"4 records, last hash {line_hash(lines[3])}\n")
    assert line_hash(lines[4]) not in done.stdout


@pytest.mark.parametrize(
    ("args", "error"),
    [
        pytest.param(["missing.jsonl"], "replay-proxy: missing.jsonl: cannot read:", id="missing"),
        pytest.param(["--prev", "abc", "x.jsonl"], "is not a sha256 hex digest", id="bad-prev"),
        pytest.param([], "the following arguments are required: FILE", id="no-file"),
    ],
)
def test_verify_usage_errors_exit_2(tmp_path: Path, args: list[str], error: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "audit", "verify", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert error in done.stderr
    assert done.stdout == ""
