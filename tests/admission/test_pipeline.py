"""Admission, without a transport: body bytes and what the request said of them in, an answer
or a forward out, with what it counted and audited."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from proxy.admission import pipeline
from proxy.admission.dialect import OpenResponses
from proxy.gate.verdict import Verdict
from proxy.running.config_file import parse_config
from proxy.state.audit import AuditLog
from proxy.state.ledger import Ledger
from proxy.state.metrics import Metrics
from proxy.state.stores import MemoryStore
from tests.builders import SALES_TOOL, USER, audit_records, sales_call, sales_output

JSON = "application/json"


def body(*items: Any, **fields: Any) -> dict[str, Any]:
    return {"model": "m", "tools": [SALES_TOOL], "input": [USER, *items], **fields}


def wire(value: Any) -> bytes:
    # Spaced as a client may write it: a forward must carry these bytes, not a re-encoding.
    return json.dumps(value, indent=1).encode()


CLEAN = wire(body(sales_call("call_1"), sales_output("call_1")))
FAILING = wire(body(sales_call("call_1", "mars"), sales_output("call_1")))
MIXED = wire(
    body(
        sales_call("call_1"),
        sales_output("call_1"),
        sales_call("call_2", "mars"),
        sales_output("call_2"),
    )
)
# Only the output: its call lives in the recorded response `resp_1`.
FOLLOW_UP = wire(
    {
        "model": "m",
        "tools": [SALES_TOOL],
        "previous_response_id": "resp_1",
        "input": [sales_output("call_1")],
    }
)
RECORDED = {"object": "response", "id": "resp_1", "output": [sales_call("call_1")]}


@dataclass(frozen=True)
class Case:
    raw: bytes
    # What the table expects: an answer's (status, code), or a forward's data and outcome.
    status: int | None = None
    code: str | None = None
    data: bytes | None = None
    outcome: str | None = None
    added: dict[str, str] = field(default_factory=dict)
    record: bool = True
    # The (route, outcome) counted here; a forward is counted by its front, once relayed.
    counted: tuple[str, str] | None = None
    audited: str | None = None  # the audit record's action, if one is written
    path: str = "/v1/responses"
    transport: pipeline.Transport = "http"
    content_type: str | None = JSON
    content_encoding: str = ""
    gate: dict[str, Any] = field(default_factory=dict)
    tenant: str | None = "t_alice"
    recorded_for: str | None = None  # the tenant `RECORDED` was relayed to beforehand


CASES = [
    pytest.param(Case(CLEAN, data=CLEAN, outcome="forward"), id="clean-as-sent"),
    pytest.param(
        Case(CLEAN, data=CLEAN, outcome="forward", path="/v1/responses/compact", record=True),
        id="compact-recorded",
    ),
    pytest.param(
        Case(gzip.compress(CLEAN), data=CLEAN, outcome="forward", content_encoding="gzip"),
        id="gzip-forwarded-decoded",
    ),
    pytest.param(
        Case(CLEAN, data=CLEAN, outcome="forward", content_type="application/json; charset=utf-8"),
        id="charset-utf-8",
    ),
    pytest.param(
        Case(
            CLEAN,
            415,
            "unsupported_media_type",
            content_type="text/plain",
            counted=("responses", "invalid"),
        ),
        id="text-plain",
    ),
    pytest.param(
        Case(
            CLEAN, 415, "unsupported_media_type", content_type="", counted=("responses", "invalid")
        ),
        id="no-content-type",
    ),
    pytest.param(
        Case(
            CLEAN,
            415,
            "unsupported_content_encoding",
            content_encoding="zstd",
            counted=("responses", "invalid"),
        ),
        id="zstd",
    ),
    pytest.param(
        Case(
            b"\x1f\x8b not gzip",
            400,
            "invalid_content_encoding",
            content_encoding="gzip",
            counted=("responses", "invalid"),
        ),
        id="corrupt-gzip",
    ),
    pytest.param(
        Case(
            gzip.compress(b" " * 70_000 + CLEAN),
            413,
            "body_too_large",
            content_encoding="gzip",
            counted=("responses", "invalid"),
        ),
        id="decoded-over-limit",
    ),
    pytest.param(
        Case(b'{"input": [], "input": []}', 400, "invalid_json", counted=("responses", "invalid")),
        id="duplicate-key",
    ),
    pytest.param(
        Case(
            b"[]",
            400,
            "invalid_body",
            path="/v1/responses/compact",
            counted=("responses_compact", "invalid"),
        ),
        id="not-an-object",
    ),
    pytest.param(
        Case(b'{"input": 4}', 400, "invalid_input", counted=("responses", "invalid")),
        id="input-a-number",
    ),
    pytest.param(
        Case(FAILING, 400, "replay_rejected", counted=("responses", "block"), audited="block"),
        id="blocked",
    ),
    pytest.param(
        Case(
            MIXED,
            data=json.dumps(
                body(sales_call("call_1"), sales_output("call_1")), separators=(",", ":")
            ).encode(),
            outcome="strip",
            added={"x-replay-gate": "stripped=1"},
            gate={"action": "strip"},
            audited="strip",
        ),
        id="stripped",
    ),
    pytest.param(
        Case(
            FAILING,
            data=FAILING,
            outcome="forward",
            added={"x-replay-gate": "logged=1"},
            gate={"action": "log"},
            audited="log",
        ),
        id="logged",
    ),
    pytest.param(
        Case(FOLLOW_UP, data=FOLLOW_UP, outcome="forward", recorded_for="t_alice"),
        id="follow-up-pairs-with-the-ledger",
    ),
    pytest.param(
        Case(FOLLOW_UP, 400, "replay_rejected", counted=("responses", "block"), audited="block"),
        id="follow-up-nothing-recorded",
    ),
    pytest.param(
        Case(
            FOLLOW_UP,
            400,
            "replay_rejected",
            counted=("responses", "block"),
            audited="block",
            recorded_for="t_bob",
        ),
        id="follow-up-recorded-for-another-tenant",
    ),
    pytest.param(
        Case(CLEAN, data=CLEAN, outcome="forward", transport="websocket", content_type=None),
        id="websocket-frame",
    ),
    pytest.param(
        Case(
            b"{not json",
            400,
            "invalid_json",
            transport="websocket",
            content_type=None,
            counted=("websocket", "invalid"),
        ),
        id="websocket-unreadable",
    ),
    pytest.param(
        Case(
            FAILING,
            400,
            "replay_rejected",
            transport="websocket",
            content_type=None,
            counted=("websocket", "block"),
            audited="block",
        ),
        id="websocket-blocked",
    ),
]


@dataclass
class Books:
    """What admission writes to, read back by the test."""

    ledger: Ledger
    audit_log: AuditLog
    metrics: Metrics
    directory: Path

    def timed(self) -> int:
        """How many verdicts the gate's time was observed for."""
        [collected] = [
            f for f in self.metrics.registry.collect() if f.name == "replay_proxy_gate_seconds"
        ]
        return sum(int(s.value) for s in collected.samples if s.name.endswith("_count"))

    def counted(self) -> set[tuple[str, str]]:
        return {
            (sample.labels["route"], sample.labels["outcome"])
            for collected in self.metrics.registry.collect()
            if collected.name == "replay_proxy_requests"
            for sample in collected.samples
            if sample.name.endswith("_total") and sample.value
        }


@pytest.fixture
async def books(tmp_path: Path) -> AsyncIterator[Books]:
    store = MemoryStore(max_responses=100, ttl_s=600)
    audit_log = AuditLog(str(tmp_path / "audit.jsonl"))
    yield Books(Ledger(store, max_chain=8, fail_open=False), audit_log, Metrics(), tmp_path)
    audit_log.close()
    await store.close()


@pytest.mark.parametrize("case", CASES)
async def test_admission(books: Books, case: Case) -> None:
    config = parse_config({"gate": case.gate, "limits": {"max_body_bytes": 65_536}})
    if case.recorded_for is not None:
        await books.ledger.record(case.recorded_for, RECORDED)
    request = pipeline.Request(
        case.raw,
        case.path,
        case.transport,
        "req_1",
        case.tenant,
        case.content_type,
        case.content_encoding,
    )

    decided = await pipeline.admit(
        request, config, ledger=books.ledger, audit_log=books.audit_log, metrics=books.metrics
    )

    if case.status is not None:
        assert isinstance(decided, pipeline.Answer)
        error = decided.body["error"]
        assert (decided.status, error["code"]) == (case.status, case.code)
        assert error["type"] == "invalid_request_error"
        assert error["message"]
        if case.code == "replay_rejected":
            assert error["request_id"] == "req_1"
            assert error["findings"]
            assert dict(decided.headers) == {"x-should-retry": "false"}
    else:
        assert isinstance(decided, pipeline.Forward)
        assert (decided.data, decided.outcome) == (case.data, case.outcome)
        assert dict(decided.add_headers) == case.added
        assert decided.drop_headers == {"content-encoding"}
        assert decided.record is case.record
    assert books.counted() == ({case.counted} if case.counted else set())
    judged = case.status is None or case.code == "replay_rejected"
    assert books.timed() == (1 if judged else 0)
    records = audit_records(books.directory)
    assert [r["action"] for r in records] == ([case.audited] if case.audited else [])
    for record in records:
        assert (record["request_id"], record["transport"]) == ("req_1", case.transport)
        assert (record["tenant"], record["path"]) == (case.tenant, case.path)


@pytest.mark.parametrize(
    ("path", "transport", "problem"),
    [
        pytest.param("/v1/models", "http", "path: '/v1/models' is not a gated path", id="path"),
        pytest.param("/v1/responses", "grpc", "transport: 'grpc' is not one of", id="transport"),
    ],
)
def test_a_request_admission_cannot_route_is_refused_when_made(
    path: str, transport: Any, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        pipeline.Request(CLEAN, path, transport, "req_1")


class Toy(OpenResponses):
    """A second dialect, in the test alone: its own path and metrics route, and its own edit
    of a body the gate changed."""

    paths: Mapping[str, str] = {"/v1/toy": "toy"}

    def sent(self, parsed: dict[str, Any], verdict: Verdict) -> dict[str, Any]:
        return {**super().sent(parsed, verdict), "edited_by": "toy"}


async def test_a_second_dialect_is_admitted_through_its_own_seam(books: Books) -> None:
    """Admission reads the body's path, route and edits from the request's dialect: a toy one
    plugs in without any change to admission or the fronts."""
    config = parse_config({"gate": {"action": "strip"}})
    toy = Toy()

    def request(raw: bytes) -> pipeline.Request:
        return pipeline.Request(raw, "/v1/toy", "http", "req_1", "t_alice", JSON, dialect=toy)

    stripped = await pipeline.admit(
        request(MIXED),
        config,
        ledger=books.ledger,
        audit_log=books.audit_log,
        metrics=books.metrics,
    )
    assert isinstance(stripped, pipeline.Forward)
    assert json.loads(stripped.data) == body(sales_call("call_1"), sales_output("call_1")) | {
        "edited_by": "toy"
    }
    blocked = await pipeline.admit(
        request(FAILING),
        parse_config({}),
        ledger=books.ledger,
        audit_log=books.audit_log,
        metrics=books.metrics,
    )
    assert isinstance(blocked, pipeline.Answer)
    assert books.counted() == {("toy", "block")}
    assert [r["path"] for r in audit_records(books.directory)] == ["/v1/toy", "/v1/toy"]
    with pytest.raises(ValueError, match="is not a gated path"):
        pipeline.Request(CLEAN, "/v1/responses", "http", "req_1", dialect=toy)
