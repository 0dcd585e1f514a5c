"""Admin endpoints: health and metrics."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.builders import (
    SALES_SCHEMA,
    SALES_TOOL,
    at,
    clean_body,
    failing_body,
    request_body,
    sales_call,
    sales_output,
    tool,
)
from tests.fixture_types import ProxyFactory
from tests.server.checks import metric, scrape
from tests.servers.recording import RecordingUpstream


async def test_healthy(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    base = await start_proxy(recording_upstream.url)

    async with client.get(at(base, "/-/healthy")) as resp:
        assert resp.status == 200

    assert recording_upstream.received == []


async def test_metrics_count_requests_findings_gate_time_and_streams(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    base = await start_proxy(recording_upstream.url)
    requests: list[tuple[str, str, Any, int]] = [
        ("POST", "/v1/responses", clean_body(), 200),
        ("POST", "/v1/responses", failing_body(), 400),
        ("POST", "/v1/responses/compact", failing_body(), 400),
        ("POST", "/v1/responses", [], 400),
        ("GET", "/v1/models", None, 200),
    ]
    for method, target, body, status in requests:
        async with client.request(method, at(base, target), json=body) as resp:
            assert resp.status == status

    text = await scrape(client, base)

    counted = [
        # route, outcome, upstream, dialect
        ("responses", "forward", "default", "responses"),
        ("responses", "block", "default", "responses"),
        ("responses_compact", "block", "default", "responses"),
        ("responses", "invalid", "-", "responses"),
        ("passthrough", "forward", "default", "-"),
    ]
    for route, outcome, upstream, dialect in counted:
        labels = {"route": route, "outcome": outcome, "upstream": upstream, "dialect": dialect}
        assert metric(text, "replay_proxy_requests_total", **labels) == 1, labels
    findings = "replay_proxy_findings_total"
    labels = {
        "reason": "arguments_schema",
        "action": "block",
        "tool": "(unpinned)",
        "dialect": "responses",
    }
    assert metric(text, findings, **labels) == 2
    assert "# TYPE replay_proxy_gate_seconds histogram" in text
    assert metric(text, "replay_proxy_gate_seconds_count") == 3
    assert metric(text, "replay_proxy_gate_seconds_bucket", le="+Inf") == 3
    assert metric(text, "replay_proxy_open_streams") == 0
    assert [r.target for r in recording_upstream.received] == ["/v1/responses", "/v1/models"]


async def test_verdict_cache_gauge_counts_what_the_gate_remembers(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """The gauge reads the caches the front owns for the policy in force."""
    base = await start_proxy(recording_upstream.url)
    assert metric(await scrape(client, base), "replay_proxy_verdict_cache_entries") == 0
    bodies = [clean_body(), clean_body(), failing_body()]  # the second call is the first again
    for body in bodies:
        async with client.post(at(base, "/v1/responses"), json=body) as resp:
            await resp.read()

    assert metric(await scrape(client, base), "replay_proxy_verdict_cache_entries") == 2


async def test_findings_name_the_tool_only_when_the_config_pins_it(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    """A tool the request declares is the client's to name: it is counted as `(unpinned)`; a
    finding about no call (an orphan output) as `-`."""
    base = await start_proxy(
        recording_upstream.url,
        gate={"action": "log"},
        tools={"get_latest_sales_report": SALES_SCHEMA},
    )
    unpinned = tool({"type": "object", "required": ["x"]}, name="made_up_by_the_client")
    bodies = [
        failing_body(),
        request_body(sales_output("call_9")),
        request_body(
            sales_call("call_2") | {"name": "made_up_by_the_client"},
            sales_output("call_2"),
            tools=[SALES_TOOL, unpinned],
        ),
    ]
    for body in bodies:
        async with client.post(at(base, "/v1/responses"), json=body) as resp:
            assert resp.status == 200
            assert resp.headers["x-replay-gate"] == "logged=1"

    text = await scrape(client, base)
    findings = "replay_proxy_findings_total"
    pinned = {
        "reason": "arguments_schema",
        "action": "log",
        "tool": "get_latest_sales_report",
        "dialect": "responses",
    }
    assert metric(text, findings, **pinned) == 1
    assert metric(text, findings, reason="orphan", action="log", tool="-", dialect="responses") == 1
    assert metric(text, findings, **(pinned | {"tool": "(unpinned)"})) == 1
    assert "made_up_by_the_client" not in text
    assert len(recording_upstream.received) == 3
