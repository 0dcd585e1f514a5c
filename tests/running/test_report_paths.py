"""`audit report`: the failing argument paths are the arguments' own, not an item schema's."""

from __future__ import annotations

from typing import Any

from proxy.running.report import Entry, summarize
from tests.builders import FINDING, audit_record

UNPORTABLE = {
    "index": 2,
    "call_id": "c" * 65,
    "paired_index": 1,
    "name": "sales",
    "reason": "not_portable",
    "type": "function_call",
    "fail": [{"path": "/call_id", "reason": "maxLength", "expected": 64}],
}


def summary_of(*findings: dict[str, Any]) -> Any:
    record = audit_record("2026-11-29T09:15:00.000Z", *findings)
    return summarize(["a.jsonl"], [Entry("a.jsonl", 1, record)])


def test_not_portable_paths_are_not_argument_paths() -> None:
    schema_finding = FINDING | {"name": "sales"}
    summary = summary_of(schema_finding, UNPORTABLE)
    assert summary.top_paths == (("sales", "/region", "enum", 1),)
    [tool] = summary.per_tool
    assert (tool.name, dict(tool.reasons), tool.paths) == (
        "sales",
        {"arguments_schema": 1, "not_portable": 1},
        (("/region", "enum", 1),),
    )
