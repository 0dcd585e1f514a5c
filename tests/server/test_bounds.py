"""Nothing unbounded over real HTTP and WebSocket: a small request that fails thousands of ways
gets a small answer, a small audit line, and never a forwarded body over the size limit."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.builders import (
    AMPLIFYING,
    JSON_HEADERS,
    PICK_TOOL,
    USER,
    WIDE_ENUM,
    audit_records,
    compact,
    pick_call,
    sales_output,
)
from tests.fixture_types import ProxyFactory
from tests.servers.recording import RecordingUpstream

KiB = 1024


def test_the_request_is_the_reviews() -> None:
    assert 850 <= len(json.dumps(WIDE_ENUM)) <= 1000
    assert len(AMPLIFYING) < 20 * KiB


def audit_lines(tmp_path: Path) -> list[bytes]:
    return (tmp_path / "audit.jsonl").read_bytes().splitlines()


async def test_the_amplifying_request_gets_a_small_answer_and_a_small_record(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    # Every violation is counted, however slow the machine: a validation stopped by its time
    # budget would leave fewer (the budget's own tests are elsewhere).
    base = await start_proxy(recording_upstream.url, gate={"validation_timeout_s": 60})

    async with client.post(base + "/v1/responses", data=AMPLIFYING, headers=JSON_HEADERS) as resp:
        assert resp.status == 400
        answer = await resp.read()

    assert recording_upstream.received == []
    assert len(answer) < 256 * KiB
    [finding] = json.loads(answer)["error"]["findings"]
    assert (finding["reason"], len(finding["fail"]), finding["fail_omitted"]) == (
        "arguments_schema",
        20,
        5980,
    )
    assert finding["fail"][0] == {"path": "/values/0", "reason": "enum", "expected": WIDE_ENUM}
    [line] = audit_lines(tmp_path)
    assert len(line) < 256 * KiB
    [recorded] = json.loads(line)["findings"]
    assert recorded["fail_omitted"] == 5980


async def test_the_caps_are_the_configs(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    base = await start_proxy(
        recording_upstream.url, limits={"max_findings": 2, "max_violations": 3}
    )
    pairs = [item for n in range(5) for item in (pick_call(f"call_{n}"), sales_output(f"call_{n}"))]
    body = compact({"model": "m", "tools": [PICK_TOOL], "input": [USER, *pairs]})

    async with client.post(base + "/v1/responses", data=body, headers=JSON_HEADERS) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]

    assert recording_upstream.received == []
    assert error["findings_omitted"] == 3
    assert [(f["index"], len(f["fail"]), f["fail_omitted"]) for f in error["findings"]] == [
        (2, 3, 5997),
        (4, 3, 5997),
    ]
    assert error["message"].endswith("(and 4 more findings)")
    [record] = audit_records(tmp_path)
    assert record["findings"] == error["findings"]
    assert record["findings_omitted"] == 3


async def test_a_rewrite_within_the_size_limit_goes_up_bounded(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    limit = 128 * KiB
    base = await start_proxy(
        recording_upstream.url, gate={"action": "rewrite"}, limits={"max_body_bytes": limit}
    )

    async with client.post(base + "/v1/responses", data=AMPLIFYING, headers=JSON_HEADERS) as resp:
        assert resp.status == 200
        assert resp.headers["x-replay-gate"] == "rewritten=1"

    [got] = recording_upstream.received
    assert len(got.body) <= limit
    record = json.loads(got.json()["input"][-1]["output"])
    assert (len(record["fail"]), record["fail_omitted"]) == (20, 5980)
    assert record["error"].endswith("; and 5980 more violations")
    [line] = audit_lines(tmp_path)
    assert len(line) < 256 * KiB


@pytest.mark.parametrize(
    ("limit", "size"),
    [
        # Room for the request (under 20 KiB), not for its failure record (some 38 KiB): the
        # gate stops before it builds the body.
        pytest.param(32 * KiB, r"more than \d+", id="the-record-alone-is-over"),
        # Room for the record, not for the request with it (some 58 KiB): the body built is.
        pytest.param(48 * KiB, r"\d+", id="the-body-built-is-over"),
    ],
)
async def test_a_rewrite_over_the_size_limit_is_blocked_saying_so(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
    limit: int,
    size: str,
) -> None:
    base = await start_proxy(
        recording_upstream.url, gate={"action": "rewrite"}, limits={"max_body_bytes": limit}
    )

    async with client.post(base + "/v1/responses", data=AMPLIFYING, headers=JSON_HEADERS) as resp:
        assert resp.status == 400
        assert resp.headers["x-should-retry"] == "false"
        assert "x-replay-gate" not in resp.headers
        error = (await resp.json())["error"]

    assert recording_upstream.received == []
    assert error["code"] == "replay_rejected"
    assert error["param"] == "input[2]"
    said = (
        f"the body with its outputs rewritten would be {size} bytes, over "
        rf"limits\.max_body_bytes \({limit}\): blocked instead\. input\[2\] \(call_id call_1\): "
    )
    assert re.match(said, error["message"]), error["message"]
    [record] = audit_records(tmp_path)
    assert record["action"] == "block"
    assert record["findings"] == error["findings"]


async def test_a_websocket_error_event_is_bounded(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    base = await start_proxy(recording_upstream.url)
    frame = {"type": "response.create", **json.loads(AMPLIFYING)}
    async with client.ws_connect(base + "/v1/responses") as ws:
        await ws.send_str(json.dumps(frame))
        event = await ws.receive_str(timeout=30)

    assert recording_upstream.frames == []
    assert len(event) < 256 * KiB
    error: dict[str, Any] = json.loads(event)
    assert (error["type"], error["status"]) == ("error", 400)
    [finding] = error["error"]["findings"]
    assert (len(finding["fail"]), finding["fail_omitted"]) == (20, 5980)
    [line] = audit_lines(tmp_path)
    assert len(line) < 256 * KiB
