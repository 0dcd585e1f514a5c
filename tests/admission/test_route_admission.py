"""Admission with routes, transport-free: which upstream a body goes to, with what body, and
when a previous response made elsewhere is refused (`foreign_previous_response`) or inlined."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy.admission import pipeline
from proxy.running.config_file import parse_config
from proxy.state.audit import AuditLog
from proxy.state.ledger import Ledger
from proxy.state.metrics import Metrics
from proxy.state.recording import Context
from proxy.state.stores import MemoryStore
from tests.builders import SALES_TOOL, sales_call, sales_output

CONFIG = parse_config(
    {
        "upstreams": {
            "openai": {"url": "http://127.0.0.1:1", "vendor": "openai"},
            "acme": {"url": "http://127.0.0.1:2", "vendor": "acme"},
        },
        "routes": [
            {"header": {"name": "x-to", "value": "acme"}, "upstream": "acme"},
            {"header": {"name": "x-to", "value": "acme-inline"}, "upstream": "acme"}
            | {"materialize": True},
            {"model": "acme/*", "upstream": "acme", "strip_model_prefix": True},
            {"upstream": "openai"},
        ],
        "ledger": {"whole_items": True},
    }
)
USER = {"type": "message", "role": "user", "content": "sales?"}
CALL = sales_call("c1")


@dataclass(frozen=True)
class Case:
    recorded_by: str | None  # the upstream resp_1 (which made CALL) was recorded from
    to: str  # the x-to header
    decided: tuple[str, str | None]  # ("forward", upstream) or ("answer", error code)
    body: dict[str, Any] | None = None  # what goes upstream, when it is not the client's


FOLLOW_UP = {
    "model": "m",
    "tools": [SALES_TOOL],
    "previous_response_id": "resp_1",
    "input": [sales_output("c1")],
}

CASES = [
    pytest.param(Case("openai", "", ("forward", "openai")), id="home"),
    pytest.param(
        Case("openai", "acme", ("answer", "foreign_previous_response")), id="abroad-refused"
    ),
    pytest.param(
        Case(
            "openai",
            "acme-inline",
            ("forward", "acme"),
            {
                "model": "m",
                "tools": [SALES_TOOL],
                "input": [USER, CALL, sales_output("c1")],
            },
        ),
        id="abroad-inlined",
    ),
    pytest.param(Case("acme", "acme", ("forward", "acme")), id="home-on-acme"),
    # Recorded under no name, or a name this config does not have (`default`, before routes):
    # judged as before, never refused as foreign.
    pytest.param(Case(None, "acme", ("forward", "acme")), id="unnamed"),
    pytest.param(Case("default", "acme", ("forward", "acme")), id="name-not-in-this-config"),
]


@pytest.fixture
def ledger() -> Ledger:
    return Ledger(MemoryStore(max_responses=10, ttl_s=60), max_chain=8, fail_open=False)


async def admit(
    ledger: Ledger, tmp_path: Path, body: dict[str, Any], headers: dict[str, str]
) -> pipeline.Answer | pipeline.Forward:
    audit_log = AuditLog(str(tmp_path / "audit.jsonl"))
    try:
        return await pipeline.admit(
            pipeline.Request(
                json.dumps(body).encode(), "/v1/responses", "http", "req_1", headers=headers
            ),
            CONFIG,
            ledger=ledger,
            audit_log=audit_log,
            metrics=Metrics(),
        )
    finally:
        audit_log.close()


@pytest.mark.parametrize("case", CASES)
async def test_a_previous_response_made_elsewhere(
    ledger: Ledger, tmp_path: Path, case: Case
) -> None:
    made = {"id": "resp_1", "object": "response", "output": [CALL]}
    await ledger.record("-", made, Context(whole=(USER,)), case.recorded_by)

    headers = {"x-to": case.to} if case.to else {}
    decided = await admit(ledger, tmp_path, FOLLOW_UP, headers)

    kind, named = case.decided
    if kind == "answer":
        assert isinstance(decided, pipeline.Answer)
        assert (decided.status, decided.body["error"]["code"]) == (400, named)
        assert decided.body["error"]["param"] == "previous_response_id"
        return
    assert isinstance(decided, pipeline.Forward)
    assert decided.upstream == named
    assert json.loads(decided.data) == (case.body or FOLLOW_UP)


async def test_the_model_prefix_goes_and_the_rest_of_the_body_stays(
    ledger: Ledger, tmp_path: Path
) -> None:
    body = {"model": "acme/big", "input": "hi", "metadata": {"n": 12345678901234567890}}
    decided = await admit(ledger, tmp_path, body, {})
    assert isinstance(decided, pipeline.Forward)
    assert decided.upstream == "acme"
    assert json.loads(decided.data) == body | {"model": "big"}


async def test_a_clean_body_on_a_route_goes_byte_for_byte(ledger: Ledger, tmp_path: Path) -> None:
    raw = b'{"model":  "m", "input": "hi"}'
    audit_log = AuditLog(str(tmp_path / "audit.jsonl"))
    decided = await pipeline.admit(
        pipeline.Request(raw, "/v1/responses", "http", "req_1", headers={"x-to": "acme"}),
        CONFIG,
        ledger=ledger,
        audit_log=audit_log,
        metrics=Metrics(),
    )
    audit_log.close()
    assert isinstance(decided, pipeline.Forward)
    assert (decided.upstream, decided.data) == ("acme", raw)
