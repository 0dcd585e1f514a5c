"""Blocked requests: the answer, nothing upstream, the audit record."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from pathlib import Path

import aiohttp
import pytest

from tests.builders import (
    AUDIT_FIELDS,
    CHAT_MESSAGES,
    ENCODE,
    FINDING,
    JSON_HEADERS,
    at,
    audit_records,
    failing_body,
    odd_bytes,
    sales_output,
)
from tests.fixture_types import ProxyFactory
from tests.servers.recording import RecordingUpstream


@pytest.mark.parametrize(
    ("coding", "include_arguments"),
    [("identity", False), ("gzip", False), ("identity", True)],
)
async def test_blocked_request(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
    coding: str,
    include_arguments: bool,
) -> None:
    base = await start_proxy(recording_upstream.url, audit={"include_arguments": include_arguments})
    secret = "sk-secret-never-in-the-log"
    sent = ENCODE[coding](odd_bytes(failing_body(previous_response_id="resp_prev")))
    headers = JSON_HEADERS | {"Authorization": f"Bearer {secret}"}
    if coding != "identity":
        headers["Content-Encoding"] = coding

    async with client.post(at(base, "/v1/responses"), data=sent, headers=headers) as resp:
        assert resp.status == 400
        assert resp.content_type == "application/json"
        assert resp.headers["x-should-retry"] == "false"
        request_id = resp.headers["x-request-id"]
        answer = await resp.json()

    assert answer == {
        "error": {
            "type": "invalid_request_error",
            "code": "replay_rejected",
            "param": "input[2]",
            "message": "input[2] (call_id call_1): paired function_call failed the replay gate: "
            "arguments_schema at /region (enum)",
            "findings": [FINDING],
            "request_id": request_id,
        }
    }
    assert recording_upstream.received == []

    log_text = (tmp_path / "audit.jsonl").read_text()
    [record] = audit_records(tmp_path)
    assert set(record) == AUDIT_FIELDS
    assert datetime.fromisoformat(record["ts"]).tzinfo is not None
    assert record["event"] == "replay_rejected"
    assert re.fullmatch(r"req_[0-9a-f]{32}", record["request_id"])
    assert record["request_id"] == request_id
    assert record["action"] == "block"
    assert record["transport"] == "http"
    assert record["path"] == "/v1/responses"
    assert record["model"] == "gpt-test"
    assert record["previous_response_id"] == "resp_prev"
    assert isinstance(record["tenant"], str)
    assert record["tenant"]
    assert secret not in log_text
    assert secret not in record["tenant"]
    assert record["body_sha256"] == hashlib.sha256(sent).hexdigest()
    if include_arguments:
        assert record["findings"] == [FINDING | {"arguments": '{"region": "mars"}'}]
    else:
        assert record["findings"] == [FINDING]
        assert "mars" not in log_text


async def test_tenant_is_a_stable_fingerprint_of_the_credential(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    base = await start_proxy(recording_upstream.url)
    credentials = [
        {"Authorization": "Bearer sk-alice"},
        {"Authorization": "Bearer sk-alice"},
        {"Authorization": "Bearer sk-bob"},
        {"api-key": "azure-key-carol"},
        {},
    ]
    for credential in credentials:
        async with client.post(
            at(base, "/v1/responses"), json=failing_body(), headers=credential
        ) as resp:
            assert resp.status == 400

    alice, alice_again, bob, carol, nobody = (r["tenant"] for r in audit_records(tmp_path))
    assert alice == alice_again
    assert len({alice, bob, carol}) == 3
    assert nobody is None
    log_text = (tmp_path / "audit.jsonl").read_text()
    for secret in ("sk-alice", "sk-bob", "azure-key-carol"):
        assert secret not in log_text
    assert recording_upstream.received == []


async def test_any_blocking_finding_blocks_and_every_finding_is_listed(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    base = await start_proxy(
        recording_upstream.url, gate={"action": "strip", "actions": {"orphan": "block"}}
    )
    body = failing_body()
    body["input"].append(sales_output("call_gone"))

    async with client.post(at(base, "/v1/responses"), json=body) as resp:
        assert resp.status == 400
        assert resp.headers["x-should-retry"] == "false"
        error = (await resp.json())["error"]

    orphan = {
        "index": 3,
        "call_id": "call_gone",
        "paired_index": None,
        "name": None,
        "reason": "orphan",
        "message": (
            "no function_call with call_id call_gone precedes this output: not inline, not behind "
            "an item_reference, not in the previous_response_id chain the proxy recorded"
        ),
    }
    assert error["code"] == "replay_rejected"
    assert error["param"] == "input[3]"
    assert error["message"].endswith("(and 1 more finding)")
    assert error["findings"] == [FINDING, orphan]
    assert recording_upstream.received == []
    [record] = audit_records(tmp_path)
    assert record["action"] == "block"
    assert record["findings"] == [FINDING, orphan]


async def test_a_chat_completions_body_on_a_responses_path_is_blocked(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    base = await start_proxy(recording_upstream.url)
    body = {"model": "m", "messages": CHAT_MESSAGES}

    async with client.post(base + "/v1/responses", json=body) as resp:
        assert resp.status == 400
        assert resp.headers["x-should-retry"] == "false"
        error = (await resp.json())["error"]

    assert recording_upstream.received == []
    assert (error["code"], error["param"]) == ("replay_rejected", "messages")
    [finding] = error["findings"]
    assert (finding["reason"], finding["param"], finding["index"]) == ("envelope", "messages", None)
    [record] = audit_records(tmp_path)
    assert (record["action"], record["findings"]) == ("block", error["findings"])


@pytest.mark.parametrize(
    ("action", "gate_header", "forwarded"),
    [
        pytest.param("strip", "stripped=1", {"model": "m", "input": "hi"}, id="strip-drops-it"),
        pytest.param(
            "log",
            "logged=1",
            {"model": "m", "messages": CHAT_MESSAGES, "input": "hi"},
            id="log-forwards-it",
        ),
    ],
)
async def test_a_chat_completions_body_under_other_actions(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    action: str,
    gate_header: str,
    forwarded: dict[str, object],
) -> None:
    base = await start_proxy(recording_upstream.url, gate={"actions": {"envelope": action}})
    body = {"model": "m", "messages": CHAT_MESSAGES, "input": "hi"}

    async with client.post(base + "/v1/responses", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["x-replay-gate"] == gate_header

    [got] = recording_upstream.received
    assert got.json() == forwarded
