"""Several providers behind one proxy: two scripted fastresponses agents on two ports and the
recording upstream, the real proxy, the official SDK. Routed by path, model and header; a
conversation moved to another provider with `materialize`, or refused without it."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.responses import Response, ResponseCompletedEvent

from proxy.config import Config
from proxy.running.config_file import parse_config
from proxy.server.in_force import InForceHolder
from tests.builders import SALES_SCHEMA, SALES_TOOL, audit_records, sales_output
from tests.fixture_types import Clients
from tests.server.checks import metric, scrape
from tests.servers.recording import Received, RecordingUpstream
from tests.servers.scripted_agent import serve_in_thread

MODEL = "scripted"
TOOLS: list[Any] = [SALES_TOOL]
ACME_ONLY_SALES = {**SALES_SCHEMA, "properties": {"region": {"enum": ["emea"]}}}


@pytest.fixture(scope="module")
def second_agent() -> Iterator[str]:
    """Another scripted agent on a port of its own: the second provider."""
    with serve_in_thread() as url:
        yield url.removesuffix("/v1")


def two_providers(
    openai_url: str, acme_url: str, *, materialize: bool = False, **acme_route: Any
) -> dict[str, Any]:
    """The issue's config shape: `openai` by default, `acme` by path, model and header."""
    header: dict[str, Any] = {"name": "x-replay-upstream", "value": "acme"}
    return {
        "upstreams": {
            "openai": {"url": openai_url, "vendor": "openai"},
            "acme": {"url": acme_url, "vendor": "acme"},
        },
        "routes": [
            {"path_prefix": "/acme", "upstream": "acme"},
            {"model": "acme/*", "upstream": "acme", "strip_model_prefix": True},
            {"header": header, "upstream": "acme", "materialize": materialize, **acme_route},
            {"upstream": "openai"},
        ],
        "ledger": {"whole_items": True},
    }


def sent(received: list[Received]) -> list[tuple[str, Any]]:
    return [(r.target, r.json().get("model")) for r in received]


async def test_routed_by_path_model_and_header_each_reaches_its_upstream(
    scripted_upstream: str,
    recording_upstream: RecordingUpstream,
    start_routed: Any,
    client_for: Clients,
    tmp_path: Path,
) -> None:
    base = await start_routed(**two_providers(scripted_upstream, recording_upstream.url))
    default, by_path = client_for(base), client_for(base + "/acme")

    answer = await default.responses.create(model=MODEL, input="hello")
    await by_path.responses.create(model=MODEL, input="hello")
    await default.responses.create(model="acme/big", input="hello")
    await default.responses.create(
        model=MODEL, input="hello", extra_headers={"x-replay-upstream": "acme"}
    )

    assert answer.output_text == "echo: hello"  # the scripted agent answered the default
    # The prefix is removed before forwarding, and so is the model's `acme/`.
    assert sent(recording_upstream.received) == [
        ("/v1/responses", MODEL),
        ("/v1/responses", "big"),
        ("/v1/responses", MODEL),
    ]
    async with aiohttp.ClientSession() as client:
        text = await scrape(client, base)
    total = "replay_proxy_requests_total"
    assert (
        metric(
            text,
            total,
            route="responses",
            outcome="forward",
            upstream="openai",
            dialect="responses",
        )
        == 1
    )
    assert (
        metric(
            text, total, route="responses", outcome="forward", upstream="acme", dialect="responses"
        )
        == 3
    )
    assert audit_records(tmp_path) == []


async def test_a_prefixed_path_is_gated_as_the_path_under_it(
    recording_upstream: RecordingUpstream, start_routed: Any, tmp_path: Path
) -> None:
    """`/acme/v1/responses` is the gated `/v1/responses` of acme: a failing replay is blocked
    there, audited under acme, and nothing goes upstream."""
    base = await start_routed(**two_providers(recording_upstream.url, recording_upstream.url))
    failing = {
        "model": MODEL,
        "tools": [SALES_TOOL],
        "input": [sales_output("call_never_made")],
    }
    async with (
        aiohttp.ClientSession() as client,
        client.post(base + "/acme/v1/responses", json=failing) as resp,
    ):
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["code"] == "replay_rejected"
    assert recording_upstream.received == []
    [record] = audit_records(tmp_path)
    assert (record["upstream"], record["path"]) == ("acme", "/v1/responses")


async def test_an_unrouted_model_is_a_400_that_goes_nowhere(
    recording_upstream: RecordingUpstream, start_routed: Any, client_for: Clients
) -> None:
    only_acme = {
        "upstreams": {"acme": {"url": recording_upstream.url, "vendor": "acme"}},
        "routes": [{"model": "acme/*", "upstream": "acme"}],
    }
    client = client_for(await start_routed(**only_acme))

    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(model="gpt-5", input="hello")

    assert raised.value.code == "no_route"
    assert recording_upstream.received == []


async def tool_turn(
    client: openai.AsyncOpenAI, *, stream: bool = False
) -> tuple[str, dict[str, Any]]:
    """Turn 1 on the default upstream: the model calls the sales tool."""
    request: dict[str, Any] = {"model": MODEL, "tools": TOOLS, "input": "what are the sales?"}
    if stream:
        events = await client.responses.create(**request, stream=True)
        [response] = [e.response async for e in events if isinstance(e, ResponseCompletedEvent)]
    else:
        response = await client.responses.create(**request)
    [call] = [item for item in response.output if item.type == "function_call"]
    return response.id, call.model_dump(exclude_none=True)


async def answer_on_acme(
    client: openai.AsyncOpenAI, response_id: str, call: dict[str, Any]
) -> Response:
    """The turn that answers `call` with the sales tool's output, continuing `response_id` on
    the `acme` upstream (by its routing header)."""
    return await client.responses.create(
        model=MODEL,
        tools=TOOLS,
        input=[sales_output(call["call_id"], "apac: 42")],  # type: ignore[list-item]
        previous_response_id=response_id,
        extra_headers={"x-replay-upstream": "acme"},
    )


async def test_a_refused_previous_response_reaches_no_upstream(
    scripted_upstream: str,
    recording_upstream: RecordingUpstream,
    start_routed: Any,
    client_for: Clients,
) -> None:
    """`foreign_previous_response` is answered by the proxy: the upstream its route names
    (the recording one, as `acme`) receives nothing."""
    config = two_providers(scripted_upstream, recording_upstream.url)
    client = client_for(await start_routed(**config))
    response_id, call = await tool_turn(client)

    with pytest.raises(openai.BadRequestError) as raised:
        await answer_on_acme(client, response_id, call)

    assert raised.value.code == "foreign_previous_response"
    assert recording_upstream.received == []


async def test_a_previous_response_of_another_upstream_is_refused_without_materialize(
    scripted_upstream: str,
    second_agent: str,
    start_routed: Any,
    client_for: Clients,
) -> None:
    client = client_for(await start_routed(**two_providers(scripted_upstream, second_agent)))
    response_id, call = await tool_turn(client)

    with pytest.raises(openai.BadRequestError) as raised:
        await answer_on_acme(client, response_id, call)

    assert raised.value.code == "foreign_previous_response"
    assert raised.value.param == "previous_response_id"
    assert "upstream 'openai'" in raised.value.message
    assert "'acme'" in raised.value.message
    # The same turn on the upstream that made the response goes on as before.
    answer = await client.responses.create(
        model=MODEL,
        tools=TOOLS,
        input=[sales_output(call["call_id"], "apac: 42")],  # type: ignore[list-item]
        previous_response_id=response_id,
    )
    assert answer.output_text == "tool said: apac: 42"


async def test_a_reference_resolves_only_on_the_upstream_that_made_its_item(
    scripted_upstream: str,
    recording_upstream: RecordingUpstream,
    start_routed: Any,
    client_for: Clients,
) -> None:
    """An `item_reference` to a call `openai` made is `unknown_reference` on a route to
    `acme` (which never had that item), and resolves on a route to `openai`."""
    client = client_for(
        await start_routed(**two_providers(scripted_upstream, recording_upstream.url))
    )
    _, call = await tool_turn(client)
    replay: list[Any] = [
        {"type": "item_reference", "id": call["id"]},
        sales_output(call["call_id"], "apac: 42"),
    ]

    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(
            model=MODEL, tools=TOOLS, input=replay, extra_headers={"x-replay-upstream": "acme"}
        )
    answer = await client.responses.create(model=MODEL, tools=TOOLS, input=replay)

    assert isinstance(raised.value.body, dict)
    assert [(f["index"], f["reason"]) for f in raised.value.body["findings"]] == [
        (0, "unknown_reference"),
        (1, "orphan"),  # its call was behind the reference
    ]
    assert recording_upstream.received == []
    assert answer.output_text == "tool said: apac: 42"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_conversation_moves_to_another_provider_with_materialize(
    scripted_upstream: str,
    second_agent: str,
    start_routed: Any,
    client_for: Clients,
    stream: bool,
) -> None:
    """Started on one agent (its answer JSON or streamed), continued on the other by changing
    one header: the second agent gets the whole history inline and answers the tool's output."""
    config = two_providers(scripted_upstream, second_agent, materialize=True)
    client = client_for(await start_routed(**config))
    response_id, call = await tool_turn(client, stream=stream)

    answer = await answer_on_acme(client, response_id, call)

    assert answer.output_text == "tool said: apac: 42"
    # The new response is acme's own: the next turn continues there without inlining.
    follow = await client.responses.create(
        model=MODEL,
        input="thanks",
        previous_response_id=answer.id,
        extra_headers={"x-replay-upstream": "acme"},
    )
    assert follow.output_text == "echo: thanks"


async def test_materialize_sends_the_recorded_history_inline(
    scripted_upstream: str,
    recording_upstream: RecordingUpstream,
    start_routed: Any,
    client_for: Clients,
) -> None:
    config = two_providers(scripted_upstream, recording_upstream.url, materialize=True)
    client = client_for(await start_routed(**config))
    response_id, call = await tool_turn(client)

    await answer_on_acme(client, response_id, call)

    [received] = recording_upstream.received
    body = received.json()
    assert "previous_response_id" not in body
    assert [(item["type"], item.get("call_id")) for item in body["input"]] == [
        ("message", None),  # turn 1's input, a string as the user message it is
        ("function_call", call["call_id"]),  # turn 1's output, whole
        ("function_call_output", call["call_id"]),  # this turn's input
    ]
    assert body["input"][0] == {
        "type": "message",
        "role": "user",
        "content": "what are the sales?",
    }
    assert body["input"][1] == call | {"type": "function_call"}


async def test_the_inlined_history_is_gated_under_the_target_route(
    scripted_upstream: str,
    recording_upstream: RecordingUpstream,
    start_routed: Any,
    client_for: Clients,
    tmp_path: Path,
) -> None:
    """acme pins a stricter schema: the call made on openai, inlined, fails it there."""
    config = two_providers(
        scripted_upstream,
        recording_upstream.url,
        materialize=True,
        gate={"tools": {"get_latest_sales_report": ACME_ONLY_SALES}},
    )
    client = client_for(await start_routed(**config))
    response_id, call = await tool_turn(client)

    with pytest.raises(openai.BadRequestError) as raised:
        await answer_on_acme(client, response_id, call)

    assert raised.value.code == "replay_rejected"
    assert isinstance(raised.value.body, dict)
    [finding] = raised.value.body["findings"]
    assert (finding["reason"], finding["index"], finding["paired_index"]) == (
        "arguments_schema",
        2,
        1,
    )
    assert recording_upstream.received == []
    [record] = audit_records(tmp_path)
    # The record says what the client asked: the response it continued, on the upstream chosen.
    assert (record["upstream"], record["previous_response_id"]) == ("acme", response_id)


async def test_materialize_needs_the_whole_chain(
    recording_upstream: RecordingUpstream,
    start_routed: Any,
    client_for: Clients,
) -> None:
    """A response recorded without its whole items (here: answered by an upstream whose first
    turn was not recorded whole) cannot be inlined: refused, nothing sent."""

    async def answer(request: Any, received: Received) -> Any:
        from aiohttp import web

        body = received.json()
        previous = body.get("previous_response_id")
        return web.json_response(
            {
                "object": "response",
                "id": f"resp_{len(recording_upstream.received)}",
                "previous_response_id": previous,
                "output": [],
            }
        )

    recording_upstream.handler = answer
    config = two_providers(recording_upstream.url, recording_upstream.url, materialize=True)
    # openai's responses chain back to one the proxy never saw.
    client = client_for(await start_routed(**config))
    await client.responses.create(model=MODEL, input="hi")
    second = await client.responses.create(model=MODEL, input="more", previous_response_id="x")

    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(
            model=MODEL,
            input="again",
            previous_response_id=second.id,
            extra_headers={"x-replay-upstream": "acme"},
        )

    assert raised.value.code == "foreign_previous_response"
    assert "not recorded whole" in raised.value.message
    assert len(recording_upstream.received) == 2


SEARCH_CALL = {"type": "acme:search_call", "id": "sc_1", "status": "completed", "query": "q"}


@pytest.mark.parametrize("action", ["block", "strip"])
async def test_a_vendor_item_goes_home_untouched_and_never_abroad(
    recording_upstream: RecordingUpstream,
    start_routed: Any,
    action: str,
) -> None:
    config = two_providers(recording_upstream.url, recording_upstream.url)
    base = await start_routed(**config, gate={"action": action})
    body = {"model": MODEL, "input": [{"role": "user", "content": "hi"}, SEARCH_CALL]}
    async with aiohttp.ClientSession() as client:
        async with client.post(base + "/acme/v1/responses", json=body) as home:
            assert home.status == 200
        async with client.post(base + "/v1/responses", json=body) as abroad:
            assert abroad.status == (400 if action == "block" else 200)
            answer = await abroad.json()
    if action == "block":
        [finding] = answer["error"]["findings"]
        assert (finding["index"], finding["reason"], finding["type"]) == (
            1,
            "foreign_item",
            "acme:search_call",
        )
    at_home = recording_upstream.received[0].json()
    assert at_home["input"][1] == SEARCH_CALL
    if action == "strip":
        assert [i.get("type") for i in recording_upstream.received[1].json()["input"]] == [None]
    else:
        assert len(recording_upstream.received) == 1


async def test_a_websocket_is_routed_at_its_upgrade_and_its_frames_stay_there(
    recording_upstream: RecordingUpstream, scripted_upstream: str, start_routed: Any
) -> None:
    base = await start_routed(**two_providers(scripted_upstream, recording_upstream.url))
    ws_url = base.replace("http://", "ws://") + "/acme/v1/responses"
    frame = {"type": "response.create", "model": MODEL, "input": "hello"}
    async with aiohttp.ClientSession() as client, client.ws_connect(ws_url) as ws:
        await ws.send_str(json.dumps(frame))
        completed = json.loads((await ws.receive()).data)
        await ws.send_str(json.dumps(frame | {"model": "acme/big"}))
        second = json.loads((await ws.receive()).data)
    assert (completed["type"], second["type"]) == ("response.completed", "response.completed")
    # The path route comes first and matches every frame of this WebSocket: `acme/big` goes to
    # acme as it is (only the model route strips its prefix).
    assert [json.loads(f)["model"] for f in recording_upstream.frames] == [MODEL, "acme/big"]


async def test_a_websocket_frame_whose_model_routes_elsewhere_is_refused(
    recording_upstream: RecordingUpstream, start_routed: Any
) -> None:
    config = {
        "upstreams": {
            "openai": {"url": recording_upstream.url, "vendor": "openai"},
            "acme": {"url": "http://127.0.0.1:9", "vendor": "acme"},
        },
        "routes": [{"model": "acme/*", "upstream": "acme"}, {"upstream": "openai"}],
    }
    base = await start_routed(**config)
    ws_url = base.replace("http://", "ws://") + "/v1/responses"
    frame = {"type": "response.create", "model": "acme/big", "input": "hello"}
    async with aiohttp.ClientSession() as client, client.ws_connect(ws_url) as ws:
        await ws.send_str(json.dumps(frame))
        refused = json.loads((await ws.receive()).data)
    assert (refused["type"], refused["status"]) == ("error", 400)
    assert refused["error"]["code"] == "wrong_upstream"
    assert recording_upstream.frames == []


def _upstreams(b_url: str) -> Config:
    return parse_config(
        {
            "upstreams": {"a": {"url": "http://127.0.0.1:9"}, "b": {"url": b_url}},
            "routes": [{"upstream": "a"}],
        }
    )


async def test_a_reload_keeps_the_pools_of_unchanged_upstreams_and_retires_the_rest() -> None:
    live = InForceHolder()
    await live.start(_upstreams("http://127.0.0.1:10"))
    a, b = live.current.upstreams["a"], live.current.upstreams["b"]

    await live.swap(_upstreams("http://127.0.0.1:11"))

    assert live.current.upstreams["a"] is a
    assert live.current.upstreams["b"] is not b
    assert (a.closed, b.closed) == (False, True)
    await live.close()
    assert all(upstream.closed for upstream in live.current.upstreams.values())


async def test_serve_with_two_upstreams_names_them_and_routes(
    recording_upstream: RecordingUpstream, tmp_path: Path
) -> None:
    """`replay-proxy serve --config` with the two-provider form: the start names each upstream,
    and a request under `/acme` reaches acme."""
    config = two_providers("http://127.0.0.1:9", recording_upstream.url)
    path = tmp_path / "proxy.yaml"
    path.write_text(json.dumps(config | {"audit": {"path": str(tmp_path / "a.jsonl")}}), "utf-8")
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "proxy", "serve", "--port", "0", "--config", str(path)),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    try:
        line = ""
        while "listening on" not in line:
            line = (await asyncio.wait_for(process.stderr.readline(), timeout=30)).decode()
            assert line, "the proxy exited before listening"
        found = re.search(r"listening on (http://\S+), (.*)$", line.strip())
        assert found is not None
        assert (
            found.group(2) == f"upstreams openai=http://127.0.0.1:9, acme={recording_upstream.url}"
        )
        async with (
            aiohttp.ClientSession() as client,
            client.post(found.group(1) + "/acme/v1/responses", json={"input": "hi"}) as resp,
        ):
            assert resp.status == 200
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=30) == 0
    assert [r.target for r in recording_upstream.received] == ["/v1/responses"]
