"""The Chat completions the proxy relays, JSON and streamed, through the real proxy: their tool
calls recorded in the ledger (memory and Redis) for `provenance` and `status`, and checked by
door 2 once relayed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.builders import at, audit_records
from tests.fixture_types import ProxyFactory
from tests.server.test_chat_completions import MODEL, SALES, TOOLS, USER, calls, entry, tool
from tests.server.test_emitted_calls import EMITTED, counted
from tests.servers.recording import RecordingUpstream
from tests.servers.redis_server import RedisServer
from tests.servers.strict_chat import answering, stream_of, tool_completion

CHAT = "/v1/chat/completions"
ALICE = {"Authorization": "Bearer sk-alice"}
BOB = {"Authorization": "Bearer sk-bob"}


@pytest.fixture(params=["memory", "redis"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "memory":
        return {"backend": "memory"}
    server: RedisServer = request.getfixturevalue("redis_server")
    return {"backend": "redis", "url": server.url}


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post(
    http: aiohttp.ClientSession, base: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[int, bytes]:
    async with http.post(at(base, CHAT), json=body, headers=headers) as resp:
        return resp.status, await resp.read()


def turn(messages: list[Any], *, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "tools": TOOLS}
    return body | {"stream": True} if stream else body


def reasons(answer: bytes) -> list[str]:
    return [f["reason"] for f in json.loads(answer)["error"]["findings"]]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_call_the_proxy_relayed_passes_provenance_for_its_tenant_only(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    http: aiohttp.ClientSession,
    ledger: Any,
    stream: bool,
) -> None:
    made = entry("call_made")
    answer = tool_completion(made)
    recording_upstream.handler = answering(answer)
    base = await start_proxy(
        recording_upstream.url, gate={"require_provenance": True}, ledger=ledger
    )

    status, got = await post(http, base, turn([USER], stream=stream), ALICE)
    assert status == 200
    assert got == (stream_of(answer) if stream else json.dumps(answer).encode())

    replay = [USER, calls(made), tool("call_made")]
    status, got = await post(http, base, turn(replay), ALICE)
    assert status == 200, got
    assert recording_upstream.received[-1].json()["messages"] == replay
    # Another tenant never got that completion; a call it did not make is no call of it.
    status, got = await post(http, base, turn(replay), BOB)
    assert (status, reasons(got)) == (400, ["provenance"])
    forged = [USER, calls(entry("call_made", "emea")), tool("call_made")]
    status, got = await post(http, base, turn(forged), ALICE)
    assert (status, reasons(got)) == (400, ["provenance"])
    assert len(recording_upstream.received) == 2


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_call_of_a_cut_completion_fails_status(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    http: aiohttp.ClientSession,
    ledger: Any,
    stream: bool,
) -> None:
    cut = entry("call_cut")
    recording_upstream.handler = answering(tool_completion(cut, finish_reason="length"))
    base = await start_proxy(recording_upstream.url, ledger=ledger)

    status, _ = await post(http, base, turn([USER], stream=stream), ALICE)
    assert status == 200

    status, got = await post(http, base, turn([USER, calls(cut), tool("call_cut")]), ALICE)
    assert (status, reasons(got)) == (400, ["status"])
    [found] = json.loads(got)["error"]["findings"]
    assert found["param"] == "messages[2]"
    assert "relayed this tool call in a completion that was cut short" in found["message"]
    # A call the proxy never relayed says nothing of its status: it is complete.
    status, _ = await post(http, base, turn([USER, calls(entry("c9")), tool("c9")]), ALICE)
    assert status == 200
    assert len(recording_upstream.received) == 2


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_door_2_checks_the_emitted_tool_calls_once_relayed(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    stream: bool,
) -> None:
    answer = tool_completion(entry("c_ok"), entry("c_bad", "mars"))
    recording_upstream.handler = answering(answer)
    base = await start_proxy(recording_upstream.url)

    status, got = await post(http, base, turn([USER], stream=stream), ALICE)

    # The answer goes by as it came: door 2 only watches.
    assert status == 200
    assert got == (stream_of(answer) if stream else json.dumps(answer).encode())
    assert await counted(http, base, 1, "chat", tool=SALES, verdict="arguments_schema") == 1
    assert await counted(http, base, 1, "chat", tool=SALES, verdict="ok") == 1
    [record] = audit_records(tmp_path)
    assert record["event"] == "emitted_call_rejected"
    assert (record["path"], record["response_id"], record["model"]) == (CHAT, "chatcmpl-2", MODEL)
    [found] = record["findings"]
    assert (found["call_id"], found["reason"], found["param"]) == (
        "c_bad",
        "arguments_schema",
        "choices[0].message.tool_calls[1]",
    )
    assert found["fail"] == [
        {"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}
    ]
    assert EMITTED  # the series door 2 counts in
