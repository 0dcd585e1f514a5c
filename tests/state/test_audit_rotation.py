"""Rotation keeps the audit chain from file to file."""

from __future__ import annotations

import json
import os
from pathlib import Path

from proxy.state.audit import line_hash
from tests.state.audit_logs import assert_chain, fresh_log, replay_proxy


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
