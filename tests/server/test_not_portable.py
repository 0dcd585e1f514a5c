"""`not_portable` over real HTTP: the official SDK, the proxy, and the recording upstream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from tests.builders import SALES_TOOL, audit_records, sales_call, sales_output
from tests.fixture_types import Clients, ProxyFactory
from tests.servers.recording import RecordingUpstream

QUESTION = {"role": "user", "content": "sales?"}
TOOLS: list[Any] = [SALES_TOOL]
# The spec allows a call_id of 1 to 64 characters.
ID_64 = "call_" + "a" * 59
ID_65 = "call_" + "a" * 60


async def test_a_65_character_call_id_is_blocked(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client_for: Clients,
    tmp_path: Path,
) -> None:
    client = client_for(await start_proxy(recording_upstream.url))
    replay: list[Any] = [QUESTION, sales_call(ID_65), sales_output(ID_65)]

    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(model="m", input=replay, tools=TOOLS)

    error = raised.value
    assert error.code == "replay_rejected"
    assert error.param == "input[2]"
    finding = {
        "index": 2,
        "call_id": ID_65,
        "paired_index": 1,
        "name": "get_latest_sales_report",
        "reason": "not_portable",
        "type": "function_call",
        "fail": [{"path": "/call_id", "reason": "maxLength", "expected": 64}],
        "message": (
            "the function_call breaks the spec's item schema (a server may refuse it): call_id "
            "failed schema: expected maxLength 64"
        ),
    }
    assert isinstance(error.body, dict)
    assert error.body["findings"] == [finding]
    assert recording_upstream.received == []
    [record] = audit_records(tmp_path)
    assert (record["action"], record["findings"]) == ("block", [finding])


async def test_a_64_character_call_id_is_forwarded_unchanged(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, client_for: Clients
) -> None:
    client = client_for(await start_proxy(recording_upstream.url))
    replay: list[Any] = [QUESTION, sales_call(ID_64), sales_output(ID_64)]

    raw = await client.responses.with_raw_response.create(model="m", input=replay, tools=TOOLS)

    assert "x-replay-gate" not in raw.headers
    [received] = recording_upstream.received
    assert received.json()["input"] == replay


async def test_strip_forwards_the_history_without_the_pair(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client_for: Clients,
    tmp_path: Path,
) -> None:
    client = client_for(await start_proxy(recording_upstream.url, gate={"action": "strip"}))
    good = sales_call("call_good")
    bad = sales_call("call_bad", name="get latest sales")
    replay: list[Any] = [QUESTION, good, sales_output("call_good"), bad, sales_output("call_bad")]

    raw = await client.responses.with_raw_response.create(model="m", input=replay, tools=TOOLS)

    assert raw.headers["x-replay-gate"] == "stripped=1"
    [received] = recording_upstream.received
    assert received.json()["input"] == [QUESTION, good, sales_output("call_good")]
    [record] = audit_records(tmp_path)
    [finding] = record["findings"]
    assert (finding["reason"], finding["type"], finding["fail"]) == (
        "not_portable",
        "function_call",
        [{"path": "/name", "reason": "pattern", "expected": "^[a-zA-Z0-9_-]+$"}],
    )
