"""The official openai SDK, only base_url changed, through the proxy to real upstreams."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from tests.builders import SALES_TOOL, audit_records, sales_call, sales_output
from tests.fixture_types import Clients, ProxyFactory
from tests.servers.recording import RecordingUpstream

MODEL = "scripted"
TOOLS: list[Any] = [SALES_TOOL]


async def first_turn(client: AsyncOpenAI) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The model calls the sales tool; returns the history so far and the call it made."""
    question: dict[str, Any] = {"role": "user", "content": "what are the latest sales?"}
    response = await client.responses.create(model=MODEL, input=[question], tools=TOOLS)  # type: ignore[list-item]
    [call] = [item for item in response.output if item.type == "function_call"]
    made = call.model_dump(exclude_none=True)
    assert made["name"] == "get_latest_sales_report"
    assert json.loads(made["arguments"]) == {"region": "apac"}
    return [question, made], made


async def test_clean_replay_passes(
    scripted_upstream: str, start_proxy: ProxyFactory, client_for: Clients, tmp_path: Path
) -> None:
    client = client_for(await start_proxy(scripted_upstream))
    history, call = await first_turn(client)
    replay: list[Any] = [*history, sales_output(call["call_id"], "apac: 42 units")]

    response = await client.responses.create(model=MODEL, input=replay, tools=TOOLS)

    assert response.output_text == "tool said: apac: 42 units"
    assert audit_records(tmp_path) == []


async def test_failing_replay_raises_bad_request(
    scripted_upstream: str, start_proxy: ProxyFactory, client_for: Clients, tmp_path: Path
) -> None:
    client = client_for(await start_proxy(scripted_upstream))
    history, call = await first_turn(client)
    history[1] = call | {"arguments": json.dumps({"region": "global"})}
    replay: list[Any] = [*history, sales_output(call["call_id"])]

    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(model=MODEL, input=replay, tools=TOOLS)

    error = raised.value
    assert error.code == "replay_rejected"
    assert error.response.headers["x-should-retry"] == "false"
    assert isinstance(error.body, dict)
    assert error.body["findings"] == [
        {
            "index": 2,
            "call_id": call["call_id"],
            "paired_index": 1,
            "name": "get_latest_sales_report",
            "reason": "arguments_schema",
            "pass": [],
            "fail": [{"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}],
            "message": "region failed schema: expected one of apac, emea, amer",
        }
    ]
    [record] = audit_records(tmp_path)
    assert record["action"] == "block"
    assert record["model"] == MODEL
    assert "sk-test-client" not in json.dumps(record)


async def test_streaming_arrives_event_by_event(
    scripted_upstream: str, start_proxy: ProxyFactory, client_for: Clients
) -> None:
    client = client_for(await start_proxy(scripted_upstream))
    stream = await client.responses.create(
        model=MODEL, input="hello through the proxy", stream=True
    )

    events = [event async for event in stream]

    kinds = [event.type for event in events]
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) >= 3
    assert "".join(deltas) == "echo: hello through the proxy"
    assert [e.sequence_number for e in events] == list(range(len(events)))


async def test_streamed_replay_is_gated_before_it_starts(
    scripted_upstream: str, start_proxy: ProxyFactory, client_for: Clients
) -> None:
    client = client_for(await start_proxy(scripted_upstream))
    history, call = await first_turn(client)
    history[1] = call | {"status": "in_progress"}

    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(
            model=MODEL,
            input=[*history, sales_output(call["call_id"])],  # type: ignore[list-item]
            tools=TOOLS,
            stream=True,
        )

    assert raised.value.code == "replay_rejected"
    assert isinstance(raised.value.body, dict)
    assert raised.value.body["findings"][0]["reason"] == "status"


async def test_stripped_replay_reaches_upstream_without_the_pair(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, client_for: Clients
) -> None:
    client = client_for(await start_proxy(recording_upstream.url, gate={"action": "strip"}))
    good, bad = sales_call("call_good"), sales_call("call_bad", "global")
    question = {"role": "user", "content": "sales?"}
    replay: list[Any] = [question, good, sales_output("call_good"), bad, sales_output("call_bad")]

    raw = await client.responses.with_raw_response.create(
        model=MODEL,
        input=replay,
        tools=TOOLS,
    )

    assert raw.headers["x-replay-gate"] == "stripped=1"
    [received] = recording_upstream.received
    assert received.target == "/v1/responses"
    assert received.json()["input"] == [question, good, sales_output("call_good")]
    assert received.json()["tools"] == [SALES_TOOL]
