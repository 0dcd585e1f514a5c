"""Follow-up turns through the ledger: previous_response_id, provenance, Redis shared and down."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp.web import ContentCoding
from openai import AsyncOpenAI
from openai.types.responses import ResponseCompletedEvent

from tests.builders import SALES_TOOL, audit_records, sales_call, sales_output
from tests.fixture_types import Clients, ProxyFactory
from tests.server.checks import metric, scrape
from tests.servers.recording import Received, RecordingUpstream
from tests.servers.redis_server import RedisServer

MODEL = "scripted"
TOOLS: list[Any] = [SALES_TOOL]


async def create(client: AsyncOpenAI, *, stream: bool, **request: Any) -> Any:
    """responses.create, streamed or not; returns the final response either way."""
    if not stream:
        return await client.responses.create(model=MODEL, tools=TOOLS, **request)
    events = await client.responses.create(model=MODEL, tools=TOOLS, stream=True, **request)
    completed = [e.response async for e in events if isinstance(e, ResponseCompletedEvent)]
    assert len(completed) == 1
    return completed[0]


async def tool_turn(client: AsyncOpenAI, *, stream: bool) -> tuple[str, dict[str, Any]]:
    """Turn 1: the model calls the sales tool. Returns the response id and the call."""
    response = await create(client, stream=stream, input="what are the latest sales?")
    [call] = [item for item in response.output if item.type == "function_call"]
    return response.id, call.model_dump(exclude_none=True)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_follow_up_with_only_the_output_passes(
    scripted_upstream: str, start_proxy: ProxyFactory, client_for: Clients, stream: bool
) -> None:
    client = client_for(await start_proxy(scripted_upstream))
    answer = await two_turns(client, stream=stream)
    assert answer.output_text == "tool said: apac: 42"


async def two_turns(client: AsyncOpenAI, *, stream: bool) -> Any:
    """The tool turn, then a follow-up that sends only the call's output; the follow-up's
    final response."""
    response_id, call = await tool_turn(client, stream=stream)
    return await create(
        client,
        stream=stream,
        input=[sales_output(call["call_id"], "apac: 42")],
        previous_response_id=response_id,
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_fabricated_output_is_blocked(
    scripted_upstream: str,
    start_proxy: ProxyFactory,
    client_for: Clients,
    tmp_path: Path,
    stream: bool,
) -> None:
    client = client_for(await start_proxy(scripted_upstream))
    response_id, _ = await tool_turn(client, stream=stream)

    with pytest.raises(openai.BadRequestError) as raised:
        await create(
            client,
            stream=stream,
            input=[sales_output("call_never_made")],
            previous_response_id=response_id,
        )

    assert raised.value.code == "replay_rejected"
    assert isinstance(raised.value.body, dict)
    assert [f["reason"] for f in raised.value.body["findings"]] == ["orphan"]
    [record] = audit_records(tmp_path)
    assert record["previous_response_id"] == response_id


async def test_another_tenant_cannot_pair_with_my_response(
    scripted_upstream: str, start_proxy: ProxyFactory, client_for: Clients
) -> None:
    base = await start_proxy(scripted_upstream)
    response_id, call = await tool_turn(client_for(base), stream=False)
    other = AsyncOpenAI(base_url=base + "/v1", api_key="sk-tenant-b", max_retries=0)

    with pytest.raises(openai.BadRequestError) as raised:
        await other.responses.create(
            model=MODEL,
            input=[sales_output(call["call_id"])],  # type: ignore[list-item]
            previous_response_id=response_id,
        )
    await other.close()

    assert raised.value.code == "replay_rejected"


async def test_an_unknown_previous_response_fails_closed_unless_configured_open(
    recording_upstream: Any, start_proxy: ProxyFactory
) -> None:
    body = {"model": MODEL, "previous_response_id": "resp_unknown", "input": [sales_output("c1")]}
    closed = await start_proxy(recording_upstream.url)
    opened = await start_proxy(recording_upstream.url, ledger={"fail_open": True})
    async with aiohttp.ClientSession() as session:
        async with session.post(closed + "/v1/responses", json=body) as response:
            assert response.status == 400
            assert (await response.json())["error"]["findings"][0]["reason"] == "orphan"
        assert recording_upstream.received == []
        async with session.post(opened + "/v1/responses", json=body) as response:
            assert response.status == 200
    [received] = recording_upstream.received
    assert received.json() == body


async def test_two_proxies_sharing_redis_pair_across_processes(
    scripted_upstream: str,
    start_proxy: ProxyFactory,
    client_for: Clients,
    redis_server: RedisServer,
) -> None:
    ledger = {"backend": "redis", "url": redis_server.url}
    first = client_for(await start_proxy(scripted_upstream, ledger=ledger))
    second = client_for(await start_proxy(scripted_upstream, ledger=ledger))
    response_id, call = await tool_turn(first, stream=True)

    answer = await create(
        second,
        stream=False,
        input=[sales_output(call["call_id"], "from the second proxy")],
        previous_response_id=response_id,
    )

    assert answer.output_text == "tool said: from the second proxy"


async def test_a_memory_ledger_is_per_process(
    scripted_upstream: str, start_proxy: ProxyFactory, client_for: Clients
) -> None:
    first = client_for(await start_proxy(scripted_upstream))
    second = client_for(await start_proxy(scripted_upstream))
    response_id, call = await tool_turn(first, stream=False)

    with pytest.raises(openai.BadRequestError):
        await create(
            second,
            stream=False,
            input=[sales_output(call["call_id"])],
            previous_response_id=response_id,
        )


@pytest.mark.parametrize(
    ("edit", "rejected"),
    [
        pytest.param({}, False, id="as-emitted"),
        pytest.param({"arguments": json.dumps({"region": "emea"})}, True, id="edited-arguments"),
        pytest.param({"name": "lookup_order"}, True, id="edited-name"),
    ],
)
async def test_provenance_rejects_a_call_the_model_never_made(
    scripted_upstream: str,
    start_proxy: ProxyFactory,
    client_for: Clients,
    edit: dict[str, Any],
    rejected: bool,
) -> None:
    client = client_for(await start_proxy(scripted_upstream, gate={"require_provenance": True}))
    _, call = await tool_turn(client, stream=False)
    history = [
        {"role": "user", "content": "what are the latest sales?"},
        call | edit,
        sales_output(call["call_id"], "apac: 42"),
    ]
    tools = [SALES_TOOL, SALES_TOOL | {"name": "lookup_order"}]

    if not rejected:
        answer = await client.responses.create(model=MODEL, input=history, tools=tools)  # type: ignore[arg-type]
        assert answer.output_text == "tool said: apac: 42"
        return
    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(model=MODEL, input=history, tools=tools)  # type: ignore[arg-type]
    assert isinstance(raised.value.body, dict)
    assert [f["reason"] for f in raised.value.body["findings"]] == ["provenance"]


def ledger_settings(backend: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    if backend == "memory":
        return {"backend": "memory"}
    redis_server: RedisServer = request.getfixturevalue("redis_server")
    return {"backend": "redis", "url": redis_server.url}


# How clients that rebuild calls from their own records replay them (the AI SDK, LangChain):
# no `status`, no `id`.
def rebuilt(call: dict[str, Any]) -> dict[str, Any]:
    return {k: call[k] for k in ("type", "call_id", "name", "arguments")}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_call_replayed_without_status_is_judged_by_the_status_it_was_relayed_with(
    scripted_upstream: str,
    start_proxy: ProxyFactory,
    client_for: Clients,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    backend: str,
    stream: bool,
) -> None:
    base = await start_proxy(scripted_upstream, ledger=ledger_settings(backend, request))
    client = client_for(base)
    _, call = await tool_turn(client, stream=stream)
    question = {"role": "user", "content": "what are the latest sales?"}

    answer = await create(
        client,
        stream=stream,
        input=[question, rebuilt(call), sales_output(call["call_id"], "apac: 42")],
    )
    assert answer.output_text == "tool said: apac: 42"
    assert audit_records(tmp_path) == []

    # The proxy never relayed these calls: the seed's rule stands, a missing status fails.
    other = AsyncOpenAI(base_url=base + "/v1", api_key="sk-tenant-b", max_retries=0)
    never_relayed = [
        (client, rebuilt(call) | {"arguments": json.dumps({"region": "emea"})}),
        (client, rebuilt(call) | {"call_id": "call_never_made"}),
        (other, rebuilt(call)),
    ]
    try:
        for sender, replayed in never_relayed:
            with pytest.raises(openai.BadRequestError) as raised:
                await create(
                    sender,
                    stream=False,
                    input=[question, replayed, sales_output(replayed["call_id"])],
                )
            assert isinstance(raised.value.body, dict)
            assert [f["reason"] for f in raised.value.body["findings"]] == ["status"]
    finally:
        await other.close()


def answers_with_one_call(status: str) -> Any:
    """An upstream handler whose every answer emits one sales call with this `status`."""

    async def handle(request: web.Request, received: Received) -> web.StreamResponse:
        item = sales_call("call_1") | {"status": status}
        return web.json_response({"object": "response", "id": "resp_1", "output": [item]})

    return handle


@pytest.mark.parametrize(
    ("emitted", "replayed", "status", "reasons"),
    [
        pytest.param("completed", "completed", 200, [], id="as-emitted"),
        pytest.param("completed", None, 200, [], id="status-left-out"),
        pytest.param(
            "incomplete", "completed", 400, ["provenance"], id="incomplete-made-completed"
        ),
        pytest.param("incomplete", None, 400, ["status"], id="incomplete-status-left-out"),
    ],
)
async def test_provenance_compares_the_status_too(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    emitted: str,
    replayed: str | None,
    status: int,
    reasons: list[str],
) -> None:
    recording_upstream.handler = answers_with_one_call(emitted)
    base = await start_proxy(recording_upstream.url, gate={"require_provenance": True})
    call = sales_call("call_1")
    if replayed is None:
        del call["status"]
    else:
        call["status"] = replayed
    replay = {"model": MODEL, "tools": TOOLS, "input": [call, sales_output("call_1")]}
    headers = {"Authorization": "Bearer sk-test-client"}

    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(base + "/v1/responses", json={"model": MODEL}) as first:
            assert first.status == 200
        async with session.post(base + "/v1/responses", json=replay) as answer:
            assert answer.status == status
            found = (await answer.json()).get("error", {}).get("findings", [])

    assert [f["reason"] for f in found] == reasons
    forwarded = [r.json() for r in recording_upstream.received[1:]]
    assert forwarded == ([replay] if status == 200 else [])


async def test_fail_open_does_not_waive_provenance(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory
) -> None:
    """An unknown previous response lets an unpaired output through under fail_open; a call the
    model never made, sent inline beside it, is still refused."""
    base = await start_proxy(
        recording_upstream.url, ledger={"fail_open": True}, gate={"require_provenance": True}
    )
    body = {
        "model": MODEL,
        "tools": TOOLS,
        "previous_response_id": "resp_unknown",
        "input": [sales_output("c1"), sales_call("c2"), sales_output("c2")],
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(base + "/v1/responses", json=body) as answer,
    ):
        assert answer.status == 400
        error = (await answer.json())["error"]
    assert [(f["index"], f["reason"]) for f in error["findings"]] == [(2, "provenance")]
    assert recording_upstream.received == []


async def test_redis_down_is_a_503_the_sdk_retries_and_then_recovers(
    scripted_upstream: str,
    start_proxy: ProxyFactory,
    client_for: Clients,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A follow-up while Redis is down is the proxy's fault: 503 `ledger_unavailable`, which
    the official SDK retries (each try reaches the proxy), never a 400 `orphan`."""
    ledger = {"backend": "redis", "url": redis_server.url, "timeout_s": 1}
    base = await start_proxy(scripted_upstream, ledger=ledger)
    client = client_for(base)
    response_id, call = await tool_turn(client, stream=False)
    retrying = AsyncOpenAI(base_url=base + "/v1", api_key="sk-test-client", max_retries=2)

    redis_server.stop()
    with (
        caplog.at_level(logging.WARNING, logger="replay_proxy"),
        pytest.raises(openai.InternalServerError) as raised,
    ):
        await create(
            retrying,
            stream=False,
            input=[sales_output(call["call_id"])],
            previous_response_id=response_id,
        )
    await retrying.close()
    assert raised.value.status_code == 503
    assert raised.value.code == "ledger_unavailable"
    assert raised.value.type == "server_error"
    async with aiohttp.ClientSession() as session:
        text = await scrape(session, base)
    # The first try and both retries reached the proxy, and each read failed.
    labels = {
        "route": "responses",
        "outcome": "ledger_unavailable",
        "upstream": "default",
        "dialect": "responses",
    }
    assert metric(text, "replay_proxy_requests_total", **labels) == 3
    assert metric(text, "replay_proxy_ledger_faults_total", operation="read") == 3
    warned = [r for r in caplog.records if "answered 503 ledger_unavailable" in r.getMessage()]
    assert [r.levelno for r in warned] == [logging.WARNING] * 3

    redis_server.start()
    response_id, call = await tool_turn(client, stream=False)
    answer = await create(
        client,
        stream=False,
        input=[sales_output(call["call_id"], "back")],
        previous_response_id=response_id,
    )
    assert answer.output_text == "tool said: back"


async def test_redis_down_under_fail_open_lets_the_output_through(
    scripted_upstream: str,
    start_proxy: ProxyFactory,
    client_for: Clients,
    redis_server: RedisServer,
) -> None:
    ledger = {"backend": "redis", "url": redis_server.url, "timeout_s": 1, "fail_open": True}
    client = client_for(await start_proxy(scripted_upstream, ledger=ledger))
    response_id, call = await tool_turn(client, stream=False)

    redis_server.stop()
    answer = await create(
        client,
        stream=False,
        input=[sales_output(call["call_id"], "open")],
        previous_response_id=response_id,
    )

    assert answer.output_text == "tool said: open"


@dataclass
class CompressingRelay:
    """Relays to the scripted upstream and compresses every answer, as hosted APIs do for
    clients that accept it; `encodings` are the Content-Encodings it answered with."""

    upstream: str
    coding: ContentCoding
    url: str = ""
    encodings: list[str] = field(default_factory=list)
    accepted: list[str] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.accepted.append(request.headers.get("Accept-Encoding", ""))
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                self.upstream + request.path, data=await request.read(), headers=headers
            ) as answer,
        ):
            response = web.StreamResponse(status=answer.status)
            response.content_type = answer.content_type
            response.enable_compression(self.coding)
            await response.prepare(request)
            self.encodings.append(response.headers.get("Content-Encoding", ""))
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


@pytest.mark.parametrize("coding", [ContentCoding.gzip, ContentCoding.deflate])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_compressed_answer_is_recorded_for_the_follow_up(
    scripted_upstream: str,
    start_proxy: ProxyFactory,
    client_for: Clients,
    stream: bool,
    coding: ContentCoding,
) -> None:
    """The SDK accepts gzip, deflate and br, so a hosted upstream compresses its answers: the
    proxy relays them as they are and still records the response the follow-up names."""
    relay = CompressingRelay(scripted_upstream, coding)
    server = TestServer(web.Application(), host="127.0.0.1")
    server.app.router.add_post("/{tail:.*}", relay.handle)
    await server.start_server()
    try:
        client = client_for(await start_proxy(str(server.make_url("")).rstrip("/")))
        answer = await two_turns(client, stream=stream)
    finally:
        await server.close()
    assert answer.output_text == "tool said: apac: 42"
    assert relay.encodings == [coding.value, coding.value]
    assert all("gzip" in accepted for accepted in relay.accepted)
