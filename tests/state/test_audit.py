"""The audit log: its hash chain, `audit verify`, rotation, several writers, and `hash-key`."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.audit import GENESIS, AuditLog, Request, line_hash
from proxy.gate import Policy, Verdict, inspect
from tests.builders import AUDIT_FIELDS

ORPHAN_BODY: dict[str, Any] = {
    "model": "m",
    "input": [{"type": "function_call_output", "call_id": "call_1", "output": "x"}],
}
ORPHAN = inspect(ORPHAN_BODY, Policy())


def write_records(
    log: AuditLog, n: int, *, tag: str = "req", body: Any = None, verdict: Verdict = ORPHAN
) -> None:
    body = ORPHAN_BODY if body is None else body
    for i in range(n):
        log.write(Request(f"{tag}_{i}", "http", "/v1/responses", body, b"{}", None), verdict)


def fresh_log(path: Path, n: int, **kwargs: Any) -> list[bytes]:
    """Write n records to a new log at path; its lines, without newlines."""
    log = AuditLog(str(path), **kwargs)
    write_records(log, n)
    log.close()
    return path.read_bytes().splitlines()


def assert_chain(lines: list[bytes], start: str = GENESIS) -> None:
    expected = start
    for number, line in enumerate(lines, 1):
        assert json.loads(line)["prev"] == expected, f"line {number}"
        expected = line_hash(line)


def replay_proxy(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", *args], input=stdin, capture_output=True, timeout=60
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


# 1. The chain as the writer leaves it


def test_record_has_the_design_fields_and_a_fresh_chain_starts_at_zeros(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    entry = log.write(Request("req_1", "http", "/v1/responses", ORPHAN_BODY, b"{}", None), ORPHAN)
    log.close()

    [line] = (tmp_path / "audit.jsonl").read_bytes().splitlines()
    assert json.loads(line) == entry
    assert set(entry) == AUDIT_FIELDS
    assert entry["prev"] == GENESIS == "0" * 64


# The last line of the second case is longer than the block the tail is read back in.
BIG_ARGUMENTS = json.dumps({"q": "x" * 200_000})
BIG_BODY = {
    "model": "m",
    "input": [
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "search",
            "status": "completed",
            "arguments": BIG_ARGUMENTS,
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "x"},
    ],
}


@pytest.mark.parametrize(
    ("body", "min_line"),
    [
        pytest.param(ORPHAN_BODY, 0, id="short-lines"),
        pytest.param(BIG_BODY, 200_000, id="last-line-longer-than-a-tail-block"),
    ],
)
def test_chain_continues_across_restarts(tmp_path: Path, body: Any, min_line: int) -> None:
    path = tmp_path / "audit.jsonl"
    verdict = inspect(body, Policy())
    assert verdict.findings
    for tag, n in (("first", 3), ("second", 2), ("third", 1)):
        log = AuditLog(str(path), include_arguments=True)
        write_records(log, n, tag=tag, body=body, verdict=verdict)
        log.close()

    lines = path.read_bytes().splitlines()
    assert [json.loads(line)["request_id"] for line in lines] == [
        "first_0", "first_1", "first_2", "second_0", "second_1", "third_0"
    ]  # fmt: skip
    assert min(len(line) for line in lines) > min_line
    assert_chain(lines)


def test_stdout_keeps_a_chain_per_process(capfd: pytest.CaptureFixture[str]) -> None:
    log = AuditLog("-")
    write_records(log, 3)
    lines = capfd.readouterr().out.encode().splitlines()
    assert len(lines) == 3
    assert_chain(lines)


def test_a_line_cut_short_keeps_its_place_and_verify_finds_it(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    lines = fresh_log(path, 2)
    cut = lines[1][:40]
    path.write_bytes(lines[0] + b"\n" + cut)  # a crash in the middle of the second write

    log = AuditLog(str(path))
    write_records(log, 2, tag="after")
    log.close()

    after = path.read_bytes().splitlines()
    assert after[:2] == [lines[0], cut]
    assert json.loads(after[2])["prev"] == line_hash(cut)
    assert_chain(after[2:], start=line_hash(cut))
    done = replay_proxy("audit", "verify", str(path))
    assert done.returncode == 1
    assert done.stdout == f"{path}: line 2: not JSON\n"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"max_bytes": 0}, "max_bytes: 0 is not positive", id="max_bytes"),
        pytest.param({"keep": 0}, "keep: 0 is less than 1", id="keep"),
    ],
)
def test_bad_rotation_settings_are_refused(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        AuditLog(str(tmp_path / "audit.jsonl"), **kwargs)


# 2. `audit verify`: each tampering found at its line

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


# 3. Rotation keeps the chain from file to file


def test_rotation_starts_each_file_from_the_last_hash_of_the_one_before(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    one = len(fresh_log(tmp_path / "sizer.jsonl", 1)[0]) + 1
    max_bytes = 3 * one + one // 2  # three records a file

    fresh_log(path, 10, max_bytes=max_bytes)

    files = [Path(f"{path}.3"), Path(f"{path}.2"), Path(f"{path}.1"), path]
    assert sorted(tmp_path.glob("audit.jsonl*")) == sorted(files)
    assert [len(f.read_bytes().splitlines()) for f in files] == [3, 3, 3, 1]
    assert all(f.stat().st_size <= max_bytes for f in files)
    assert_chain([line for f in files for line in f.read_bytes().splitlines()])

    names = [str(f) for f in files]
    done = replay_proxy("audit", "verify", *names)
    assert done.returncode == 0, done.stdout
    assert done.stdout.splitlines()[-1].startswith(f"{path}: ok, 1 records, last hash ")

    # Alone, the newest file does not start a fresh chain; from the hash before it, it holds.
    alone = replay_proxy("audit", "verify", str(path))
    assert (alone.returncode, alone.stdout.split(":")[:2]) == (1, [str(path), " line 1"])
    last_of_older = line_hash(files[2].read_bytes().splitlines()[-1])
    assert replay_proxy("audit", "verify", "--prev", last_of_older, str(path)).returncode == 0

    # Out of order, the link between the files fails.
    swapped = replay_proxy("audit", "verify", *names[:1], names[2], names[1], names[3])
    assert swapped.returncode == 1
    assert swapped.stdout.splitlines()[-1] == (
        f"{files[2]}: line 1: prev is not the last hash of {files[0]}: records before it were "
        "deleted or edited, or the file continues another one"
    )


def test_rotation_keeps_only_the_newest_files(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    fresh_log(path, 8, max_bytes=1, keep=3)  # every record starts a new file

    files = [Path(f"{path}.3"), Path(f"{path}.2"), Path(f"{path}.1"), path]
    assert sorted(tmp_path.glob("audit.jsonl*")) == sorted(files)
    ids = [json.loads(f.read_bytes())["request_id"] for f in files]
    assert ids == ["req_4", "req_5", "req_6", "req_7"]
    oldest_prev = json.loads(files[0].read_bytes())["prev"]
    done = replay_proxy("audit", "verify", "--prev", oldest_prev, *map(str, files))
    assert done.returncode == 0, done.stdout


def test_an_interrupted_rotation_is_finished_not_repeated(tmp_path: Path) -> None:
    # A crash between linking the full file to `.1` and replacing it leaves both names on it.
    path = tmp_path / "audit.jsonl"
    [first] = fresh_log(path, 1)
    os.link(path, f"{path}.1")

    fresh_log(path, 1, max_bytes=1)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.jsonl", "audit.jsonl.1"]
    assert Path(f"{path}.1").read_bytes() == first + b"\n"
    done = replay_proxy("audit", "verify", f"{path}.1", str(path))
    assert done.returncode == 0, done.stdout


# 4. Several processes on one file keep one chain

WRITER = """
import os, sys, time
from pathlib import Path
from proxy.audit import AuditLog, Request
from proxy.gate import Policy, inspect

path, ready, go, tag, n, max_bytes = sys.argv[1:]
body = {"model": "m", "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}
verdict = inspect(body, Policy())
log = AuditLog(path, max_bytes=int(max_bytes) or None, keep=1000)
Path(ready).touch()
deadline = time.monotonic() + 30
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.001)
for i in range(int(n)):
    log.write(Request(f"{tag}_{i}", "http", "/v1/responses", body, b"{}", None), verdict)
log.close()
"""


@pytest.mark.parametrize(
    "max_bytes",
    [pytest.param(0, id="one-file"), pytest.param(20_000, id="rotating")],
)
def test_concurrent_writers_keep_one_valid_chain(tmp_path: Path, max_bytes: int) -> None:
    path, go, ready = tmp_path / "audit.jsonl", tmp_path / "go", tmp_path / "ready"
    ready.mkdir()
    writers, n = ["a", "b", "c"], 300
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, *map(str, (path, ready / tag, go, tag, n, max_bytes))]
        )
        for tag in writers
    ]
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

    rotated = sorted(tmp_path.glob("audit.jsonl.*"), key=lambda f: -int(f.suffix[1:]))
    files = [*rotated, path]
    if max_bytes:
        assert len(files) > 3
        assert all(f.stat().st_size <= max_bytes for f in files)
    else:
        assert files == [path]
    lines = [line for f in files for line in f.read_bytes().splitlines()]
    assert_chain(lines)
    ids = Counter(json.loads(line)["request_id"] for line in lines)
    assert ids == Counter(f"{tag}_{i}" for tag in writers for i in range(n))
    done = replay_proxy("audit", "verify", *map(str, files))
    assert done.returncode == 0, done.stdout
    assert done.stdout.splitlines()[-1].startswith(f"{path}: ok, ")


# 5. hash-key


@pytest.mark.parametrize(
    ("stdin", "key"),
    [
        pytest.param(b"sk-test-1\n", b"sk-test-1", id="newline"),
        pytest.param(b"sk-test-1", b"sk-test-1", id="no-newline"),
        pytest.param(b"sk-test-1\r\n", b"sk-test-1", id="crlf"),
        pytest.param(b"spaced key\n", b"spaced key", id="inner-space-kept"),
        pytest.param("ключ-🔑\n".encode(), "ключ-🔑".encode(), id="utf-8"),
    ],
)
def test_hash_key_prints_the_sha256_of_the_key(stdin: bytes, key: bytes) -> None:
    done = replay_proxy("hash-key", stdin=stdin)
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        hashlib.sha256(key).hexdigest() + "\n",
        "",
    )


@pytest.mark.parametrize("stdin", [b"", b"\n", b"\r\n"], ids=["empty", "newline", "crlf"])
def test_hash_key_refuses_an_empty_key(stdin: bytes) -> None:
    done = replay_proxy("hash-key", stdin=stdin)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "replay-proxy: hash-key: the key is empty\n"


@pytest.mark.parametrize(
    "stdin",
    [b" sk-test-1\n", b"sk-test-1 \n", b"sk-test-1\t", b"sk-test-1\n\n"],
    ids=["leading-space", "trailing-space", "tab", "second-newline"],
)
def test_hash_key_refuses_a_key_no_request_can_carry(stdin: bytes) -> None:
    """Header values are trimmed, and so is a Bearer token: the hash could never match."""
    done = replay_proxy("hash-key", stdin=stdin)
    assert (done.returncode, done.stdout) == (2, "")
    assert "starts or ends with whitespace" in done.stderr
