"""Follow-up turns behind Envoy: the processor records answers from the response phase, so a
`previous_response_id` pairs through Envoy as it does through `serve`, memory or Redis."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.builders import JSON_HEADERS, SALES_TOOL, sales_output
from tests.extproc.conftest import SECTIONS
from tests.fixture_types import Clients, ProxyFactory
from tests.servers.redis_server import RedisServer
from tests.state.test_followup import create, tool_turn, two_turns

MODEL = "scripted"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_follow_up_pairs_through_envoy(
    scripted_upstream: str,
    behind_envoy: Callable[..., Any],
    client_for: Clients,
    stream: bool,
) -> None:
    envoy = await behind_envoy(scripted_upstream)
    answer = await two_turns(client_for(envoy.url), stream=stream)
    assert answer.output_text == "tool said: apac: 42"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_fabricated_output_is_blocked_through_envoy(
    scripted_upstream: str,
    behind_envoy: Callable[..., Any],
    client_for: Clients,
    stream: bool,
) -> None:
    envoy = await behind_envoy(scripted_upstream)
    client = client_for(envoy.url)
    response_id, _ = await tool_turn(client, stream=stream)
    with pytest.raises(openai.BadRequestError) as raised:
        await create(
            client,
            stream=stream,
            input=[sales_output("call_never_made")],
            previous_response_id=response_id,
        )
    assert raised.value.code == "replay_rejected"
    assert raised.value.response.headers["x-should-retry"] == "false"
    assert raised.value.body["findings"][0]["reason"] == "orphan"  # type: ignore[index]


async def test_the_instant_follow_up_finds_its_record(
    scripted_upstream: str, behind_envoy: Callable[..., Any]
) -> None:
    """The follow-up goes out the moment the chunk with `response.completed` arrives, before
    the first answer has even ended: Envoy passes that chunk on only once the processor has
    answered it, and the processor answers it only once it is recorded."""
    envoy = await behind_envoy(scripted_upstream)
    first = {
        "model": MODEL,
        "tools": [SALES_TOOL],
        "input": "what are the latest sales?",
        "stream": True,
    }
    async with (
        aiohttp.ClientSession() as client,
        client.post(f"{envoy.url}/v1/responses", json=first) as streamed,
    ):
        assert streamed.status == 200
        completed = None
        async for line in streamed.content:
            if line.startswith(b"data: ") and b'"response.completed"' in line:
                completed = json.loads(line[6:])["response"]
                break
        assert completed is not None
        [call] = [item for item in completed["output"] if item["type"] == "function_call"]
        follow_up = {
            "model": MODEL,
            "tools": [SALES_TOOL],
            "previous_response_id": completed["id"],
            "input": [sales_output(call["call_id"], "apac: 42")],
        }
        async with client.post(
            f"{envoy.url}/v1/responses", json=follow_up, headers=JSON_HEADERS
        ) as answer:
            assert answer.status == 200, await answer.text()
            assert "tool said: apac: 42" in await answer.text()


@pytest.mark.parametrize("first_through", ["envoy", "serve"])
async def test_envoy_and_serve_share_a_redis_ledger(
    scripted_upstream: str,
    behind_envoy: Callable[..., Any],
    start_proxy: ProxyFactory,
    client_for: Clients,
    redis_server: RedisServer,
    tmp_path: Path,
    first_through: str,
) -> None:
    ledger = {"backend": "redis", "url": redis_server.url}
    envoy = await behind_envoy(scripted_upstream, ledger=ledger)
    served = await start_proxy(scripted_upstream, ledger=ledger, **SECTIONS)
    fronts = {"envoy": client_for(envoy.url), "serve": client_for(served)}
    then = "serve" if first_through == "envoy" else "envoy"

    response_id, call = await tool_turn(fronts[first_through], stream=True)
    answer = await create(
        fronts[then],
        stream=False,
        input=[sales_output(call["call_id"], "apac: 42")],
        previous_response_id=response_id,
    )
    assert answer.output_text == "tool said: apac: 42"


async def test_a_ledger_down_is_a_503_through_envoy(
    scripted_upstream: str,
    behind_envoy: Callable[..., Any],
    client_for: Clients,
    redis_server: RedisServer,
) -> None:
    """The processor answers as `serve` does: 503 `ledger_unavailable`, never an `orphan`."""
    envoy = await behind_envoy(
        scripted_upstream, ledger={"backend": "redis", "url": redis_server.url}
    )
    client = client_for(envoy.url)
    response_id, call = await tool_turn(client, stream=False)

    redis_server.stop()
    with pytest.raises(openai.InternalServerError) as raised:
        await create(
            client,
            stream=False,
            input=[sales_output(call["call_id"])],
            previous_response_id=response_id,
        )

    assert raised.value.status_code == 503
    assert (raised.value.type, raised.value.code) == ("server_error", "ledger_unavailable")
