"""The Redis ledger holds any id and any value: ids with the bytes that split or end encodings,
through the real proxy and a real redis-server; and a stored value corrupted by hand is read as
not recorded (logged), never a 5xx."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from proxy.state.encoding import decode_response, encode_response
from proxy.state.recording import RecordedResponse
from proxy.state.stores import RESPONSE, RedisStore, key_tenant
from tests.builders import SALES_TOOL, sales_call, sales_output
from tests.fixture_types import ProxyFactory
from tests.servers.recording import Received, RecordingUpstream
from tests.servers.redis_server import RedisServer

WEIRD = [
    pytest.param("resp_a\nb", id="newline"),
    pytest.param("resp_a\r\nb", id="crlf"),
    pytest.param("resp_a\rb", id="cr"),
    pytest.param("resp_a\x00b", id="nul"),
    pytest.param("resp_a:b:resp:c", id="colons"),
    pytest.param("resp_*", id="star"),
    pytest.param("12:resp_x", id="looks-length-prefixed"),
    pytest.param("resp_" + "\n:*\x00" * 256, id="1KiB"),
]


class EchoingUpstream:
    """Answers each request with a response whose id is the next of `ids`, carrying the
    request's own `previous_response_id` back (as Open Responses servers do), and one call."""

    def __init__(self, recording: RecordingUpstream) -> None:
        self.ids: list[str] = []
        self.recording = recording
        recording.handler = self.answer

    async def answer(self, request: web.Request, received: Received) -> web.StreamResponse:
        turn = len(self.recording.received)
        response_id = self.ids[turn - 1]
        response = {
            "id": response_id,
            "object": "response",
            "previous_response_id": received.json().get("previous_response_id"),
            "output": [sales_call(f"c{turn}", id=f"fc_{response_id}")],
        }
        return web.json_response(response)


@pytest.fixture
def echoing(recording_upstream: RecordingUpstream) -> EchoingUpstream:
    return EchoingUpstream(recording_upstream)


async def post(base: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(base + "/v1/responses", json=body) as answer,
    ):
        return answer.status, await answer.json()


def follow_up(response_id: str, item_id: str) -> dict[str, Any]:
    return {
        "model": "m",
        "tools": [SALES_TOOL],
        "previous_response_id": response_id,
        "input": [{"type": "item_reference", "id": item_id}, sales_output("c1", "apac: 42")],
    }


@pytest.mark.parametrize("weird", WEIRD)
async def test_an_id_of_any_bytes_is_recorded_and_followed_up(
    echoing: EchoingUpstream, start_proxy: ProxyFactory, redis_server: RedisServer, weird: str
) -> None:
    """The first turn names a previous response by a weird id, which the upstream echoes
    back on a response whose own id is weird too: its follow-up pairs through the chain and
    by reference."""
    echoing.ids = [weird + "_made", "resp_2"]
    base = await start_proxy(
        echoing.recording.url, ledger={"backend": "redis", "url": redis_server.url}
    )

    first = {"model": "m", "tools": [SALES_TOOL], "input": "hi", "previous_response_id": weird}
    assert (await post(base, first))[0] == 200
    status, answer = await post(base, follow_up(weird + "_made", f"fc_{weird}_made"))

    assert (status, answer["id"]) == (200, "resp_2")
    assert echoing.recording.received[1].json() == follow_up(weird + "_made", f"fc_{weird}_made")


async def corrupt_response(url: str, value: bytes | list[bytes]) -> None:
    """Overwrite every recorded response's value in Redis (a list: the key made a list)."""
    client = aioredis.Redis.from_url(url)
    try:
        keys = await client.keys(f"replay-proxy:*:{RESPONSE}:*".encode())
        assert keys
        for key in keys:
            await client.delete(key)
            if isinstance(value, list):
                await client.rpush(key, *value)
            else:
                await client.set(key, value)
    finally:
        await client.aclose()


CORRUPT = [
    pytest.param(b"garbage", id="no-prefix"),
    pytest.param(b"", id="empty"),
    pytest.param(b"99:resp_0", id="shorter-than-its-prefix"),
    pytest.param(b"0:{not json", id="not-json"),
    pytest.param(b'0:["a list"]', id="not-an-object"),
    pytest.param(b'0:{"prev": null, "items": [42]}', id="items-not-objects"),
    pytest.param(b'0:{"prev": null, "items": [], "inputs": 3}', id="inputs-beyond-items"),
    pytest.param(b'6:resp_0{"prev": "resp_9", "items": []}', id="prefix-disagrees"),
    pytest.param(b"0:" + b"[" * 100_000, id="nested-too-deep"),
    pytest.param([b"a", b"list"], id="wrong-type"),
]


@pytest.mark.parametrize("value", CORRUPT)
async def test_a_corrupted_response_is_not_recorded_never_a_500(
    echoing: EchoingUpstream,
    start_proxy: ProxyFactory,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
    value: bytes | list[bytes],
) -> None:
    echoing.ids = ["resp_1", "resp_2"]
    base = await start_proxy(
        echoing.recording.url, ledger={"backend": "redis", "url": redis_server.url}
    )
    assert (await post(base, {"model": "m", "tools": [SALES_TOOL], "input": "hi"}))[0] == 200
    await corrupt_response(redis_server.url, value)

    body = {**follow_up("resp_1", "fc_resp_1"), "input": [sales_output("c1")]}
    with caplog.at_level(logging.WARNING, logger="replay_proxy"):
        status, answer = await post(base, body)

    assert status == 400
    assert [f["reason"] for f in answer["error"]["findings"]] == ["orphan"]
    assert "'resp_1' cannot be read" in caplog.text
    assert len(echoing.recording.received) == 1


async def test_a_corrupted_item_call_or_tools_value_is_not_recorded(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisStore(redis_server.url, ttl_s=60, timeout_s=5)
    call = sales_call("c")
    await store.put("t", RecordedResponse("resp_1", None, (call,), tools="k"), [("sales", {})])
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        await client.set(b"replay-proxy:t:item@:fc_c", b"{not json")
        await client.rpush(b"replay-proxy:t:call:c", b"[1]")
        await client.set(b"replay-proxy:t:tools:k", b'{"not": "pairs"}')
        with caplog.at_level(logging.WARNING, logger="replay_proxy"):
            by_id, calls = await store.lookup("t", ["fc_c"], ["c"])
            tools = await store.tools("t", ["k"])
    finally:
        await client.aclose()
        await store.close()

    assert (by_id, calls, tools) == ({}, [call], {})
    assert caplog.text.count("cannot be read") == 3


@pytest.mark.parametrize("previous", [None, "", "p", "\n", "3:abc", "\ud800" * 3])
def test_a_response_value_decodes_as_it_was_encoded(previous: str | None) -> None:
    recording = RecordedResponse("r", previous, (sales_call("c"),), 0, "k", "acme")
    assert decode_response("r", encode_response(recording)) == recording


# Tenants as client names may spell them, and what their keys name them.
TENANTS = [
    pytest.param("alice", "alice", id="plain"),
    pytest.param("t_0123456789abcdef", "t_0123456789abcdef", id="fingerprint"),
    pytest.param("-", "-", id="no-credential"),
    pytest.param("{team}", "{team}", id="braces"),
    pytest.param("a:response:b", "a%3Aresponse%3Ab", id="colons"),
    pytest.param("a%3Ab", "a%253Ab", id="looks-escaped"),
    pytest.param("100%", "100%25", id="percent"),
    pytest.param(":", "%3A", id="a-colon"),
]


@pytest.mark.parametrize(("tenant", "named"), TENANTS)
def test_a_tenant_is_named_in_its_keys_without_a_colon(tenant: str, named: str) -> None:
    assert key_tenant(tenant) == named


def test_no_two_tenants_share_a_key_name() -> None:
    tenants = [str(p.values[0]) for p in TENANTS] + ["a", "a%3Aresponse%3Ab", "a:", "a%3A", "%"]
    assert len({key_tenant(t) for t in tenants}) == len(tenants)
    assert not any(":" in key_tenant(t) for t in tenants)


A_KEY, B_KEY = "rp-a-0123456789", "rp-ab-9876543210"
COLLIDING = [
    {"name": "a", "key_sha256": hashlib.sha256(A_KEY.encode()).hexdigest()},
    {"name": "a:response:b", "key_sha256": hashlib.sha256(B_KEY.encode()).hexdigest()},
]


async def test_client_names_that_spell_each_others_keys_keep_their_records_apart(
    echoing: EchoingUpstream, start_proxy: ProxyFactory, redis_server: RedisServer
) -> None:
    """Under the unescaped keys, `a` following up `b:response:resp_1` read the response
    `a:response:b` recorded as `resp_1`, and the other way round."""
    # Recorded by `a:response:b`, by `a`, then the follow-ups each makes of its own.
    echoing.ids = ["resp_1", "b:response:resp_2", "resp_3", "resp_4"]
    base = await start_proxy(
        echoing.recording.url,
        ledger={"backend": "redis", "url": redis_server.url},
        clients=COLLIDING,
    )
    a = {"Authorization": f"Bearer {A_KEY}"}
    ab = {"Authorization": f"Bearer {B_KEY}"}

    def replay(previous: str, call_id: str) -> dict[str, Any]:
        return {
            "model": "m",
            "tools": [SALES_TOOL],
            "previous_response_id": previous,
            "input": [sales_output(call_id)],
        }

    async def status_of(headers: dict[str, str], body: dict[str, Any]) -> tuple[int, list[str]]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(base + "/v1/responses", json=body, headers=headers) as answer,
        ):
            found = (await answer.json()).get("error", {}).get("findings", [])
            return answer.status, [f["reason"] for f in found]

    hi = {"model": "m", "tools": [SALES_TOOL], "input": "hi"}
    assert await status_of(ab, hi) == (200, [])  # resp_1, calling c1
    assert await status_of(a, hi) == (200, [])  # b:response:resp_2, calling c2

    assert await status_of(a, replay("b:response:resp_1", "c1")) == (400, ["orphan"])
    assert await status_of(ab, replay("resp_2", "c2")) == (400, ["orphan"])
    assert len(echoing.recording.received) == 2
    assert await status_of(ab, replay("resp_1", "c1")) == (200, [])
    assert await status_of(a, replay("b:response:resp_2", "c2")) == (200, [])
