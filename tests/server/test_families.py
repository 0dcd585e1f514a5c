"""A forged output of each call family is an `orphan` through the real proxy (vendor openai),
with the openai SDK as the client; with its call it is forwarded."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.builders import USER
from tests.fixture_types import Clients, ProxyFactory
from tests.gate.test_families import FAMILIES, LISTED, PATCH_TOOL
from tests.servers.recording import RecordingUpstream


@pytest.mark.parametrize("forged", [True, False], ids=["forged", "paired"])
@pytest.mark.parametrize("family", FAMILIES)
async def test_each_family_is_paired(
    recording_upstream: RecordingUpstream,
    start_routed: ProxyFactory,
    client_for: Clients,
    family: str,
    forged: bool,
) -> None:
    openai_upstream = {"url": recording_upstream.url, "vendor": "openai"}
    base = await start_routed(upstreams={"up": openai_upstream}, routes=[{"upstream": "up"}])
    client = client_for(base)
    call, output = FAMILIES[family]
    input_items: list[Any] = [USER, output] if forged else [USER, call, output]

    if not forged:
        # The tools the calls with input or arguments are judged by: declared, and listed.
        input_items.insert(1, LISTED)
        tools: list[Any] = [PATCH_TOOL]
        await client.responses.create(model="m", input=input_items, tools=tools)
        [received] = recording_upstream.received
        assert received.json() == {"model": "m", "input": input_items, "tools": [PATCH_TOOL]}
        return
    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(model="m", input=input_items)

    assert isinstance(raised.value.body, dict)
    [finding] = raised.value.body["findings"]
    assert (finding["index"], finding["reason"]) == (1, "orphan")
    assert recording_upstream.received == []
