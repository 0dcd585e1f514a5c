"""Audit logs for the audit tests: records written, a fresh log, the chain checked, the CLI run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from proxy.gate.policy import Policy
from proxy.gate.verdict import Verdict, inspect
from proxy.state.audit import GENESIS, AuditedRequest, AuditLog, line_hash

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
        log.write(AuditedRequest(f"{tag}_{i}", "http", "/v1/responses", body, b"{}", None), verdict)


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
