"""Door 2's checks: counted under bounded tool labels, one record per response, policy in force."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from proxy.admission.emitted import MAX_TOOL_LABELS, EmittedCalls, EmittedChecks
from proxy.gate.caches import GateCaches
from proxy.gate.items import tool_schemas
from proxy.gate.policy import Policy
from proxy.state.audit import AuditLog, Relayed
from proxy.state.metrics import Metrics
from proxy.state.recording import Context
from tests.builders import APAC, GLOBAL, SALES_SCHEMA, TOOLS, call, tool

RELAYED = Relayed("req_1", "http", "/v1/responses", "t_1", b"{}")


def response(*calls: dict[str, Any], response_id: str = "resp_1") -> dict[str, Any]:
    return {"id": response_id, "object": "response", "output": list(calls)}


def context(tools: list[Any]) -> Context:
    return Context.of((), tool_schemas(tools), compacts=False)


def counts(metrics: Metrics) -> dict[tuple[str, str], float]:
    [family] = [f for f in metrics.registry.collect() if f.name == "replay_proxy_emitted_calls"]
    return {
        (s.labels["tool"], s.labels["verdict"]): s.value
        for s in family.samples
        if s.name.endswith("_total")
    }


@pytest.fixture
def audit_path(tmp_path: Path) -> Path:
    return tmp_path / "audit.jsonl"


async def checked(
    audit_path: Path,
    answers: Sequence[tuple[dict[str, Any], Context | None]],
    policy: Policy | None = None,
) -> tuple[dict[tuple[str, str], float], list[dict[str, Any]]]:
    """The counts and audit records of checking these answered responses, all of one request."""
    policy = policy or Policy()
    metrics, log = Metrics(), AuditLog(str(audit_path))
    checks = EmittedChecks(log, metrics)
    calls = EmittedCalls(RELAYED)
    for answered, ctx in answers:
        calls.add(answered, ctx)
    checks.start(calls, policy, GateCaches.for_policy(policy))
    await checks.wait()
    log.close()
    return counts(metrics), records_in(audit_path)


def records_in(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]


async def test_tool_labels_are_bounded(audit_path: Path) -> None:
    names = [f"tool_{n}" for n in range(MAX_TOOL_LABELS + 10)]
    answers = [
        (response(call(f"c{n}", "{}", name)), context([tool({}, name)]))
        for n, name in enumerate(names)
    ]
    found, records = await checked(audit_path, answers)

    assert found[("(other)", "ok")] == 10
    assert len(found) == MAX_TOOL_LABELS + 1
    assert records == []


@pytest.mark.parametrize(
    ("item", "label"),
    [
        pytest.param(call("c1", APAC, "not offered"), "(unknown)", id="unknown-tool"),
        pytest.param(call("c1", APAC, "x" * 65), "(unknown)", id="not-a-tool-name"),
        pytest.param(call("c1", APAC, None), "(unknown)", id="no-name"),
    ],
)
async def test_a_name_without_a_schema_is_no_label_of_its_own(
    audit_path: Path, item: dict[str, Any], label: str
) -> None:
    found, [record] = await checked(audit_path, [(response(item), context(TOOLS))])

    assert found == {(label, "unknown_tool"): 1}
    assert record["findings"][0]["name"] == item["name"]


async def test_one_record_per_response_with_failing_calls(audit_path: Path) -> None:
    answers = [
        (response(call("a1", GLOBAL), call("a2", GLOBAL), response_id="resp_a"), context(TOOLS)),
        (response(call("b1", APAC), response_id="resp_b"), context(TOOLS)),
        (response(call("c1", '{"region":"emea"} x'), response_id="resp_c"), context(TOOLS)),
    ]
    found, records = await checked(audit_path, answers)

    assert [(r["response_id"], [f["call_id"] for f in r["findings"]]) for r in records] == [
        ("resp_a", ["a1", "a2"]),
        ("resp_c", ["c1"]),
    ]
    sales = "get_latest_sales_report"
    assert found == {
        (sales, "arguments_schema"): 2,
        (sales, "ok"): 1,
        (sales, "arguments_parse"): 1,
    }
    # The records chain like any other.
    assert records[1]["prev"] != records[0]["prev"]


async def test_the_policy_given_is_the_one_used(tmp_path: Path) -> None:
    loose = [tool({"type": "object"})]
    answers = [(response(call("c1", GLOBAL)), context(loose))]
    strict = Policy(tools={"get_latest_sales_report": SALES_SCHEMA})

    found, _ = await checked(tmp_path / "a.jsonl", answers)
    pinned, _ = await checked(tmp_path / "b.jsonl", answers, strict)

    assert found == {("get_latest_sales_report", "ok"): 1}
    assert pinned == {("get_latest_sales_report", "arguments_schema"): 1}


async def test_a_response_without_calls_starts_nothing(audit_path: Path) -> None:
    calls = EmittedCalls(RELAYED)
    calls.add({"id": "resp_1", "output": [{"type": "message"}]}, None)
    calls.add({"id": "resp_2"}, None)

    assert calls.found == []
