"""Through the proxy: a stateless session's turn that extends the body passed before it goes
upstream as its exact bytes, judged past the held prefix; an edited history is judged in full."""

from __future__ import annotations

import json
import re
from typing import Any

import aiohttp
from yarl import URL

from tests.builders import SALES_TOOL, USER, sales_call, sales_output
from tests.fixture_types import ProxyFactory
from tests.server.checks import scrape
from tests.servers.recording import RecordingUpstream

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
