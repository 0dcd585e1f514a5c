"""The official openai SDK through Envoy and the processor, only its base URL changed: block,
strip, rewrite and log, answered by the scripted agent behind Envoy."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.builders import SALES_TOOL, USER, sales_call, sales_output
from tests.fixture_types import Clients

MODEL = "scripted"
TOOLS: list[Any] = [SALES_TOOL]


async def test_a_failing_replay_is_blocked_and_not_retried(
    scripted_upstream: str, behind_envoy: Callable[..., Any], client_for: Clients
) -> None:
    envoy = await behind_envoy(scripted_upstream)
    client = client_for(envoy.url).with_options(max_retries=2)
    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(
            model=MODEL,
            tools=TOOLS,
            input=[USER, sales_call("call_1", "mars"), sales_output("call_1")],  # type: ignore[list-item]
        )
    assert raised.value.code == "replay_rejected"
    assert raised.value.response.headers["x-should-retry"] == "false"


@pytest.mark.parametrize(
    ("sections", "call", "header", "said"),
    [
        pytest.param(
            {},
            sales_call("call_1", status="in_progress"),
            "stripped=1",
            None,  # the pair is gone: the agent calls the tool afresh
            id="strip",
        ),
        pytest.param(
            {},
            sales_call("call_1", arguments="{bad"),
            "rewritten=1",
            "arguments_parse",  # the agent is told why, in the output it sees
            id="rewrite",
        ),
        pytest.param(
            {"gate": {"action": "log"}},
            sales_call("call_1", "mars"),
            "logged=1",
            "sales report",  # forwarded as it was
            id="log",
        ),
    ],
)
async def test_a_forwarded_replay_says_what_the_gate_did(
    scripted_upstream: str,
    behind_envoy: Callable[..., Any],
    client_for: Clients,
    sections: dict[str, Any],
    call: dict[str, Any],
    header: str,
    said: str | None,
) -> None:
    envoy = await behind_envoy(scripted_upstream, **sections)
    raw = await client_for(envoy.url).responses.with_raw_response.create(
        model=MODEL,
        tools=TOOLS,
        input=[USER, call, sales_output("call_1")],  # type: ignore[list-item]
    )
    assert raw.headers["x-replay-gate"] == header
    assert raw.headers["x-request-id"].startswith("req_")
    response = raw.parse()
    if said is None:
        assert [item.type for item in response.output] == ["function_call"]
    else:
        assert said in response.output_text
    if header == "rewritten=1":
        record = json.loads(response.output_text.removeprefix("tool said: "))
        assert (record["success"], record["reason"]) == (False, "arguments_parse")
