"""Several processes on one audit file keep one chain."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.state.audit_logs import assert_chain, replay_proxy

WRITER = """
import os, sys, time
from pathlib import Path
from proxy.state.audit import AuditLog, AuditedRequest
from proxy.gate.policy import Policy
from proxy.gate.verdict import inspect

path, ready, go, tag, n, max_bytes = sys.argv[1:]
body = {"model": "m", "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}
verdict = inspect(body, Policy())
log = AuditLog(path, max_bytes=int(max_bytes) or None, keep=1000)
Path(ready).touch()
deadline = time.monotonic() + 30
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.001)
for i in range(int(n)):
    log.write(AuditedRequest(f"{tag}_{i}", "http", "/v1/responses", body, b"{}", None), verdict)
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
