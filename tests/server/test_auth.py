"""Key custody and inbound auth: listed clients only, the provider key held by the proxy."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.builders import SALES_TOOL, audit_records, sales_call, sales_output
from tests.fixture_types import ProxyFactory
from tests.servers.recording import Received, RecordingUpstream

ALICE_KEY = "rp-alice-0123456789"
BOB_KEY = "rp-bob-9876543210"
PROVIDER_KEY = "sk-provider-secret"
CLIENTS = [
    {"name": "alice", "key_sha256": hashlib.sha256(ALICE_KEY.encode()).hexdigest()},
    {"name": "bob", "key_sha256": hashlib.sha256(BOB_KEY.encode()).hexdigest()},
]
FAILING = {
    "model": "m",
    "tools": [SALES_TOOL],
    "input": [sales_call("call_1", "global"), sales_output("call_1")],
}

Start = Callable[..., Any]


@pytest.fixture
def guarded(recording_upstream: RecordingUpstream, start_proxy: ProxyFactory) -> Callable[..., Any]:
    """A proxy whose config lists clients and holds the provider key (from a fake environment)."""

    async def start(**upstream: Any) -> str:
        return await start_proxy(
            recording_upstream.url,
            environ={"PROVIDER_KEY": PROVIDER_KEY},
            upstream=upstream,
            clients=CLIENTS,
        )

    return start


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="no-key"),
        pytest.param({"Authorization": "Bearer rp-mallory"}, id="unknown-key"),
        pytest.param({"Authorization": f"Bearer {PROVIDER_KEY}"}, id="the-provider-key"),
        pytest.param({"Authorization": "Bearer "}, id="empty-key"),
        pytest.param({"Authorization": ALICE_KEY[:-1]}, id="almost-alice"),
    ],
)
@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/responses"), ("GET", "/v1/models"), ("DELETE", "/v1/responses/resp_1")],
)
async def test_a_request_without_a_listed_key_gets_401_and_goes_nowhere(
    guarded: Start,
    recording_upstream: RecordingUpstream,
    headers: dict[str, str],
    method: str,
    path: str,
) -> None:
    base = await guarded()
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, base + path, json={"input": "hi"}, headers=headers) as response,
    ):
        assert response.status == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"
        error = (await response.json())["error"]
    assert error["code"] == "invalid_api_key"
    assert error["type"] == "authentication_error"
    assert recording_upstream.received == []


async def test_a_websocket_without_a_listed_key_is_refused(
    guarded: Start, recording_upstream: RecordingUpstream
) -> None:
    base = await guarded()
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as raised:
            await session.ws_connect(base + "/v1/responses")
    assert raised.value.status == 401
    assert recording_upstream.frames == []


@pytest.mark.parametrize(
    "credential",
    [
        pytest.param({"Authorization": f"Bearer {ALICE_KEY}"}, id="bearer"),
        pytest.param({"Authorization": f"bearer {ALICE_KEY}"}, id="bearer-lowercase"),
        pytest.param({"api-key": ALICE_KEY}, id="api-key-header"),
    ],
)
async def test_a_listed_client_goes_through_with_the_provider_key_instead_of_its_own(
    guarded: Start, recording_upstream: RecordingUpstream, credential: dict[str, str]
) -> None:
    base = await guarded(api_key_env="PROVIDER_KEY")
    async with (
        aiohttp.ClientSession() as session,
        session.get(base + "/v1/models", headers=credential) as response,
    ):
        assert response.status == 200
    [received] = recording_upstream.received
    assert received.headers.getall("Authorization") == [f"Bearer {PROVIDER_KEY}"]
    assert "api-key" not in received.headers
    assert ALICE_KEY not in json.dumps(dict(received.headers))


async def test_the_client_name_is_the_tenant_and_no_key_is_ever_logged(
    guarded: Start,
    recording_upstream: RecordingUpstream,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    base = await guarded(api_key_env="PROVIDER_KEY")
    async with aiohttp.ClientSession() as session:
        for key in (ALICE_KEY, BOB_KEY):
            headers = {"Authorization": f"Bearer {key}"}
            async with session.post(base + "/v1/responses", json=FAILING, headers=headers) as r:
                assert r.status == 400

    assert [record["tenant"] for record in audit_records(tmp_path)] == ["alice", "bob"]
    logged = (tmp_path / "audit.jsonl").read_text() + caplog.text
    for secret in (ALICE_KEY, BOB_KEY, PROVIDER_KEY):
        assert secret not in logged
    assert recording_upstream.received == []


async def test_a_follow_up_pairs_only_within_the_same_client(
    guarded: Start, recording_upstream: RecordingUpstream
) -> None:
    """The ledger is keyed by client name: bob cannot answer alice's call."""

    async def tool_call(request: web.Request, received: Received) -> web.StreamResponse:
        output = [sales_call("call_9")] if len(recording_upstream.received) == 1 else []
        return web.json_response({"object": "response", "id": "resp_1", "output": output})

    recording_upstream.handler = tool_call
    base = await guarded()
    alice = {"Authorization": f"Bearer {ALICE_KEY}"}
    bob = {"Authorization": f"Bearer {BOB_KEY}"}
    follow_up = {
        "model": "m",
        "tools": [SALES_TOOL],
        "previous_response_id": "resp_1",
        "input": [sales_output("call_9")],
    }
    async with aiohttp.ClientSession() as session:
        async with session.post(base + "/v1/responses", json={"input": "hi"}, headers=alice) as r:
            assert r.status == 200
        async with session.post(base + "/v1/responses", json=follow_up, headers=bob) as r:
            assert r.status == 400
            assert (await r.json())["error"]["findings"][0]["reason"] == "orphan"
        async with session.post(base + "/v1/responses", json=follow_up, headers=alice) as r:
            assert r.status == 200, await r.text()
    assert len(recording_upstream.received) == 2
