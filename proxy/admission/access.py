"""What one request did, as its access line tells it: a plain value the fronts fill in."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from proxy.gate.reasons import Outcome


@dataclass(slots=True)
class Access:
    """What one request did, filled in as it goes; logged once its answer is done. It holds
    no header, query or body value: nothing a client sent beyond its method and path."""

    request_id: str
    method: str
    path: str
    started: float = field(default_factory=time.perf_counter)
    route: str | None = None
    tenant: str | None = None
    upstream: str | None = None
    # forward, strip, rewrite, block, error (`code` says which), admin, client_gone (it hung up
    # first) or upstream_cut (the upstream failed after the answer began)
    outcome: Outcome | None = None
    code: str | None = None
    status: int | None = None
    bytes: int = 0
    body_bytes: int | None = None
    upstream_s: float | None = None
    gate_s: float | None = None
    # Findings by action (block, strip, rewrite, log); on a WebSocket, over all its frames.
    # (A dict: a Counter made for every request costs two calls of Python, for a rare use.)
    findings: dict[str, int] = field(default_factory=dict)
    frames: int | None = None

    def found(self, actions: Iterable[str]) -> None:
        """Findings with these actions, counted."""
        findings = self.findings
        for action in actions:
            findings[action] = findings.get(action, 0) + 1

    def failed(self, code: str) -> None:
        """The proxy answered with an error of its own."""
        self.code = code
        self.outcome = Outcome.BLOCK if code == "replay_rejected" else Outcome.ERROR

    def fields(self) -> dict[str, Any]:
        """The access line's fields, in the order the text line shows them."""
        elapsed = time.perf_counter() - self.started
        found: dict[str, Any] = {
            "method": self.method,
            "path": self.path,
            "route": self.route,
            "tenant": self.tenant,
            "upstream": self.upstream,
            "outcome": self.outcome,
            "code": self.code,
            "status": self.status,
            "bytes": self.bytes,
            "body_bytes": self.body_bytes,
            "findings": sum(self.findings.values()),
            **{f"findings_{action}": n for action, n in sorted(self.findings.items())},
            "frames": self.frames,
            "upstream_ms": _ms(self.upstream_s),
            "gate_ms": _ms(self.gate_s),
            "duration_ms": _ms(elapsed),
        }
        return {name: value for name, value in found.items() if value is not None}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
