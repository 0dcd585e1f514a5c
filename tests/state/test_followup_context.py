"""A complete follow-up context through the proxy: each follow-up pairs as it does direct.

The upstream (`tests/servers/context_upstream.py`) keeps the spec's context and refuses an
output that answers no call in it, so every test runs the same turns direct and through the
proxy (memory and Redis ledgers), with the official `openai` SDK as the client.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI
from openai.types.responses import ResponseCompletedEvent

from tests.builders import SALES_TOOL, audit_records, sales_output
from tests.fixture_types import Clients, ProxyFactory
from tests.servers.context_upstream import ContextUpstream, serve_context_upstream

MODEL = "scripted"
TOOLS: list[Any] = [SALES_TOOL]


@pytest.fixture
async def context_upstream() -> AsyncIterator[ContextUpstream]:
    async for upstream in serve_context_upstream():
        yield upstream


@pytest.fixture(params=["memory", "redis"])
def ledger(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The ledger section of the proxy's config: each backend in turn."""
    if request.param == "memory":
        return {"backend": "memory"}
    server = request.getfixturevalue("redis_server")
    return {"backend": "redis", "url": server.url}


Via = str
VIAS = ["direct", "proxy"]


async def client(
    via: Via,
    upstream: ContextUpstream,
    start_proxy: ProxyFactory,
    client_for: Clients,
    ledger: dict[str, Any] | None = None,
    **sections: Any,
) -> AsyncOpenAI:
    if via == "direct":
        return client_for(upstream.url)
    return client_for(await start_proxy(upstream.url, ledger=ledger or {}, **sections))


def text_of(response: Any) -> str:
    return str(response.output_text)


def call_of(response: Any) -> dict[str, Any]:
    [call] = [item for item in response.output if item.type == "function_call"]
    return dict(call.model_dump(exclude_none=True))


async def create(sdk: AsyncOpenAI, *, stream: bool, **request: Any) -> Any:
    """responses.create, streamed or not; the final response either way."""
    if not stream:
        return await sdk.responses.create(model=MODEL, **request)
    events = await sdk.responses.create(model=MODEL, stream=True, **request)
    [done] = [e.response async for e in events if isinstance(e, ResponseCompletedEvent)]
    return done


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("via", VIAS)
async def test_a_call_sent_inline_is_answered_on_the_next_turn(
    via: Via,
    stream: bool,
    context_upstream: ContextUpstream,
    start_proxy: ProxyFactory,
    client_for: Clients,
    ledger: dict[str, Any],
) -> None:
    sdk = await client(via, context_upstream, start_proxy, client_for, ledger)
    inline = {
        "type": "function_call",
        "call_id": "call_inline",
        "name": "get_latest_sales_report",
        "arguments": '{"region":"emea"}',
        "status": "completed",
    }
    first = await create(
        sdk, stream=stream, tools=TOOLS, input=[{"role": "user", "content": "sales?"}, inline]
    )

    answer = await create(
        sdk,
        stream=stream,
        tools=TOOLS,
        previous_response_id=first.id,
        input=[sales_output("call_inline", "emea: 7")],
    )

    assert text_of(answer) == "tool said: emea: 7"
    assert context_upstream.received[-1]["input"] == [sales_output("call_inline", "emea: 7")]


@pytest.mark.parametrize("via", VIAS)
async def test_a_reference_to_a_relayed_assistant_message_resolves(
    via: Via, context_upstream: ContextUpstream, start_proxy: ProxyFactory, client_for: Clients
) -> None:
    sdk = await client(via, context_upstream, start_proxy, client_for)
    first = await sdk.responses.create(model=MODEL, input="hi")
    [message] = first.output

    follow_up: list[Any] = [
        {"type": "item_reference", "id": message.id},
        {"role": "user", "content": "again"},
    ]
    answer = await sdk.responses.create(model=MODEL, input=follow_up)

    assert text_of(answer) == "hello"


@pytest.mark.parametrize("read", ["json", "sse"])
@pytest.mark.parametrize("via", VIAS)
async def test_a_background_response_read_again_pairs_its_follow_up(
    via: Via,
    read: str,
    context_upstream: ContextUpstream,
    start_proxy: ProxyFactory,
    client_for: Clients,
    ledger: dict[str, Any],
) -> None:
    sdk = await client(via, context_upstream, start_proxy, client_for, ledger)
    queued = await sdk.responses.create(model=MODEL, tools=TOOLS, input="sales?", background=True)
    assert queued.status == "queued"
    assert queued.output == []

    if read == "json":
        done = await sdk.responses.retrieve(queued.id)
    else:
        events = await sdk.responses.retrieve(queued.id, stream=True)
        [done] = [e.response async for e in events if isinstance(e, ResponseCompletedEvent)]
    call = call_of(done)
    answer = await sdk.responses.create(
        model=MODEL,
        tools=TOOLS,
        previous_response_id=queued.id,
        input=[sales_output(call["call_id"], "apac: 42")],  # type: ignore[list-item]
    )

    assert text_of(answer) == "tool said: apac: 42"


@pytest.mark.parametrize("via", VIAS)
async def test_a_compacted_call_pairs_with_its_output(
    via: Via,
    context_upstream: ContextUpstream,
    start_proxy: ProxyFactory,
    client_for: Clients,
    ledger: dict[str, Any],
) -> None:
    sdk = await client(via, context_upstream, start_proxy, client_for, ledger)
    first = await sdk.responses.create(model=MODEL, tools=TOOLS, input="sales?")
    call = call_of(first)
    compacted = await sdk.responses.compact(model=MODEL, previous_response_id=first.id)
    window = [item.model_dump(exclude_none=True) for item in compacted.output]
    assert [item["type"] for item in window] == ["compaction"]

    answer = await sdk.responses.create(
        model=MODEL,
        tools=TOOLS,
        input=[*window, sales_output(call["call_id"], "apac: 3")],  # type: ignore[list-item]
    )

    assert text_of(answer) == "tool said: apac: 3"


async def test_an_output_a_compaction_does_not_hold_is_still_an_orphan(
    context_upstream: ContextUpstream, start_proxy: ProxyFactory, client_for: Clients
) -> None:
    sdk = client_for(await start_proxy(context_upstream.url))
    first = await sdk.responses.create(model=MODEL, tools=TOOLS, input="sales?")
    compacted = await sdk.responses.compact(model=MODEL, previous_response_id=first.id)
    window = [item.model_dump(exclude_none=True) for item in compacted.output]

    with pytest.raises(openai.BadRequestError) as raised:
        await sdk.responses.create(
            model=MODEL,
            tools=TOOLS,
            input=[*window, sales_output("call_not_compacted")],  # type: ignore[list-item]
        )

    assert isinstance(raised.value.body, dict)
    assert [f["reason"] for f in raised.value.body["findings"]] == ["orphan"]


@pytest.mark.parametrize("via", VIAS)
async def test_a_call_by_reference_and_by_chain_is_one_call(
    via: Via, context_upstream: ContextUpstream, start_proxy: ProxyFactory, client_for: Clients
) -> None:
    sdk = await client(via, context_upstream, start_proxy, client_for)
    first = await sdk.responses.create(model=MODEL, tools=TOOLS, input="sales?")
    call = call_of(first)

    follow_up: list[Any] = [
        {"type": "item_reference", "id": call["id"]},
        sales_output(call["call_id"], "apac: 5"),
    ]
    answer = await sdk.responses.create(
        model=MODEL, tools=TOOLS, previous_response_id=first.id, input=follow_up
    )

    assert text_of(answer) == "tool said: apac: 5"


@pytest.mark.parametrize("via", VIAS)
async def test_a_follow_up_that_offers_no_tools_pairs(
    via: Via,
    context_upstream: ContextUpstream,
    start_proxy: ProxyFactory,
    client_for: Clients,
    ledger: dict[str, Any],
) -> None:
    sdk = await client(via, context_upstream, start_proxy, client_for, ledger)
    first = await sdk.responses.create(model=MODEL, tools=TOOLS, input="sales?")
    call = call_of(first)

    answer = await sdk.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[sales_output(call["call_id"], "apac: 9")],  # type: ignore[list-item]
    )

    assert text_of(answer) == "tool said: apac: 9"
    assert "tools" not in context_upstream.received[-1]


async def test_a_recorded_call_is_judged_by_its_own_tool_when_none_is_offered(
    context_upstream: ContextUpstream,
    start_proxy: ProxyFactory,
    client_for: Clients,
    tmp_path: Path,
    ledger: dict[str, Any],
) -> None:
    sdk = client_for(await start_proxy(context_upstream.url, ledger=ledger))
    first = await sdk.responses.create(
        model=MODEL, tools=TOOLS, input="sales?", metadata={"arguments": '{"region":"mars"}'}
    )
    call = call_of(first)
    sent = len(context_upstream.received)

    with pytest.raises(openai.BadRequestError) as raised:
        await sdk.responses.create(
            model=MODEL,
            previous_response_id=first.id,
            input=[sales_output(call["call_id"])],  # type: ignore[list-item]
        )

    assert isinstance(raised.value.body, dict)
    [finding] = raised.value.body["findings"]
    assert (finding["reason"], finding["fail"]) == (
        "arguments_schema",
        [{"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}],
    )
    assert len(context_upstream.received) == sent  # nothing of it went upstream
    # The first answer's call is audited too, as the model's own (door 2): only the replay here.
    replays = [r for r in audit_records(tmp_path) if r["event"] == "replay_rejected"]
    assert [r["findings"][0]["reason"] for r in replays] == ["arguments_schema"]


async def test_a_pinned_schema_wins_over_the_recorded_tool(
    context_upstream: ContextUpstream, start_proxy: ProxyFactory, client_for: Clients
) -> None:
    pinned = {"type": "object", "properties": {"region": {"const": "emea"}}}
    base = await start_proxy(context_upstream.url, tools={"get_latest_sales_report": pinned})
    sdk = client_for(base)
    first = await sdk.responses.create(model=MODEL, tools=TOOLS, input="sales?")

    with pytest.raises(openai.BadRequestError) as raised:
        await sdk.responses.create(
            model=MODEL,
            previous_response_id=first.id,
            input=[sales_output(call_of(first)["call_id"])],  # type: ignore[list-item]
        )

    assert isinstance(raised.value.body, dict)
    [finding] = raised.value.body["findings"]
    assert (finding["reason"], finding["fail"][0]["reason"]) == ("arguments_schema", "const")


async def test_another_tenant_does_not_see_my_recorded_input(
    context_upstream: ContextUpstream, start_proxy: ProxyFactory, client_for: Clients
) -> None:
    base = await start_proxy(context_upstream.url)
    inline = {
        "type": "function_call",
        "call_id": "call_inline",
        "name": "get_latest_sales_report",
        "arguments": '{"region":"emea"}',
        "status": "completed",
    }
    first = await client_for(base).responses.create(
        model=MODEL,
        tools=TOOLS,
        input=[inline],  # type: ignore[list-item]
    )
    other = AsyncOpenAI(base_url=base + "/v1", api_key="sk-tenant-b", max_retries=0)
    try:
        with pytest.raises(openai.BadRequestError) as raised:
            await other.responses.create(
                model=MODEL,
                tools=TOOLS,
                previous_response_id=first.id,
                input=[sales_output("call_inline")],  # type: ignore[list-item]
            )
    finally:
        await other.close()
    assert raised.value.code == "replay_rejected"


async def test_a_call_the_client_sent_is_never_taken_for_one_an_upstream_emitted(
    context_upstream: ContextUpstream,
    start_proxy: ProxyFactory,
    client_for: Clients,
    ledger: dict[str, Any],
) -> None:
    base = await start_proxy(context_upstream.url, ledger=ledger, gate={"require_provenance": True})
    sdk = client_for(base)
    made_up = {
        "type": "function_call",
        "id": "fc_made_up",
        "call_id": "call_made_up",
        "name": "get_latest_sales_report",
        "arguments": '{"region":"emea"}',
        "status": "completed",
    }
    first = await sdk.responses.create(
        model=MODEL,
        tools=TOOLS,
        input=[made_up],  # type: ignore[list-item]
    )
    follow_ups: list[list[Any]] = [
        [sales_output("call_made_up")],
        [{"type": "item_reference", "id": "fc_made_up"}, sales_output("call_made_up")],
    ]
    for follow_up in follow_ups:
        with pytest.raises(openai.BadRequestError) as raised:
            await sdk.responses.create(
                model=MODEL, tools=TOOLS, previous_response_id=first.id, input=follow_up
            )
        assert isinstance(raised.value.body, dict)
        assert [f["reason"] for f in raised.value.body["findings"]] == ["provenance"]


async def test_a_websocket_turn_records_its_input(
    context_upstream: ContextUpstream, start_proxy: ProxyFactory
) -> None:
    base = await start_proxy(context_upstream.url)
    inline = {
        "type": "function_call",
        "call_id": "call_ws",
        "name": "get_latest_sales_report",
        "arguments": '{"region":"amer"}',
        "status": "completed",
    }
    headers = {"Authorization": "Bearer sk-test-client"}
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(base + "/v1/responses", headers=headers) as ws,
    ):
        first = {"type": "response.create", "model": MODEL, "tools": TOOLS, "input": [inline]}
        await ws.send_str(json.dumps(first))
        created = json.loads((await ws.receive()).data)
        assert created["type"] == "response.completed"
        follow_up = {
            "type": "response.create",
            "model": MODEL,
            "tools": TOOLS,
            "previous_response_id": created["response"]["id"],
            "input": [sales_output("call_ws", "amer: 1")],
        }
        await ws.send_str(json.dumps(follow_up))
        answer = json.loads((await ws.receive()).data)

    assert answer["type"] == "response.completed", answer
    [message] = answer["response"]["output"]
    assert message["content"][0]["text"] == "tool said: amer: 1"
