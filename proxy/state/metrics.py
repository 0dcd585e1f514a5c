"""Prometheus metrics of one proxy process, in a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """Requests by route and outcome, findings by reason and action, gate time, open streams."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "replay_proxy_requests",
            "Requests handled, by route and outcome.",
            ["route", "outcome"],
            registry=self.registry,
        )
        self.findings = Counter(
            "replay_proxy_findings",
            "Replay gate findings, by reason and action.",
            ["reason", "action"],
            registry=self.registry,
        )
        self.gate_seconds = Histogram(
            "replay_proxy_gate_seconds",
            "Time spent reading, parsing and gating a request body.",
            buckets=(
                0.00005,
                0.0001,
                0.00025,
                0.0005,
                0.001,
                0.0025,
                0.005,
                0.01,
                0.025,
                0.05,
                0.1,
                0.25,
                1.0,
            ),
            registry=self.registry,
        )
        self.open_streams = Gauge(
            "replay_proxy_open_streams",
            "Answers being relayed from the upstream right now.",
            registry=self.registry,
        )

        self.ledger_faults = Counter(
            "replay_proxy_ledger_faults",
            "Ledger reads and writes that failed or timed out, by operation.",
            ["operation"],
            registry=self.registry,
        )
        self.ledger_responses = Gauge(
            "replay_proxy_ledger_responses",
            "Responses this process holds in its memory ledger (or wrote to Redis).",
            registry=self.registry,
        )

        self.verdict_cache = Gauge(
            "replay_proxy_verdict_cache_entries",
            "Remembered (schema, arguments) verdicts of the gate config in force.",
            registry=self.registry,
        )

        self.emitted_calls = Counter(
            "replay_proxy_emitted_calls",
            "Function calls upstreams emitted on the gated routes, by tool and verdict.",
            ["tool", "verdict"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
