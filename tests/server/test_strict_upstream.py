"""The strict upstream is as strict as it says: a tool output that answers no call in its
context fails the turn, and one that does (inline, through the chain, inside a compaction item,
behind a reference) passes. Without this, 17/17 through the proxy would prove little."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.builders import SALES_TOOL, sales_call, sales_output
from tests.servers import strict_upstream
from tests.servers.strict_upstream import StrictUpstream


@pytest.fixture
async def strict() -> AsyncIterator[StrictUpstream]:
    async with strict_upstream.serve() as upstream:
        yield upstream


async def post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    async with session.post(url, json=body) as resp:
        return resp.status, json.loads(await resp.read())


CALL = sales_call("call_1")


@pytest.mark.parametrize(
    ("setup", "follow_up", "status"),
    [
        pytest.param(None, [CALL, sales_output("call_1")], 200, id="inline-pair"),
        pytest.param(None, [sales_output("call_1")], 400, id="orphan"),
        pytest.param(None, [sales_output("call_1"), CALL], 400, id="output-before-call"),
        pytest.param("chain", [sales_output("CALL")], 200, id="call-in-previous-response"),
        pytest.param("chain", [sales_output("call_other")], 400, id="not-in-previous-response"),
        pytest.param("chain-input", [sales_output("call_1")], 200, id="call-in-previous-input"),
        pytest.param("compact", [sales_output("call_1")], 200, id="call-inside-compaction"),
        pytest.param("reference", [sales_output("CALL")], 200, id="call-behind-reference"),
    ],
)
async def test_a_tool_output_must_answer_a_call_in_its_context(
    strict: StrictUpstream, setup: str | None, follow_up: list[dict[str, Any]], status: int
) -> None:
    body: dict[str, Any] = {"model": "m", "tools": [SALES_TOOL]}
    async with aiohttp.ClientSession() as session:
        if setup in ("chain", "reference"):
            _, first = await post(session, strict.url + "/v1/responses", {**body, "input": "go"})
            [call] = first["output"]
            # "CALL" stands for the call the first response made.
            follow_up = [
                o | {"call_id": call["call_id"]} if o["call_id"] == "CALL" else o for o in follow_up
            ]
            if setup == "chain":
                body["previous_response_id"] = first["id"]
            else:
                follow_up = [{"type": "item_reference", "id": call["id"]}, *follow_up]
        elif setup == "chain-input":
            _, first = await post(session, strict.url + "/v1/responses", {**body, "input": [CALL]})
            body["previous_response_id"] = first["id"]
        elif setup == "compact":
            _, compacted = await post(
                session, strict.url + "/v1/responses/compact", {"model": "m", "input": [CALL]}
            )
            follow_up = [*compacted["output"], *follow_up]
        got, answer = await post(
            session, strict.url + "/v1/responses", {**body, "input": follow_up}
        )

    assert got == status, answer
    if status == 400:
        assert answer["error"]["param"] == "input"
