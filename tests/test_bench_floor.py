"""The floor of bench/ (issue 26): what it forwards and what it refuses, as a minimal gating
proxy must; it is the reference replay-proxy's cost is compared with, so it must do that work."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.servers.loopback import serving
from tests.servers.recording import RecordingUpstream

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))  # its own imports
import floor
import passthrough

CALL = {
    "type": "function_call",
    "call_id": "call_1",
    "name": "lookup_order",
    "arguments": '{"order_id":"ORD-100001"}',
}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "shipped"}


@pytest.fixture
async def floor_url(recording_upstream: RecordingUpstream) -> AsyncIterator[str]:
    async with serving(passthrough.make_app(recording_upstream.url, floor.gate)) as url:
        yield url


async def post(url: str, data: bytes) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url + "/v1/responses", data=data, headers={"Content-Type": "application/json"}
        ) as answer,
    ):
        return answer.status, await answer.read()


def body(*items: object, **extra: object) -> bytes:
    return json.dumps({"model": "m", "input": list(items), **extra}).encode()


async def test_a_paired_body_is_forwarded_byte_for_byte(
    floor_url: str, recording_upstream: RecordingUpstream
) -> None:
    sent = body(CALL, OUTPUT)
    status, answer = await post(floor_url, sent)
    assert status == 200
    assert json.loads(answer)["id"] == "resp_1"
    assert [r.body for r in recording_upstream.received] == [sent]


@pytest.mark.parametrize(
    ("sent", "reason"),
    [
        pytest.param(b'{"model":"m","input":[],"input":[]}', "invalid_json", id="duplicate-key"),
        pytest.param(b'{"model":"m","temperature":NaN}', "invalid_json", id="nan"),
        pytest.param(body(OUTPUT), "orphan", id="orphan"),
        pytest.param(
            body({**CALL, "arguments": '{"a":1,"a":2}'}, OUTPUT), "arguments_parse", id="arguments"
        ),
    ],
)
async def test_what_a_strict_gate_refuses_is_refused(
    floor_url: str, recording_upstream: RecordingUpstream, sent: bytes, reason: str
) -> None:
    status, answer = await post(floor_url, sent)
    assert (status, json.loads(answer)["error"]["code"]) == (400, reason)
    assert recording_upstream.received == []


async def test_an_output_of_a_named_previous_response_passes(
    floor_url: str, recording_upstream: RecordingUpstream
) -> None:
    """It keeps no ledger: the output's call is upstream's to know."""
    status, _ = await post(floor_url, body(OUTPUT, previous_response_id="resp_0"))
    assert status == 200
    assert len(recording_upstream.received) == 1


def test_a_verdict_is_judged_once() -> None:
    floor._VERDICTS.clear()
    assert floor.verdict("f", '{"x":1}') is True
    assert floor.verdict("f", "[1]") is False
    assert floor._VERDICTS == {("f", '{"x":1}'): True, ("f", "[1]"): False}
