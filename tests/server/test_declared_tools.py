"""A function call's schema is found wherever the request declares the function: a `namespace`
tool (the call names its `namespace`), a deferred tool, an `additional_tools` item, a
`tool_search_output` item. Through the real proxy with the openai SDK as the client."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.builders import SALES_TOOL, USER, sales_call, sales_output
from tests.fixture_types import Clients, ProxyFactory
from tests.servers.recording import RecordingUpstream

DEFERRED = SALES_TOOL | {"defer_loading": True}
NAMESPACE = {"type": "namespace", "name": "crm", "description": "CRM tools", "tools": [DEFERRED]}
IN_NAMESPACE = {"namespace": "crm"}
ADDED = {"type": "additional_tools", "role": "developer", "tools": [SALES_TOOL]}
SEARCHED = {
    "type": "tool_search_output",
    "call_id": "ts_1",
    "execution": "client",
    "status": "completed",
    "tools": [NAMESPACE],
}
SEARCH_CALL = {
    "type": "tool_search_call",
    "call_id": "ts_1",
    "execution": "client",
    "status": "completed",
    "arguments": {"query": "sales"},
}

# (the request's tools, items before the call, fields the call adds)
DECLARED = [
    pytest.param([NAMESPACE], [], IN_NAMESPACE, id="namespace"),
    pytest.param([DEFERRED], [], {}, id="deferred"),
    pytest.param([{"type": "tool_search"}], [ADDED], {}, id="additional-tools-item"),
    pytest.param(
        [{"type": "tool_search"}], [SEARCH_CALL, SEARCHED], IN_NAMESPACE, id="tool-search-output"
    ),
]
VENDORS = [pytest.param(None, id="no-vendor"), pytest.param("openai", id="openai")]


async def proxy_to(
    recording_upstream: RecordingUpstream, start_routed: Any, vendor: str | None
) -> str:
    upstream: dict[str, Any] = {"url": recording_upstream.url}
    if vendor is not None:
        upstream["vendor"] = vendor
    return str(await start_routed(upstreams={"up": upstream}, routes=[{"upstream": "up"}]))


def replay(tools: list[Any], before: list[Any], fields: dict[str, Any], region: str) -> Any:
    call = sales_call("c1", region) | fields
    return {"tools": tools, "input": [USER, *before, call, sales_output("c1")]}


@pytest.mark.parametrize("region", ["apac", "mars"])
@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize(("tools", "before", "fields"), DECLARED)
async def test_a_valid_call_is_forwarded_a_broken_one_is_arguments_schema(
    recording_upstream: RecordingUpstream,
    start_routed: ProxyFactory,
    client_for: Clients,
    tools: list[Any],
    before: list[Any],
    fields: dict[str, Any],
    vendor: str | None,
    region: str,
) -> None:
    client = client_for(await proxy_to(recording_upstream, start_routed, vendor))
    body = replay(tools, before, fields, region)

    if region == "apac":
        await client.responses.create(model="m", **body)
        [received] = recording_upstream.received
        assert received.json() == {"model": "m", **body}
        return
    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(model="m", **body)

    assert isinstance(raised.value.body, dict)
    [finding] = raised.value.body["findings"]
    assert finding["reason"] == "arguments_schema"
    assert finding["fail"] == [
        {"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}
    ]
    assert recording_upstream.received == []
