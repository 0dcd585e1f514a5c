"""Through the proxy: a stateless session's turn that extends the body passed before it goes
upstream as its exact bytes, judged past the held prefix; an edited history is judged in full."""

from __future__ import annotations

import json
import re
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from tests.builders import SALES_SCHEMA, SALES_TOOL, USER, sales_call, sales_output
from tests.fixture_types import Clients, ProxyFactory
from tests.server.checks import scrape
from tests.servers import strict_chat
from tests.servers.recording import Received, RecordingUpstream

INSTRUCTIONS = "You are a sales assistant. " * 50  # the prefix is past `prefixes.ANCHOR`


def turn(*items: Any) -> bytes:
    """A body as a client might write it (tabs, spaced separators), so that a re-serialising
    proxy would show."""
    body = {"model": "m", "instructions": INSTRUCTIONS, "input": [USER, *items]}
    body["tools"] = [SALES_TOOL]
    return json.dumps(body, indent="\t", separators=(" ,", " :  ")).encode()


FIRST = turn(sales_call("call_1"), sales_output("call_1"))
SECOND = turn(
    sales_call("call_1"), sales_output("call_1"), sales_call("call_2"), sales_output("call_2")
)
# The second turn with the first call's arguments edited to fail its schema.
EDITED = turn(
    sales_call("call_1", "mars"),
    sales_output("call_1"),
    sales_call("call_2"),
    sales_output("call_2"),
)


async def post(client: aiohttp.ClientSession, base: str, data: bytes) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    async with client.post(URL(base + "/v1/responses"), data=data, headers=headers) as resp:
        return resp.status, await resp.json()


def gauge(text: str, name: str) -> float:
    found = re.search(rf"(?m)^{name} (\S+)$", text)
    assert found is not None, name
    return float(found[1])


async def test_a_turn_that_extends_its_history_goes_upstream_as_sent(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory
) -> None:
    base = await start_proxy(recording_upstream.url)
    async with aiohttp.ClientSession() as client:
        assert (await post(client, base, FIRST))[0] == 200
        assert (await post(client, base, SECOND))[0] == 200
        metrics = await scrape(client, base)
    assert [got.body for got in recording_upstream.received] == [FIRST, SECOND]
    # One session, holding the second turn: it extended the first (a second turn read in full
    # would have been held as a session of its own).
    assert gauge(metrics, "replay_proxy_prefix_sessions") == 1
    ids = len("call_1fc_call_1call_2fc_call_2")
    assert gauge(metrics, "replay_proxy_prefix_bytes") == len(SECOND) + ids


async def test_an_edited_history_is_judged_in_full(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory
) -> None:
    base = await start_proxy(recording_upstream.url)
    async with aiohttp.ClientSession() as client:
        assert (await post(client, base, FIRST))[0] == 200
        status, answer = await post(client, base, EDITED)
        assert (await post(client, base, SECOND))[0] == 200
    assert status == 400
    assert answer["error"]["code"] == "replay_rejected"
    assert answer["error"]["findings"][0]["call_id"] == "call_1"
    assert [got.body for got in recording_upstream.received] == [FIRST, SECOND]


async def test_with_no_bytes_to_hold_every_turn_is_read_in_full(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory
) -> None:
    base = await start_proxy(recording_upstream.url, limits={"max_prefix_bytes": 0})
    async with aiohttp.ClientSession() as client:
        assert (await post(client, base, FIRST))[0] == 200
        assert (await post(client, base, SECOND))[0] == 200
        metrics = await scrape(client, base)
    assert [got.body for got in recording_upstream.received] == [FIRST, SECOND]
    assert gauge(metrics, "replay_proxy_prefix_sessions") == 0


# -- a Chat Completions session, every call replayed without a status -------------------------

CHAT_TOOLS: list[Any] = [
    {"type": "function", "function": {"name": SALES_TOOL["name"], "parameters": SALES_SCHEMA}}
]


async def _calls_one_tool(request: web.Request, received: Received) -> web.StreamResponse:
    """A completion that calls the sales tool once, under a call id of its turn."""
    turn = sum(1 for m in received.json()["messages"] if m["role"] == "tool") + 1
    call = {
        "id": f"call_{turn}",
        "type": "function",
        "function": {"name": SALES_TOOL["name"], "arguments": json.dumps({"region": "apac"})},
    }
    answer = strict_chat.completion("")
    answer["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [call]}
    answer["choices"][0]["finish_reason"] = "tool_calls"
    return web.json_response(answer)


async def test_a_chat_session_under_provenance_is_read_past_its_prefix(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, client_for: Clients
) -> None:
    # Every call the official SDK replays was relayed by the upstream through the proxy (its
    # ledger says so each turn); each turn after the first extends the body held before it.
    recording_upstream.handler = _calls_one_tool
    base = await start_proxy(recording_upstream.url, gate={"require_provenance": True})
    client = client_for(base)
    messages: list[Any] = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": "How did APAC do?"},
    ]
    for _ in range(4):
        answer = await client.chat.completions.create(
            model="m", messages=messages, tools=CHAT_TOOLS
        )
        message = answer.choices[0].message
        assert message.tool_calls is not None
        messages.append(message.model_dump(exclude_none=True))
        [call] = message.tool_calls
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "apac: 42 units"})
    async with aiohttp.ClientSession() as session:
        metrics = await scrape(session, base)
    sent = [got.json()["messages"] for got in recording_upstream.received]
    assert [len(m) for m in sent] == [2, 4, 6, 8]
    assert sent[-1] == messages[:-2]
    # One session held: each turn extended the one before (one read in full would have been
    # held as a session of its own), holding its body, its call ids and the arguments relayed.
    assert gauge(metrics, "replay_proxy_prefix_sessions") == 1
    last = recording_upstream.received[-1].body
    relayed = 3 * len(json.dumps({"region": "apac"}))
    assert (
        gauge(metrics, "replay_proxy_prefix_bytes")
        == len(last) + len("call_1call_2call_3") + relayed
    )
