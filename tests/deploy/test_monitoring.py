"""deploy/monitoring/: the alert rules pass `promtool check rules` and their own `promtool test
rules` (input series for each alert), the dashboard's queries parse, and every metric a rule or
a panel reads is one a real proxy's scrape shows."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import clean_body, failing_body, request_body, sales_output
from tests.deploy.test_deploy import DEPLOY
from tests.running.test_serve import start
from tests.servers.recording import RecordingUpstream

MONITORING = DEPLOY / "monitoring"
# Series Prometheus itself adds to every target's scrape: never in the proxy's text.
PROMETHEUS_OWN = frozenset({"up"})
# Metrics the rules or the dashboard may read before a proxy's scrape shows them: none.
NOT_YET_SCRAPED: frozenset[str] = frozenset()
# The PromQL words the queries use that are not metric names.
PROMQL = frozenset(
    {"sum", "max", "count", "rate", "increase", "histogram_quantile"}
    | {"and", "or", "unless", "offset", "by", "without"}
)


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail(
            "promtool is not installed (Debian's prometheus package: apt-get install prometheus)"
        )
    return found


def run_promtool(*args: str, cwd: Path = MONITORING) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load((MONITORING / "alerts.yaml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((MONITORING / "dashboard.json").read_text())
    return loaded


def dashboard_queries() -> list[str]:
    return [
        target["expr"] for panel in dashboard()["panels"] for target in panel.get("targets", [])
    ]


def as_promql(query: str) -> str:
    """A dashboard query as Prometheus reads it once Grafana has put in its variables."""
    return query.replace("$__rate_interval", "5m").replace("$job", ".*")


def metric_names(query: str) -> set[str]:
    """The metric names a PromQL query reads: its words outside strings, label matchers,
    ranges and `by (…)` lists, less functions, keywords and numbers."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', "", query)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", bare)
    bare = re.sub(r"\b(?:by|without)\s*\([^)]*\)", " ", bare)
    words = set(re.findall(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", bare))
    return words - PROMQL


def test_the_rules_pass_promtool_check() -> None:
    done = run_promtool("check", "rules", "alerts.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_each_alert_fires_on_its_input_series() -> None:
    done = run_promtool("test", "rules", "alerts.test.yaml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_case_where_it_fires() -> None:
    tests = yaml.safe_load((MONITORING / "alerts.test.yaml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    assert fired == alerts
    assert {
        "ReplayProxyRejectionRateJump",
        "ReplayProxyLedgerFaults",
        "ReplayProxyAuditWriteFailures",
        "ReplayProxyWorkersMissing",
        "ReplayProxyUpstreamErrors",
        "ReplayProxyDown",
        "ReplayProxyNotReady",
    } <= alerts


def test_promtool_test_can_fail(tmp_path: Path) -> None:
    """An alert expected where its series do not make it fire is a failure."""
    shutil.copy(MONITORING / "alerts.yaml", tmp_path / "alerts.yaml")
    wrong = {
        "rule_files": ["alerts.yaml"],
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": 'replay_proxy_workers_missing{instance="a"}', "values": "0x20"}
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "15m",
                        "alertname": "ReplayProxyWorkersMissing",
                        "exp_alerts": [{"exp_labels": {"instance": "a", "severity": "warning"}}],
                    }
                ],
            }
        ],
    }
    (tmp_path / "wrong.test.yaml").write_text(yaml.safe_dump(wrong))
    done = run_promtool("test", "rules", "wrong.test.yaml", cwd=tmp_path)
    assert done.returncode != 0
    assert "FAILED" in done.stdout + done.stderr


def test_the_dashboard_queries_parse(tmp_path: Path) -> None:
    """promtool parses each query, as the expression of a recording rule."""
    queries = dashboard_queries()
    assert queries
    group = {
        "name": "dashboard",
        "rules": [
            {"record": f"dashboard:query{n}", "expr": as_promql(q)} for n, q in enumerate(queries)
        ],
    }
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump({"groups": [group]}))
    done = run_promtool("check", "rules", "queries.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_shows_what_the_issue_asks() -> None:
    board = dashboard()
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "job"}
    queries = " ".join(dashboard_queries())
    for shown in (
        'replay_proxy_findings_total{job=~"$job",action="log"}',  # would have been blocked
        "sum by (reason, action) (rate(replay_proxy_findings_total",
        "sum by (tool) (rate(replay_proxy_findings_total",
        "sum by (upstream, outcome) (rate(replay_proxy_requests_total",
        "replay_proxy_gate_seconds_bucket",
        "replay_proxy_upstream_seconds_bucket",
        "replay_proxy_ledger_faults_total",
        "replay_proxy_emitted_calls_total",
        "replay_proxy_workers_missing",
        "replay_proxy_ready",
    ):
        assert shown in queries, shown
    for panel in board["panels"]:
        if panel["type"] not in ("row", "text"):
            assert panel["targets"], panel["title"]


def test_the_metric_name_reader_reads_names() -> None:
    query = (
        'sum by (le, upstream) (rate(replay_proxy_upstream_seconds_bucket{job=~"a|b"}[5m]))'
        " / ignoring_me_not:recorded > 3 * (up offset 10m)"
    )
    assert metric_names(query) == {
        "replay_proxy_upstream_seconds_bucket",
        "ignoring_me_not:recorded",
        "up",
    }


def scraped_names(text: str) -> set[str]:
    """Every series name a scrape shows or declares: a family without samples yet (a counter
    with labels before its first event) is declared by its `# TYPE` line."""
    found: set[str] = set()
    for family in text_string_to_metric_families(text):
        found |= {sample.name for sample in family.samples}
        if family.type == "counter":
            found.add(family.name + "_total")
        elif family.type == "histogram":
            found |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
        else:
            found.add(family.name)
    return found


async def test_every_metric_read_is_in_a_real_scrape(
    tmp_path: Path, recording_upstream: RecordingUpstream
) -> None:
    """A real `replay-proxy serve` in front of a real upstream takes clean, blocked and logged
    requests; the names its `/-/metrics` shows are every name the rules and panels read."""
    config = tmp_path / "proxy.yaml"
    config.write_text(
        f"gate: {{actions: {{orphan: log}}}}\naudit: {{path: '{tmp_path / 'audit.jsonl'}'}}\n"
    )
    proxy = await start("--config", str(config), "--upstream", recording_upstream.url)
    try:
        async with aiohttp.ClientSession() as session:
            for body, status, gate in (
                (clean_body(), 200, None),
                (failing_body(), 400, None),
                (request_body(sales_output("call_9")), 200, "logged=1"),
            ):
                async with session.post(proxy.url + "/v1/responses", json=body) as response:
                    assert response.status == status
                    assert response.headers.get("x-replay-gate") == gate
            async with session.get(proxy.url + "/-/metrics") as response:
                assert response.status == 200
                text = await response.text()
    finally:
        assert await proxy.stop() == 0
    assert len(recording_upstream.received) == 2

    recorded = {rule["record"] for rule in rules() if "record" in rule}
    queries = [rule["expr"] for rule in rules()] + [as_promql(q) for q in dashboard_queries()]
    read = set().union(*(metric_names(q) for q in queries))
    assert "replay_proxy_findings_total" in read
    missing = read - recorded - PROMETHEUS_OWN - scraped_names(text)
    assert missing == NOT_YET_SCRAPED
