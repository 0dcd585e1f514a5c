"""The audit report and tail read door 2's records: the model's own calls, apart from replays."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.gate.caches import GateCaches
from proxy.gate.emitted import ToolSchemas, emitted_calls, iter_emitted
from proxy.gate.items import tool_schemas
from proxy.gate.policy import Policy
from proxy.running.report import Entry, ModelCalls, Summary, render_text, summarize
from proxy.running.report_html import render_html
from proxy.state.audit import AuditLog, Relayed, emitted_record
from tests.builders import FINDING, GLOBAL, TOOLS, audit_record, call, orphan_finding
from tests.state.audit_logs import replay_proxy

EMITTED = "emitted_call_rejected"
AT = "2026-11-29T09:00:00Z"


def emitted(*findings: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """An emitted-call record: a rejected replay's fields, `response_id`, findings at outputs."""
    found = [f | {"output_index": f["index"], "paired_index": None} for f in findings or [FINDING]]
    return audit_record(AT, *found, event=EMITTED, action="log", response_id="resp_1", **fields)


def summary_of(*records: dict[str, Any]) -> Summary:
    return summarize(["a.jsonl"], [Entry("a.jsonl", n, r) for n, r in enumerate(records, 1)])


@pytest.mark.parametrize(
    ("records", "view", "expected"),
    [
        pytest.param(
            [emitted(), emitted(FINDING, FINDING | {"name": "lookup"})],
            lambda s: s.model_calls,
            ModelCalls(
                2, 3, (("arguments_schema", 3),), (("get_latest_sales_report", 2), ("lookup", 1))
            ),
            id="model-calls-counted",
        ),
        pytest.param(
            [emitted(), audit_record(AT, orphan_finding(), action="log")],
            lambda s: (s.would_block.requests, s.would_block.reasons),
            (1, (("orphan", 1),)),
            id="block-would-not-have-stopped-an-answer",
        ),
        pytest.param(
            [emitted(), audit_record(AT)],
            lambda s: [(t.key, t.requests) for t in s.events],
            [(EMITTED, 1), ("replay_rejected", 1)],
            id="events-apart",
        ),
        pytest.param(
            [emitted(), audit_record(AT)],
            lambda s: (s.records, s.findings, [(t.key, t.findings) for t in s.reasons]),
            (2, 2, [("arguments_schema", 2)]),
            id="in-the-reason-counts",
        ),
        pytest.param(
            [audit_record(AT)],
            lambda s: s.model_calls,
            ModelCalls(0, 0, (), ()),
            id="none",
        ),
    ],
)
def test_summary(
    records: list[dict[str, Any]], view: Callable[[Summary], Any], expected: Any
) -> None:
    assert view(summary_of(*records)) == expected


def test_text_and_page_say_the_calls_were_relayed_as_they_came() -> None:
    summary = summary_of(emitted(), audit_record(AT, action="log"))

    text = render_text(summary)
    page = render_html(summary)

    assert f"the model's own calls that failed their schema ({EMITTED}" in text
    assert "  1 call(s) in 1 response(s)" in text
    assert "  1 request(s) forwarded with 1 finding(s)" in text  # only the replay
    assert "The model's own calls that failed their schema" in page
    assert "no record has action log" not in text
    assert "model's own" not in render_text(summary_of(audit_record(AT)))
    alone = render_text(summary_of(emitted()))
    assert "  nothing: no replay has action log (the model's own calls below never are)" in alone


def write_emitted(path: Path) -> None:
    """A record the proxy writes for a response whose call fails its schema."""
    response = {"id": "resp_9", "model": "m", "output": [{"type": "message"}, call("c1", GLOBAL)]}
    schemas = ToolSchemas(tool_schemas(TOOLS), Policy(), GateCaches())
    judged = iter_emitted(emitted_calls(response["output"]), schemas)
    findings = [e.finding for e in judged if e.finding is not None]
    log = AuditLog(str(path))
    relayed = Relayed("req_9", "http", "/v1/responses", "t_1", b"{}")
    log.append(emitted_record(relayed, response, findings, include_arguments=False))
    log.close()


def test_the_commands_read_a_record_the_proxy_writes(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write_emitted(path)

    report = replay_proxy("audit", "report", str(path))
    page = replay_proxy("audit", "report", "--html", str(tmp_path / "r.html"), str(path))
    tail = replay_proxy("audit", "tail", str(path))
    verify = replay_proxy("audit", "verify", str(path))

    assert (report.returncode, report.stderr) == (0, "")
    assert "1 call(s) in 1 response(s)" in report.stdout
    assert "by tool: get_latest_sales_report 1" in report.stdout
    assert page.returncode == 0, page.stderr
    assert "1 call(s) in 1 response(s)" in (tmp_path / "r.html").read_text()
    assert tail.returncode == 0, tail.stderr
    [shown] = tail.stdout.splitlines()
    assert " emitted_call_rejected tenant t_1 response_id resp_9: output[1] (call_id c1) " in shown
    assert shown.endswith(
        "get_latest_sales_report: region failed schema: expected one of apac, emea, amer"
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
