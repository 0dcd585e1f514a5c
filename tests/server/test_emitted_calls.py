"""Door 2 through the proxy: the calls an upstream emits are checked once relayed, never changed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from openai.types.responses import (
    FunctionToolParam,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
)

from tests.builders import (
    APAC,
    GLOBAL,
    HANG_GUARD_S,
    PICK_TOOL,
    POLL_S,
    SALES_SCHEMA,
    SALES_TOOL,
    USER,
    at,
    audit_records,
    pick_call,
)
from tests.fixture_types import Clients, ProxyFactory
from tests.server.checks import metric, scrape

SALES = "get_latest_sales_report"
EMITTED = "replay_proxy_emitted_calls_total"
ENUM_FAIL = [{"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}]
MESSAGE = {
    "type": "message",
    "id": "msg_1",
    "status": "completed",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "Looking it up.", "annotations": []}],
}


def emitted_call(call_id: str, arguments: str, name: str = SALES) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def response_with(*calls: dict[str, Any], response_id: str = "resp_door2") -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "status": "completed",
        "model": "m-upstream",
        "previous_response_id": "resp_before",
        "output": [MESSAGE, *calls],
    }


def sse_of(response: dict[str, Any], *, output_in_completed: bool = True) -> bytes:
    """The SSE stream of a response: each item's `output_item.done`, then `response.completed`
    (whose `output` a server may leave empty: the items were in the events)."""

    def event(kind: str, **fields: Any) -> bytes:
        data = json.dumps({"type": kind, **fields}, separators=(",", ":"))
        return f"event: {kind}\ndata: {data}\n\n".encode()

    started = {**response, "status": "in_progress", "output": []}
    completed = response if output_in_completed else {**response, "output": []}
    return b"".join(
        [
            event("response.created", sequence_number=0, response=started),
            *(
                event("response.output_item.done", sequence_number=1 + i, output_index=i, item=it)
                for i, it in enumerate(response["output"])
            ),
            event("response.completed", sequence_number=9, response=completed),
            b"data: [DONE]\n\n",
        ]
    )


@dataclass
class CannedUpstream:
    """An upstream that answers every turn with the same bytes: a JSON response, its SSE
    stream, or (on a WebSocket) its events as frames; and records the bodies it was sent."""

    response: dict[str, Any]
    url: str = ""
    received: list[Any] = field(default_factory=list)
    output_in_completed: bool = True
    # On a WebSocket, the frames held until this many have arrived, then each answered in
    # turn: the turns are pipelined whatever the timing.
    held_frames: int = 1

    @property
    def json_answer(self) -> bytes:
        return json.dumps(self.response).encode()

    @property
    def sse_answer(self) -> bytes:
        return sse_of(self.response, output_in_completed=self.output_in_completed)

    @property
    def frames(self) -> list[str]:
        done = [
            {"type": "response.output_item.done", "output_index": i, "item": item}
            for i, item in enumerate(self.response["output"])
        ]
        return [
            json.dumps(e)
            for e in [*done, {"type": "response.completed", "response": self.response}]
        ]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            async for message in ws:
                self.received.append(json.loads(message.data))
                if len(self.received) % self.held_frames:
                    continue
                for _ in range(self.held_frames):
                    for frame in self.frames:
                        await ws.send_str(frame)
            return ws
        body = await request.json()
        self.received.append(body)
        if body.get("stream"):
            answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await answer.prepare(request)
            await answer.write(self.sse_answer)
            await answer.write_eof()
            return answer
        return web.Response(body=self.json_answer, content_type="application/json")


@pytest.fixture
async def canned() -> AsyncIterator[CannedUpstream]:
    upstream = CannedUpstream(response_with(emitted_call("c_bad", GLOBAL)))
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", upstream.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    upstream.url = str(server.make_url("")).rstrip("/")
    yield upstream
    await server.close()


async def counted(
    client: aiohttp.ClientSession,
    base: str,
    calls: int,
    dialect: str = "responses",
    **labels: str,
) -> float | None:
    """The emitted-call count with these labels (of a `dialect` body's answers), once it
    reaches `calls` or the hang guard is up: the check runs after the answer went out, so the
    client may have it first. The count is made after the record is written, so a record is
    there once its count is."""
    labels["dialect"] = dialect
    found = None
    for _ in range(int(HANG_GUARD_S / POLL_S)):
        found = metric(await scrape(client, base), EMITTED, **labels)
        if found is not None and found >= calls:
            break
        await asyncio.sleep(POLL_S)
    return found


async def one_turn(
    client: aiohttp.ClientSession, base: str, transport: str, body: dict[str, Any]
) -> bytes | list[str]:
    """What the client got for one turn: the answer's bytes, or a WebSocket turn's frames."""
    if transport == "websocket":
        frames = []
        async with client.ws_connect(base + "/v1/responses") as ws:
            await ws.send_str(json.dumps({"type": "response.create", **body}))
            while True:
                frames.append(await ws.receive_str(timeout=HANG_GUARD_S))
                if json.loads(frames[-1])["type"] == "response.completed":
                    break
        return frames
    stream = {"stream": True} if transport == "sse" else {}
    async with client.post(at(base, "/v1/responses"), json=body | stream) as resp:
        assert resp.status == 200
        return await resp.read()


def sent_for(upstream: CannedUpstream, transport: str) -> bytes | list[str]:
    if transport == "websocket":
        return upstream.frames
    return upstream.sse_answer if transport == "sse" else upstream.json_answer


TRANSPORTS = [
    pytest.param("json", id="json"),
    pytest.param("sse", id="sse"),
    pytest.param("websocket", id="websocket"),
]
BODY = {"model": "m", "tools": [SALES_TOOL], "input": [USER]}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_bad_call_the_model_emits_is_relayed_unchanged_counted_and_audited(
    canned: CannedUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
    transport: str,
) -> None:
    canned.response = response_with(emitted_call("c_ok", APAC), emitted_call("c_bad", GLOBAL))
    base = await start_proxy(canned.url)

    got = await one_turn(client, base, transport, BODY)

    assert got == sent_for(canned, transport)
    [received] = canned.received
    assert received["input"] == BODY["input"]
    assert await counted(client, base, 1, tool=SALES, verdict="arguments_schema") == 1
    assert await counted(client, base, 1, tool=SALES, verdict="ok") == 1
    [record] = audit_records(tmp_path)
    assert record["event"] == "emitted_call_rejected"
    assert record["action"] == "log"
    assert record["transport"] == ("websocket" if transport == "websocket" else "http")
    assert record["path"] == "/v1/responses"
    assert record["response_id"] == "resp_door2"
    assert record["model"] == "m-upstream"
    assert record["previous_response_id"] == "resp_before"
    # The hash of the request body (a WebSocket turn's: of the frame that asked for it), as a
    # rejected replay's record has it.
    assert record["body_sha256"] is not None
    assert record["findings"] == [
        {
            "index": 2,
            "call_id": "c_bad",
            "paired_index": None,
            "name": SALES,
            "reason": "arguments_schema",
            "pass": [],
            "fail": ENUM_FAIL,
            "message": "region failed schema: expected one of apac, emea, amer",
            "output_index": 2,
        }
    ]


async def test_door_2s_record_of_a_websocket_turn_names_the_frame_that_asked_for_it(
    canned: CannedUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    """A frame with a finding it is forwarded with (an orphan output, logged) whose turn's
    response holds a failing call: both records name the frame, by its own id (not the
    connection's) and by the hash of its bytes, as both records of one HTTP request name it."""
    canned.response = response_with(emitted_call("c_bad", GLOBAL))
    base = await start_proxy(canned.url, gate={"action": "log"})
    orphan = {"type": "function_call_output", "call_id": "c_none", "output": "{}"}
    frame = json.dumps({"type": "response.create", **BODY, "input": [USER, orphan]})
    async with client.ws_connect(base + "/v1/responses") as ws:
        await ws.send_str(frame)
        while json.loads(await ws.receive_str(timeout=HANG_GUARD_S))["type"] != (
            "response.completed"
        ):
            pass

    assert await counted(client, base, 1, tool=SALES, verdict="arguments_schema") == 1
    replayed, emitted = audit_records(tmp_path)
    assert (replayed["event"], emitted["event"]) == ("replay_rejected", "emitted_call_rejected")
    assert emitted["request_id"] == replayed["request_id"]  # the frame's: each frame has one
    assert emitted["body_sha256"] == replayed["body_sha256"] == sha256(frame.encode()).hexdigest()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_calls_that_pass_are_counted_and_leave_no_record(
    canned: CannedUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
    transport: str,
) -> None:
    canned.response = response_with(
        emitted_call("c1", APAC), emitted_call("c2", '{"region":"emea"}')
    )
    base = await start_proxy(canned.url)

    got = await one_turn(client, base, transport, BODY)

    assert got == sent_for(canned, transport)
    assert await counted(client, base, 2, tool=SALES, verdict="ok") == 2
    assert audit_records(tmp_path) == []


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_record_of_emitted_calls_lists_what_the_configs_limits_allow(
    canned: CannedUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
    transport: str,
) -> None:
    # Four calls that fail their schema 50 ways each: the record lists 2 of them, 3 ways each.
    calls = [{**pick_call(f"c{n}", elements=50), "id": f"fc_{n}"} for n in range(4)]
    canned.response = response_with(*calls)
    base = await start_proxy(canned.url, limits={"max_findings": 2, "max_violations": 3})

    got = await one_turn(
        client, base, transport, {"model": "m", "tools": [PICK_TOOL], "input": [USER]}
    )

    assert got == sent_for(canned, transport)
    assert await counted(client, base, 4, tool="pick", verdict="arguments_schema") == 4
    [record] = audit_records(tmp_path)
    assert record["event"] == "emitted_call_rejected"
    assert record["findings_omitted"] == 2
    assert [(f["call_id"], len(f["fail"]), f["fail_omitted"]) for f in record["findings"]] == [
        ("c0", 3, 47),
        ("c1", 3, 47),
    ]


@pytest.mark.parametrize(
    ("call", "tools", "pinned", "tool_label", "verdict"),
    [
        pytest.param(
            emitted_call("c1", GLOBAL),
            [],
            {SALES: SALES_SCHEMA},
            SALES,
            "arguments_schema",
            id="pinned-schema-no-tools",
        ),
        pytest.param(
            emitted_call("c1", GLOBAL),
            [{"type": "function", "name": SALES, "parameters": {"type": "object"}}],
            {SALES: SALES_SCHEMA},
            SALES,
            "arguments_schema",
            id="pinned-wins-over-the-request",
        ),
        pytest.param(
            emitted_call("c1", '{"region":"apac","region":"emea"}'),
            [SALES_TOOL],
            {},
            SALES,
            "arguments_parse",
            id="duplicate-key",
        ),
        pytest.param(
            emitted_call("c1", APAC, name="send_refund"),
            [SALES_TOOL],
            {},
            "(unknown)",
            "unknown_tool",
            id="tool-not-offered",
        ),
    ],
)
async def test_an_emitted_call_is_judged_by_the_schema_it_would_be_replayed_under(
    canned: CannedUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
    call: dict[str, Any],
    tools: list[Any],
    pinned: dict[str, Any],
    tool_label: str,
    verdict: str,
) -> None:
    canned.response = response_with(call)
    base = await start_proxy(canned.url, tools=pinned)

    await one_turn(client, base, "sse", {"model": "m", "tools": tools, "input": [USER]})

    assert await counted(client, base, 1, tool=tool_label, verdict=verdict) == 1
    [record] = audit_records(tmp_path)
    [finding] = record["findings"]
    assert (finding["name"], finding["reason"], finding["output_index"]) == (
        call["name"],
        verdict,
        1,
    )


async def test_calls_only_in_the_events_are_checked_when_completed_leaves_output_empty(
    canned: CannedUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    canned.output_in_completed = False
    base = await start_proxy(canned.url)

    got = await one_turn(client, base, "sse", BODY)

    assert got == canned.sse_answer
    completed = json.loads(got.split(b"\n\n")[-3].partition(b"data: ")[2])
    assert completed["type"] == "response.completed"
    assert completed["response"]["output"] == []
    assert await counted(client, base, 1, tool=SALES, verdict="arguments_schema") == 1
    [record] = audit_records(tmp_path)
    assert [f["call_id"] for f in record["findings"]] == ["c_bad"]


async def test_the_scripted_model_calls_with_a_region_its_schema_refuses(
    scripted_upstream: str,
    start_proxy: ProxyFactory,
    client_for: Clients,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    base = await start_proxy(scripted_upstream)
    sdk = client_for(base)
    prompt = f"call {SALES} with {GLOBAL}"

    stream = await sdk.responses.create(
        model="scripted", input=prompt, tools=[cast(FunctionToolParam, SALES_TOOL)], stream=True
    )
    events = [event async for event in stream]

    [completed] = [e for e in events if isinstance(e, ResponseCompletedEvent)]
    [call] = [i for i in completed.response.output if isinstance(i, ResponseFunctionToolCall)]
    assert call.arguments == GLOBAL  # the client got the call as the model made it
    assert await counted(client, base, 1, tool=SALES, verdict="arguments_schema") == 1
    [record] = audit_records(tmp_path)
    assert record["event"] == "emitted_call_rejected"
    assert record["response_id"] == completed.response.id
    [finding] = record["findings"]
    assert (finding["call_id"], finding["fail"]) == (call.call_id, ENUM_FAIL)


async def test_pipelined_websocket_turns_each_have_their_calls_checked_under_their_own_route(
    canned: CannedUpstream,
    start_routed: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    """Two frames sent before either is answered, on routes with different policies (one pins
    the sales schema, one pins nothing): each turn's emitted call is judged under the policy of
    the route its own frame took, not the one the latest frame took."""
    canned.held_frames = 2
    base = await start_routed(
        upstreams={"default": {"url": canned.url}},
        routes=[
            {"model": "pinned", "upstream": "default", "gate": {"tools": {SALES: SALES_SCHEMA}}},
            {"upstream": "default"},
        ],
    )
    frames: list[str] = []
    async with client.ws_connect(base + "/v1/responses") as ws:
        for model in ("pinned", "plain"):
            await ws.send_str(
                json.dumps({"type": "response.create", "model": model, "input": "hi"})
            )
        while len([f for f in frames if json.loads(f)["type"] == "response.completed"]) < 2:
            frames.append(await ws.receive_str(timeout=HANG_GUARD_S))

    assert frames == canned.frames * 2
    assert [r["model"] for r in canned.received] == ["pinned", "plain"]
    # The pinned turn: its schema refuses the region; the plain turn: no tool was offered.
    assert await counted(client, base, 1, tool=SALES, verdict="arguments_schema") == 1
    assert await counted(client, base, 1, tool="(unknown)", verdict="unknown_tool") == 1
    records = audit_records(tmp_path)
    assert sorted(f["reason"] for r in records for f in r["findings"]) == [
        "arguments_schema",
        "unknown_tool",
    ]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_call_outside_the_requests_allowed_tools_is_counted_and_audited(
    canned: CannedUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
    transport: str,
) -> None:
    canned.response = response_with(emitted_call("c_out", APAC))
    base = await start_proxy(canned.url)
    choice = {
        "type": "allowed_tools",
        "mode": "auto",
        "tools": [{"type": "function", "name": "pick"}],
    }
    body = BODY | {"tools": [SALES_TOOL, PICK_TOOL], "tool_choice": choice}

    got = await one_turn(client, base, transport, body)

    assert got == sent_for(canned, transport)
    assert await counted(client, base, 1, tool=SALES, verdict="tool_not_allowed") == 1
    [record] = audit_records(tmp_path)
    [finding] = record["findings"]
    assert (finding["index"], finding["reason"]) == (1, "tool_not_allowed")


async def test_an_mcp_call_the_model_emits_is_judged_by_the_list_beside_it(
    canned: CannedUpstream,
    start_routed: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    listed = {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "wiki",
              "tools": [{"name": "ask", "input_schema": schema}]}  # fmt: skip
    called = {"type": "mcp_call", "id": "mcp_1", "server_label": "wiki", "name": "ask",
              "arguments": '{"q": 1}', "output": "42", "status": "completed"}  # fmt: skip
    canned.response = response_with(listed, called)
    openai_upstream = {"url": canned.url, "vendor": "openai"}
    base = await start_routed(upstreams={"up": openai_upstream}, routes=[{"upstream": "up"}])

    got = await one_turn(client, base, "json", BODY)

    assert got == sent_for(canned, "json")
    assert await counted(client, base, 1, tool="ask", verdict="arguments_schema") == 1
    [record] = audit_records(tmp_path)
    [finding] = record["findings"]
    assert (finding["index"], finding["reason"], finding["name"]) == (2, "arguments_schema", "ask")
    assert [v["path"] for v in finding["fail"]] == ["/q"]
