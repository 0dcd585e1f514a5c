"""rewrite over real HTTP and WebSocket: the pair stays, the output carries the failure record,
for calls inline and calls the ledger recorded, and it never escalates."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.builders import (
    FINDING,
    JSON_HEADERS,
    SALES_TOOL,
    UPSTREAM_ANSWER,
    USER,
    at,
    audit_records,
    compact,
    odd_bytes,
    request_body,
    sales_call,
    sales_output,
)
from tests.fixture_types import ProxyFactory
from tests.servers import strict_upstream
from tests.servers.recording import RecordingUpstream
from tests.servers.strict_upstream import StrictUpstream

RECORD = {
    "success": False,
    "execute": False,
    "check": "get_latest_sales_report",
    "reason": "arguments_schema",
    "pass": [],
    "fail": [{"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}],
    "error": "region failed schema: expected one of apac, emea, amer",
}
# A pin stricter than the strict upstream's model: the call it emits (region apac) fails it.
EMEA_ONLY = {
    "get_latest_sales_report": {
        "type": "object",
        "required": ["region"],
        "properties": {"region": {"enum": ["emea"]}},
    }
}
EMEA_RECORD = RECORD | {
    "fail": [{"path": "/region", "reason": "enum", "expected": ["emea"]}],
    "error": "region failed schema: expected one of emea",
}


@pytest.fixture
async def strict() -> AsyncIterator[StrictUpstream]:
    async with strict_upstream.serve() as upstream:
        yield upstream


async def test_rewrite_forwards_the_pair_with_the_failure_record(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    base = await start_proxy(recording_upstream.url, gate={"action": "rewrite"})
    good_call, good_output = sales_call("call_0"), sales_output("call_0")
    bad_call, bad_output = sales_call("call_1", "mars"), sales_output("call_1", "secret result")
    body = request_body(good_call, good_output, bad_call, bad_output, metadata={"n": 2**70})

    async with client.post(
        at(base, "/v1/responses"), data=odd_bytes(body), headers=JSON_HEADERS
    ) as resp:
        assert resp.status == 200
        assert resp.headers["x-replay-gate"] == "rewritten=1"
        assert await resp.json() == UPSTREAM_ANSWER

    [got] = recording_upstream.received
    sent = got.json()
    [_, _, _, _, rewritten] = sent["input"]
    assert json.loads(rewritten["output"]) == RECORD
    assert b"secret result" not in got.body
    # Re-serialised as strip does, every other byte of the body the client's.
    told = sales_output("call_1", rewritten["output"])
    assert got.body == compact(
        request_body(good_call, good_output, bad_call, told) | {"metadata": {"n": 2**70}}
    )
    [record] = audit_records(tmp_path)
    assert record["action"] == "rewrite"
    assert record["findings"] == [FINDING | {"index": 4, "paired_index": 3}]
    async with client.get(base + "/-/metrics") as resp:
        metrics = await resp.text()
    labels = 'action="rewrite",dialect="responses",reason="arguments_schema",tool="(unpinned)"'
    assert f"replay_proxy_findings_total{{{labels}}} 1.0" in metrics
    assert (
        'replay_proxy_requests_total{dialect="responses",outcome="rewrite",route="responses",'
        'upstream="default"} 1.0' in metrics
    )


async def test_rewrite_forwards_only_the_outputs_own_fields(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
) -> None:
    base = await start_proxy(recording_upstream.url, gate={"action": "rewrite"})
    failing = sales_output("call_1", "secret result") | {
        "id": "fco_1",
        "status": "completed",
        "content": [{"type": "output_text", "text": "secret content"}],
        "result": {"rows": "secret rows"},
    }
    body = request_body(sales_call("call_1", "mars"), failing)

    async with client.post(base + "/v1/responses", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["x-replay-gate"] == "rewritten=1"

    [got] = recording_upstream.received
    rewritten = got.json()["input"][-1]
    assert list(rewritten) == ["type", "call_id", "output", "id", "status"]
    assert rewritten["id"] == "fco_1"
    assert json.loads(rewritten["output"]) == RECORD
    assert b"secret" not in got.body


@pytest.mark.parametrize(
    ("action", "status", "gate_header"),
    [
        pytest.param("rewrite", 200, "rewritten=1", id="rewrite-never-escalates"),
        pytest.param("strip", 400, None, id="strip-escalates"),
    ],
)
async def test_a_call_the_ledger_recorded_is_rewritten_not_blocked(
    strict: StrictUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    action: str,
    status: int,
    gate_header: str | None,
) -> None:
    base = await start_proxy(strict.url, gate={"action": action}, tools=EMEA_ONLY)
    body: dict[str, Any] = {"model": "m", "tools": [SALES_TOOL]}
    async with client.post(base + "/v1/responses", json=body | {"input": "sales?"}) as resp:
        first = await resp.json()
    [call] = first["output"]
    follow_up = body | {
        "previous_response_id": first["id"],
        "input": [sales_output(call["call_id"], "unverified")],
    }

    async with client.post(base + "/v1/responses", json=follow_up) as resp:
        assert resp.status == status
        assert resp.headers.get("x-replay-gate") == gate_header
        answer = await resp.json()

    if action == "strip":
        assert len(strict.requests) == 1
        return
    # The upstream paired the output with its recorded call, and read the failure record.
    [output] = strict.requests[-1]["input"]
    assert json.loads(output["output"]) == EMEA_RECORD
    [message] = answer["output"]
    assert json.loads(message["content"][0]["text"].removeprefix("tool said: ")) == EMEA_RECORD


async def test_rewrite_over_websocket_inline_and_recorded(
    strict: StrictUpstream, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    base = await start_proxy(strict.url, gate={"action": "rewrite"}, tools=EMEA_ONLY)
    body: dict[str, Any] = {"type": "response.create", "model": "m", "tools": [SALES_TOOL]}
    async with client.ws_connect(base + "/v1/responses") as ws:
        first = await turn(ws, body | {"input": "sales?"})
        [call] = first["response"]["output"]
        recorded = await turn(
            ws,
            body
            | {
                "previous_response_id": first["response"]["id"],
                "input": [sales_output(call["call_id"], "unverified")],
            },
        )
        inline = await turn(
            ws, body | {"input": [USER, sales_call("call_9"), sales_output("call_9", "x")]}
        )

    assert recorded["type"] == inline["type"] == "response.completed"
    assert [json.loads(f["input"][-1]["output"]) for f in strict.frames[1:]] == [
        EMEA_RECORD,
        EMEA_RECORD,
    ]
    # The call stays as the client sent it.
    assert strict.frames[2]["input"][1] == sales_call("call_9")


async def turn(ws: aiohttp.ClientWebSocketResponse, frame: dict[str, Any]) -> dict[str, Any]:
    """Send one frame; the event that ends its turn."""
    await ws.send_str(json.dumps(frame))
    while True:
        event: dict[str, Any] = json.loads(await ws.receive_str(timeout=30))
        if event["type"] in ("response.completed", "response.failed", "error"):
            return event
