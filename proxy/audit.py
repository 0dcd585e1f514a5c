"""The audit record of a rejected replay: its one format and its writer (a JSONL file or stdout)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from proxy.gate import Verdict

_OUTCOME_ACTION = {"block": "block", "strip": "strip", "forward": "log"}


def tenant_of(credential: str | None) -> str | None:
    """A short, stable fingerprint of a client credential; never the credential itself."""
    if not credential:
        return None
    return "t_" + hashlib.sha256(credential.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True)
class Request:
    """What the audit record says of the request a verdict was made on."""

    request_id: str
    transport: str
    path: str
    body: Any
    raw: bytes
    tenant: str | None


def record(request: Request, verdict: Verdict, *, include_arguments: bool) -> dict[str, Any]:
    """The audit record of DESIGN.md for a request that had findings."""
    body = request.body if isinstance(request.body, dict) else {}
    model = body.get("model")
    previous = body.get("previous_response_id")
    return {
        "ts": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "event": "replay_rejected",
        "request_id": request.request_id,
        "action": _OUTCOME_ACTION[verdict.outcome],
        "transport": request.transport,
        "path": request.path,
        "model": model if isinstance(model, str) else None,
        "previous_response_id": previous if isinstance(previous, str) else None,
        "tenant": request.tenant,
        "body_sha256": hashlib.sha256(request.raw).hexdigest(),
        "findings": [f.as_dict(include_arguments=include_arguments) for f in verdict.findings],
    }


class AuditLog:
    """Appends one JSON line per record and flushes it before the caller answers."""

    def __init__(self, path: str, *, include_arguments: bool = False) -> None:
        self.path = path
        self.include_arguments = include_arguments
        # O_APPEND and one write() per record: workers sharing the file never interleave lines.
        self._fd = (
            sys.stdout.fileno()
            if path == "-"
            else os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        )

    def write(self, request: Request, verdict: Verdict) -> dict[str, Any]:
        entry = record(request, verdict, include_arguments=self.include_arguments)
        # stdlib json with ASCII escapes: any value the gate saw can be written, big integers too.
        line = json.dumps(entry, separators=(",", ":")).encode("ascii") + b"\n"
        if self.path == "-":
            sys.stdout.flush()
        written = os.write(self._fd, line)
        while written < len(line):
            written += os.write(self._fd, line[written:])
        return entry

    def close(self) -> None:
        if self.path != "-":
            os.close(self._fd)
