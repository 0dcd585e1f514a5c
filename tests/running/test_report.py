"""`audit report`: records read line by line, summed per dimension and over time, as text."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from proxy.gate.policy import Policy
from proxy.gate.verdict import inspect
from proxy.running.config_file import iter_defaults, load_config
from proxy.running.report import (
    MAX_BARS,
    Entry,
    Headline,
    Summary,
    UnreadableLine,
    iter_entries,
    read_judged,
    render_text,
    summarize,
)
from proxy.running.report_html import render_html
from proxy.settings import ConfigError
from proxy.state.audit import AuditedRequest, AuditLog
from tests.builders import FINDING, audit_record, failing_body, orphan_finding
from tests.state.audit_logs import ORPHAN, replay_proxy


def line(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry).encode() + b"\n"


RECORD = line(audit_record())


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        pytest.param([RECORD], [(1, None)], id="record"),
        pytest.param(
            [RECORD, b"garbage\n", RECORD],
            [(1, None), (2, "not JSON"), (3, None)],
            id="broken-line-in-the-middle",
        ),
        pytest.param([b"\n", RECORD], [(1, "blank line"), (2, None)], id="blank-line"),
        pytest.param([b"[1, 2]\n"], [(1, "not a JSON object")], id="array"),
        pytest.param(
            [b'{"ts": "x"}\n'], [(1, "not an audit record: no findings array")], id="no-findings"
        ),
        pytest.param(
            [RECORD, RECORD[:40]],
            [(1, None), (2, "not JSON (no newline at the end: the record was cut short)")],
            id="cut-short",
        ),
        pytest.param([RECORD.rstrip(b"\n")], [(1, None)], id="whole-without-newline"),
        pytest.param([RECORD.replace(b"\n", b"\r\n")], [(1, None)], id="crlf"),
    ],
)
def test_lines_are_read_one_by_one(
    lines: list[bytes], expected: list[tuple[int, str | None]]
) -> None:
    got = list(iter_entries("audit.jsonl", lines))
    assert [(e.line, e.reason if isinstance(e, UnreadableLine) else None) for e in got] == expected
    assert all(e.file == "audit.jsonl" for e in got)


def sales(path: str = "/region", keyword: str = "enum", name: str = "sales") -> dict[str, Any]:
    return FINDING | {"name": name, "fail": [{"path": path, "reason": keyword}]}


def entries(*records: dict[str, Any]) -> list[Entry | UnreadableLine]:
    return [Entry("a.jsonl", n, r) for n, r in enumerate(records, 1)]


def at(hour: int, day: int = 29) -> str:
    return f"2026-11-{day:02d}T{hour:02d}:15:00.000Z"


def rows(tallies: Any) -> list[tuple[Any, int, int]]:
    return [(t.key, t.requests, t.findings) for t in tallies]


TWO_FINDINGS = audit_record(at(9), sales(), orphan_finding(), tenant="t_a", upstream="openai")


@pytest.mark.parametrize(
    ("records", "view", "expected"),
    [
        pytest.param(
            [TWO_FINDINGS, audit_record(at(9), sales(), sales("/x", "required"))],
            lambda s: (s.records, s.findings),
            (2, 4),
            id="records-and-findings",
        ),
        pytest.param(
            [TWO_FINDINGS, audit_record(at(9), sales(), sales("/x", "required"))],
            lambda s: rows(s.reasons),
            [("arguments_schema", 2, 3), ("orphan", 1, 1)],
            id="by-reason",
        ),
        pytest.param(
            [TWO_FINDINGS, audit_record(at(9), sales(name="lookup"))],
            lambda s: rows(s.tools),
            [("lookup", 1, 1), ("sales", 1, 1), (None, 1, 1)],
            id="by-tool-an-orphan-has-none",
        ),
        pytest.param(
            [TWO_FINDINGS, audit_record(at(9), tenant=None), audit_record(at(9), tenant="t_a")],
            lambda s: rows(s.tenants),
            [("t_a", 2, 3), (None, 1, 1)],
            id="by-tenant",
        ),
        pytest.param(
            [TWO_FINDINGS, audit_record(at(9))],
            lambda s: rows(s.upstreams),
            [("openai", 1, 2), (None, 1, 1)],
            id="by-upstream-missing-in-older-records",
        ),
        pytest.param(
            [audit_record(at(9)), audit_record(at(9), action="log"), audit_record(at(9))],
            lambda s: rows(s.actions),
            [("block", 2, 2), ("log", 1, 1)],
            id="by-action",
        ),
        pytest.param(
            [audit_record(at(9)), audit_record(at(9), event="emitted_call_rejected")],
            lambda s: rows(s.events),
            [("emitted_call_rejected", 1, 1), ("replay_rejected", 1, 1)],
            id="by-event",
        ),
        pytest.param(
            [
                audit_record(at(9), path="/v1/chat/completions"),
                audit_record(at(9), sales(), orphan_finding(), path="/v1/chat/completions"),
                audit_record(at(9)),
                audit_record(at(9), path="/v1/responses/compact"),
                audit_record(at(9), path="/mcp/orders"),
            ],
            lambda s: (rows(s.dialects), rows(s.request_paths)),
            (
                [("chat", 2, 3), ("responses", 2, 2), (None, 1, 1)],
                [
                    ("/v1/chat/completions", 2, 3),
                    ("/mcp/orders", 1, 1),
                    ("/v1/responses", 1, 1),
                    ("/v1/responses/compact", 1, 1),
                ],
            ),
            id="by-dialect-as-the-path-says",
        ),
        pytest.param(
            [audit_record(at(9), tenant=["odd"])],
            lambda s: rows(s.tenants),
            [('["odd"]', 1, 1)],
            id="a-value-not-a-string-is-shown-as-json",
        ),
        pytest.param(
            [audit_record(at(9, day=28)), audit_record(at(20))],
            lambda s: [(t.hour, [r for r, _ in c]) for t, c in s.timeline][:3],
            [(9, ["arguments_schema"]), (10, []), (11, [])],
            id="per-hour-with-the-empty-hours",
        ),
        pytest.param(
            [audit_record(at(9, day=1)), audit_record(at(3, day=30), orphan_finding())],
            lambda s: (s.bucket, len(s.timeline), dict(s.timeline[0][1]), dict(s.timeline[-1][1])),
            ("day", 30, {"arguments_schema": 1}, {"orphan": 1}),
            id="per-day-past-the-ladder",
        ),
        pytest.param(
            [audit_record("2026-11-29T09:00:00+02:00")],
            lambda s: s.first,
            datetime(2026, 11, 29, 7, tzinfo=UTC),
            id="ts-with-an-offset-in-utc",
        ),
        pytest.param(
            [audit_record(at(9)), audit_record("yesterday"), audit_record(None)],
            lambda s: (s.undated, sum(n for _, c in s.timeline for _, n in c), s.records),
            (2, 1, 3),
            id="undated-counted-but-not-in-time",
        ),
        pytest.param(
            [
                audit_record(at(9), sales(), sales("/x", "required"), sales()),
                audit_record(at(9), sales(name="lookup")),
            ],
            lambda s: s.top_paths,
            (
                ("sales", "/region", "enum", 2),
                ("lookup", "/region", "enum", 1),
                ("sales", "/x", "required", 1),
            ),
            id="top-failing-paths",
        ),
        pytest.param(
            [audit_record(at(9), sales(), sales("/x", "required"), orphan_finding())],
            lambda s: [(t.name, t.reasons, t.paths) for t in s.per_tool],
            [
                (
                    "sales",
                    (("arguments_schema", 2),),
                    (("/region", "enum", 1), ("/x", "required", 1)),
                ),
                (None, (("orphan", 1),), ()),
            ],
            id="per-tool",
        ),
        pytest.param(
            [
                audit_record(at(9), request_id="req_blocked"),
                audit_record(at(9), sales(), orphan_finding(), action="log", request_id="req_a"),
                audit_record(at(10), action="log", request_id="req_b"),
                audit_record(at(10), action="strip", request_id="req_stripped"),
            ],
            lambda s: (
                s.would_block.requests,
                s.would_block.findings,
                s.would_block.reasons,
                s.would_block.tools,
                s.would_block.request_ids,
            ),
            (
                2,
                3,
                (("arguments_schema", 2), ("orphan", 1)),
                (("get_latest_sales_report", 1), ("sales", 1), (None, 1)),
                ("req_b", "req_a"),
            ),
            id="what-block-would-have-blocked-only-log",
        ),
        pytest.param(
            [
                audit_record(at(h), action="log", request_id=f"req_{h}")
                for h in (3, 1, 7, 5, 2, 6, 4)
            ],
            lambda s: s.would_block.request_ids,
            ("req_7", "req_6", "req_5", "req_4", "req_3"),
            id="would-have-blocked-names-the-latest-five",
        ),
    ],
)
def test_summary(
    records: list[dict[str, Any]], view: Callable[[Summary], Any], expected: Any
) -> None:
    assert view(summarize(["a.jsonl"], entries(*records))) == expected


def _ts(seconds: float) -> str:
    ts = datetime(2026, 11, 29, 9, 0, 0, tzinfo=UTC) + timedelta(seconds=seconds)
    return ts.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@pytest.mark.parametrize(
    ("span_s", "bucket", "bars"),
    [
        pytest.param(0, "second", 1, id="one-record"),
        pytest.param(6, "second", 7, id="six-second-rollout"),
        pytest.param(59, "second", 60, id="a-minute-in-seconds"),
        pytest.param(60, "5 seconds", 13, id="past-sixty-seconds"),
        pytest.param(600, "15 seconds", 41, id="ten-minutes"),
        pytest.param(3600, "minute", 61 - 1, id="an-hour-in-minutes"),
        pytest.param(4 * 3600, "5 minutes", 49, id="four-hours"),
        pytest.param(12 * 3600, "15 minutes", 49, id="half-a-day"),
        pytest.param(2 * 86400, "hour", 49, id="two-days"),
        pytest.param(7 * 86400, "6 hours", 29, id="a-week"),
        pytest.param(30 * 86400, "day", 31, id="a-month"),
    ],
)
def test_the_time_buckets_fit_the_span(span_s: int, bucket: str, bars: int) -> None:
    # An hour from 09:00:00 to 09:59:59.9 is 60 minutes; the span's end is its last record.
    end = span_s - 0.1 if span_s == 3600 else span_s
    summary = summarize(["a.jsonl"], entries(audit_record(_ts(0)), audit_record(_ts(end))))
    assert (summary.bucket, len(summary.timeline)) == (bucket, bars)
    assert len(summary.timeline) <= MAX_BARS
    # Buckets start on their width's round times (UTC): 09:00:00, 09:05:00, 12:00, midnight.
    starts = [start for start, _ in summary.timeline]
    assert all((start - starts[0]) % summary.width == timedelta(0) for start in starts)
    assert starts[0].hour in {0, 6, 9}


def test_the_text_labels_the_buckets_as_precisely_as_their_width() -> None:
    text = render_text(summarize(["a.jsonl"], entries(audit_record(_ts(0)), audit_record(_ts(6)))))
    assert "counted per second (UTC)" in text
    assert "findings per second (UTC)" in text
    assert "2026-11-29 09:00:06       1  arguments_schema 1" in text


LOG = {"action": "log"}


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        pytest.param(
            [
                audit_record(at(9)),
                audit_record(at(9), action="strip"),
                audit_record(at(9), action="rewrite"),
                audit_record(at(9), **LOG),
                audit_record(at(9), sales(), orphan_finding(), **LOG),
            ],
            Headline(requests=5, blocked=1, stripped=1, rewritten=1, logged=2, would_block=2),
            id="by-action",
        ),
        pytest.param(
            [audit_record(at(9), event="emitted_call_rejected", **LOG)],
            Headline(requests=0, blocked=0, stripped=0, rewritten=0, logged=0, would_block=0),
            id="door-2-never-blocks",
        ),
        pytest.param(
            [
                audit_record(at(9), {"index": 1}, **LOG),
                audit_record(at(9), **LOG) | {"findings": ["odd"]},
            ],
            Headline(requests=2, blocked=0, stripped=0, rewritten=0, logged=2, would_block=0),
            id="a-log-record-without-a-reason-would-not-have-blocked",
        ),
    ],
)
def test_the_headline(records: list[dict[str, Any]], expected: Headline) -> None:
    summary = summarize(["a.jsonl"], entries(*records))
    assert summary.headline == expected
    assert summary.headline.would_block == summary.would_block.requests


def test_sample_messages_per_reason_are_distinct_and_few() -> None:
    records = [
        audit_record(at(9), sales() | {"message": f"region failed {n % 5}"}) for n in range(20)
    ]
    records.append(audit_record(at(9), orphan_finding() | {"message": "no call"}))
    records.append(audit_record(at(9), orphan_finding()))  # an older record: no message
    summary = summarize(["a.jsonl"], entries(*records))
    assert summary.samples == (
        ("arguments_schema", ("region failed 0", "region failed 1", "region failed 2")),
        ("orphan", ("no call",)),
    )
    text = render_text(summary)
    assert "sample messages by reason\n  arguments_schema: region failed 0\n" in text
    assert "  orphan: no call\n" in text


SCRAPE = """\
# HELP replay_proxy_requests_total Requests handled.
# TYPE replay_proxy_requests_total counter
replay_proxy_requests_total{route="responses",outcome="forward",upstream="a"} 180.0
replay_proxy_requests_total{route="responses_compact",outcome="forward",upstream="a"} 10.0
replay_proxy_requests_total{route="responses",outcome="block",upstream="a"} 6.0
replay_proxy_requests_total{route="websocket",outcome="block",upstream="b"} 2.0
replay_proxy_requests_total{route="responses",outcome="strip",upstream="a"} 2.0
replay_proxy_requests_total{route="passthrough",outcome="forward",upstream="a"} 500.0
replay_proxy_requests_total{route="any",outcome="unauthorized",upstream="-"} 40.0
replay_proxy_requests_total{route="responses",outcome="invalid",upstream="-"} 3.0
replay_proxy_requests_created{route="responses",outcome="block",upstream="a"} 1.7e9
"""


def test_the_metrics_give_the_requests_judged_and_the_rejection_rate(tmp_path: Path) -> None:
    judged = read_judged("m.txt", SCRAPE)
    assert (judged.total, judged.blocked) == (200, 8)
    (tmp_path / "a.jsonl").write_bytes(RECORD)
    (tmp_path / "m.txt").write_text(SCRAPE)
    done = replay_proxy(
        "audit", "report", "--metrics", str(tmp_path / "m.txt"), str(tmp_path / "a.jsonl")
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert (
        f"requests judged: 200 (from {tmp_path / 'm.txt'}); rejection rate 4.00% (8 blocked)"
        in (done.stdout)
    )
    assert "requests with findings: 1 (blocked 1, stripped 0" in done.stdout


@pytest.mark.parametrize(
    ("scrape", "said"),
    [
        pytest.param("not { a scrape", "not a Prometheus text scrape", id="not-prometheus"),
        pytest.param("up 1\n", "no replay_proxy_requests_total in it", id="another-service"),
    ],
)
def test_a_scrape_that_is_not_the_proxys_is_exit_2(tmp_path: Path, scrape: str, said: str) -> None:
    (tmp_path / "a.jsonl").write_bytes(RECORD)
    (tmp_path / "m.txt").write_text(scrape)
    done = replay_proxy(
        "audit", "report", "--metrics", str(tmp_path / "m.txt"), str(tmp_path / "a.jsonl")
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert f"{tmp_path / 'm.txt'}: --metrics: {said}" in done.stderr


def test_request_id_prints_its_records(tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"
    mine = audit_record(at(9), request_id="req_mine", tenant="t_\x1b[2J")
    log.write_bytes(line(audit_record(at(9), request_id="req_other")) + line(mine) + b"junk\n")
    done = replay_proxy("audit", "report", "--request-id", "req_mine", str(log))
    assert (done.returncode, done.stderr) == (0, "")
    where, _, record = done.stdout.partition("\n")
    assert where == f"{log}:2"
    assert json.loads(record) == mine
    assert "\x1b" not in done.stdout  # escaped as JSON writes it: \u001b

    done = replay_proxy("audit", "report", "--request-id", "req_none", str(log))
    assert (done.returncode, done.stdout) == (1, "")
    assert "no record has request_id 'req_none'" in done.stderr


def test_tenants_from_the_config_name_the_fingerprints(tmp_path: Path) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text("tenants:\n  t_0123456789abcdef: acme\n")
    assert load_config(config).tenants == {"t_0123456789abcdef": "acme"}
    log = tmp_path / "a.jsonl"
    log.write_bytes(RECORD + line(audit_record(at(9), tenant="t_ffffffffffffffff")))
    done = replay_proxy("audit", "report", "--config", str(config), str(log))
    assert (done.returncode, done.stderr) == (0, "")
    assert table(done.stdout, "tenant") == [
        ["acme", "(t_0123456789abcdef)", "1", "1"],
        ["t_ffffffffffffffff", "1", "1"],
    ]
    html = tmp_path / "r.html"
    done = replay_proxy("audit", "report", "--config", str(config), "--html", str(html), str(log))
    assert "<td>acme (t_0123456789abcdef)</td>" in html.read_text()


@pytest.mark.parametrize(
    ("yaml_text", "said"),
    [
        pytest.param(
            "tenants:\n  acme: t_0123456789abcdef\n",
            "tenants.acme: not a tenant fingerprint (t_ and 16 hex digits",
            id="name-and-fingerprint-swapped",
        ),
        pytest.param(
            "tenants:\n  t_0123456789abcdef: ''\n",
            "tenants.t_0123456789abcdef: '' should be non-empty",
            id="empty-name",
        ),
    ],
)
def test_a_bad_tenants_map_is_named(tmp_path: Path, yaml_text: str, said: str) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text(yaml_text)
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert said in caught.value.problems[0]
    (tmp_path / "a.jsonl").write_bytes(RECORD)
    done = replay_proxy("audit", "report", "--config", str(config), str(tmp_path / "a.jsonl"))
    assert done.returncode == 2
    assert said in done.stderr


def test_tenants_is_in_the_defaults() -> None:
    assert "tenants: {}" in "\n".join(iter_defaults())


def test_unreadable_lines_are_kept_and_not_counted() -> None:
    lines = [RECORD, b"garbage\n", RECORD]
    summary = summarize(["a.jsonl"], iter_entries("a.jsonl", lines))
    assert summary.records == 2
    assert summary.unreadable == (UnreadableLine("a.jsonl", 2, "not JSON"),)


def table(text: str, title: str) -> list[list[str]]:
    """The rows of one of the text report's tables, split into words, under its header."""
    lines = text.splitlines()
    start = next(i for i, row in enumerate(lines) if row.split() == [title, "requests", "findings"])
    end = lines.index("", start)
    return [row.split() for row in lines[start + 1 : end]]


def write_rotated(tmp_path: Path) -> Path:
    """Six requests through a real audit log that rotates, one line broken in the middle."""
    path = tmp_path / "audit.jsonl"
    log = AuditLog(str(path), max_bytes=1200)
    failing = inspect(failing_body(), Policy())
    for i in range(6):
        verdict = ORPHAN if i % 2 else failing
        log.write(
            AuditedRequest(f"req_{i}", "http", "/v1/responses", {}, b"{}", f"t_{i % 2}"), verdict
        )
    log.close()
    first = tmp_path / "audit.jsonl.1"
    lines = first.read_bytes().splitlines(keepends=True)
    first.write_bytes(b"".join([*lines[:1], b"{not json\n", *lines[1:]]))
    return path


def test_the_command_reads_rotated_files_and_names_a_broken_line(tmp_path: Path) -> None:
    path = write_rotated(tmp_path)
    files = sorted(str(p) for p in tmp_path.glob("audit.jsonl*"))
    assert len(files) >= 3, files  # rotated at least twice
    done = replay_proxy("audit", "report", *files)
    assert done.returncode == 1, done.stderr
    assert f"unreadable: {path}.1:2: not JSON" in done.stdout
    assert "1 unreadable line(s)" in done.stderr
    assert "audit report: 6 records, 6 findings" in done.stdout
    assert table(done.stdout, "reason") == [["arguments_schema", "3", "3"], ["orphan", "3", "3"]]
    assert table(done.stdout, "tenant") == [["t_0", "3", "3"], ["t_1", "3", "3"]]


def test_the_command_exits_0_when_every_line_is_a_record(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(RECORD + RECORD)
    done = replay_proxy("audit", "report", str(tmp_path / "a.jsonl"))
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("audit report: 2 records, 2 findings")


def test_the_text_escapes_control_characters() -> None:
    record = audit_record(tenant="t_\x1b[2Jx")
    text = render_text(summarize(["a.jsonl"], entries(record)))
    assert "\x1b" not in text
    assert table(text, "tenant") == [["t_\\x1b[2Jx", "1", "1"]]


def test_the_command_exits_2_on_a_file_it_cannot_read(tmp_path: Path) -> None:
    done = replay_proxy("audit", "report", str(tmp_path / "missing.jsonl"))
    assert done.returncode == 2
    assert "missing.jsonl: cannot read" in done.stderr
    assert done.stdout == ""


def test_no_records_still_make_a_report() -> None:
    summary = summarize(["a.jsonl"], [UnreadableLine("a.jsonl", 1, "not JSON")])
    assert render_text(summary).startswith("audit report: 0 records, 0 findings")
    assert "nothing: no record has action log" in render_text(summary)
    assert "a.jsonl:1</code>: not JSON" in render_html(summary)


def test_the_text_and_the_page_name_the_dialect_of_chat_records() -> None:
    summary = summarize(
        ["a.jsonl"], entries(audit_record(at(9), path="/v1/chat/completions"), audit_record(at(9)))
    )
    lines = render_text(summary).splitlines()
    at_table = lines.index("dialect    requests  findings")
    assert lines[at_table + 1 : at_table + 3] == [
        "chat              1         1",
        "responses         1         1",
    ]
    assert "<th>dialect</th>" in render_html(summary)
