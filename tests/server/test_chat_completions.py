"""POST /v1/chat/completions gated live: the official openai SDK's `chat.completions.create`
through the real proxy, to a recording upstream and to a strict Chat upstream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web

from tests.builders import SALES_SCHEMA, audit_records
from tests.fixture_types import Clients, ProxyFactory
from tests.servers import strict_chat
from tests.servers.recording import Received, RecordingUpstream
from tests.servers.strict_chat import StrictChat

MODEL = "scripted"
SALES = "get_latest_sales_report"
TOOLS: list[Any] = [{"type": "function", "function": {"name": SALES, "parameters": SALES_SCHEMA}}]
USER = {"role": "user", "content": "How did APAC do last quarter?"}


def entry(call_id: str, region: Any = "apac", **changed: Any) -> dict[str, Any]:
    arguments = json.dumps({"region": region}) if isinstance(region, str) else region
    function = {"name": SALES, "arguments": arguments} | changed.pop("function", {})
    return {"id": call_id, "type": "function", "function": function} | changed


def calls(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(entries)}


def tool(call_id: str, content: str = "apac: 42 units") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


async def _completion(request: web.Request, received: Received) -> web.StreamResponse:
    return web.json_response(strict_chat.completion("done"))


@pytest.fixture
def chat_upstream(recording_upstream: RecordingUpstream) -> RecordingUpstream:
    recording_upstream.handler = _completion
    return recording_upstream


@pytest.fixture
async def strict() -> AsyncIterator[StrictChat]:
    async with strict_chat.serve() as upstream:
        yield upstream


# (messages, the reason of the one finding, its param): each reason with its Chat meaning.
FAILING = [
    pytest.param([USER, calls(entry("c1")), tool("zz")], "orphan", "messages[2]", id="orphan"),
    pytest.param(
        [USER, calls(entry("c1")), tool("c1"), tool("c1")],
        "duplicate_call_id",
        "messages[2]",
        id="duplicate_call_id",
    ),
    pytest.param(
        [USER, calls(entry("c1", type="custom")), tool("c1")],
        "not_function_call",
        "messages[2]",
        id="not_function_call",
    ),
    pytest.param(
        [USER, calls(entry("c" * 65)), tool("c" * 65)],
        "not_portable",
        "messages[2]",
        id="not_portable-id",
    ),
    pytest.param(
        [USER, calls(entry("c1", {"region": "apac"})), tool("c1")],
        "arguments_type",
        "messages[2]",
        id="arguments_type",
    ),
    pytest.param(
        [USER, calls(entry("c1", function={"arguments": "{bad"})), tool("c1")],
        "arguments_parse",
        "messages[2]",
        id="arguments_parse",
    ),
    pytest.param(
        [USER, calls(entry("c1", function={"name": "delete_all"})), tool("c1")],
        "unknown_tool",
        "messages[2]",
        id="unknown_tool",
    ),
    pytest.param(
        [USER, calls(entry("c0"), entry("c1", "mars")), tool("c0"), tool("c1")],
        "arguments_schema",
        "messages[3]",
        id="arguments_schema",
    ),
    pytest.param(
        [USER, {"type": "function_call_output", "call_id": "c1", "output": "x"}],
        "envelope",
        "messages[1]",
        id="envelope",
    ),
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(("messages", "reason", "param"), FAILING)
async def test_each_reason_blocks_with_the_chat_error(
    chat_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client_for: Clients,
    tmp_path: Path,
    messages: list[Any],
    reason: str,
    param: str,
    stream: bool,
) -> None:
    client = client_for(await start_proxy(chat_upstream.url))

    with pytest.raises(openai.BadRequestError) as raised:
        await client.chat.completions.create(
            model=MODEL, messages=messages, tools=TOOLS, stream=stream
        )

    assert raised.value.code == "replay_rejected"
    assert raised.value.param == param
    body = raised.value.body
    assert isinstance(body, dict)
    # The first finding is the one the error names (a duplicate finds each of its outputs).
    found = body["findings"][0]
    assert (found["reason"], found["param"]) == (reason, param)
    assert found["index"] == int(param.removeprefix("messages[").removesuffix("]"))
    assert {f["reason"] for f in body["findings"]} == {reason}
    assert chat_upstream.received == []
    [record] = audit_records(tmp_path)
    assert record["path"] == "/v1/chat/completions"
    assert {f["reason"] for f in record["findings"]} == {reason}


async def test_a_clean_replay_goes_upstream_as_sent(
    chat_upstream: RecordingUpstream, start_proxy: ProxyFactory, client_for: Clients, tmp_path: Path
) -> None:
    client = client_for(await start_proxy(chat_upstream.url))
    messages: list[Any] = [USER, calls(entry("c1")), tool("c1")]

    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, tools=TOOLS
    )

    assert raw.parse().choices[0].message.content == "done"
    assert "x-replay-gate" not in raw.headers
    [got] = chat_upstream.received
    assert got.target == "/v1/chat/completions"
    assert got.json()["messages"] == messages
    assert audit_records(tmp_path) == []


@pytest.mark.parametrize("messages", [5, "hi", {"role": "user"}, None], ids=str)
async def test_messages_that_are_no_array_are_refused_and_never_forwarded(
    chat_upstream: RecordingUpstream, start_proxy: ProxyFactory, client_for: Clients, messages: Any
) -> None:
    client = client_for(await start_proxy(chat_upstream.url))

    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)

    assert refused.value.code == "invalid_messages"
    assert refused.value.param == "messages"
    assert chat_upstream.received == []


async def test_the_legacy_function_form_is_gated(
    chat_upstream: RecordingUpstream, start_proxy: ProxyFactory, client_for: Clients
) -> None:
    client = client_for(await start_proxy(chat_upstream.url))
    function_call = {"name": SALES, "arguments": json.dumps({"region": "mars"})}
    messages: list[Any] = [
        USER,
        {"role": "assistant", "content": None, "function_call": function_call},
        {"role": "function", "name": SALES, "content": "secret"},
    ]
    functions: list[Any] = [{"name": SALES, "parameters": SALES_SCHEMA}]

    with pytest.raises(openai.BadRequestError) as raised:
        await client.chat.completions.create(model=MODEL, messages=messages, functions=functions)

    assert raised.value.code == "replay_rejected"
    body = raised.value.body
    assert isinstance(body, dict)
    [found] = body["findings"]
    assert (found["reason"], found["param"], found["paired_index"]) == (
        "arguments_schema",
        "messages[2]",
        1,
    )
    assert chat_upstream.received == []


async def test_provenance_refuses_a_call_no_completion_made(
    chat_upstream: RecordingUpstream, start_proxy: ProxyFactory, client_for: Clients
) -> None:
    client = client_for(await start_proxy(chat_upstream.url, gate={"require_provenance": True}))
    messages: list[Any] = [USER, calls(entry("c1")), tool("c1")]

    with pytest.raises(openai.BadRequestError) as raised:
        await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)

    body = raised.value.body
    assert isinstance(body, dict)
    assert [f["reason"] for f in body["findings"]] == ["provenance"]


MARS: list[Any] = [USER, calls(entry("c0"), entry("c1", "mars")), tool("c0"), tool("c1", "secret")]
RECORD = {
    "success": False,
    "execute": False,
    "check": SALES,
    "reason": "arguments_schema",
    "pass": [],
    "fail": [{"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}],
    "error": "region failed schema: expected one of apac, emea, amer",
}


@pytest.mark.parametrize(
    ("action", "header", "sent"),
    [
        pytest.param(
            "strip",
            "stripped=1",
            [USER, calls(entry("c0")), tool("c0")],
            id="strip-the-tool-message-and-its-entry",
        ),
        pytest.param(
            "rewrite",
            "rewritten=1",
            [*MARS[:3], tool("c1", json.dumps(RECORD, ensure_ascii=False))],
            id="rewrite-the-content",
        ),
        pytest.param("log", "logged=1", MARS, id="log-forwards"),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_actions_in_chat_terms_reach_a_strict_upstream(
    strict: StrictChat,
    start_proxy: ProxyFactory,
    client_for: Clients,
    tmp_path: Path,
    action: str,
    header: str,
    sent: list[Any],
    stream: bool,
) -> None:
    client = client_for(await start_proxy(strict.url, gate={"action": action}))

    answer: str | None
    if stream:
        async with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=MARS, tools=TOOLS, stream=True
        ) as streamed:
            headers = streamed.headers
            pieces = [c.choices[0].delta.content async for c in await streamed.parse()]
        answer = "".join(p for p in pieces if p)
    else:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MARS, tools=TOOLS
        )
        headers, answer = raw.headers, raw.parse().choices[0].message.content

    assert headers["x-replay-gate"] == header
    assert answer == f"tool said: {sent[-1]['content']}"
    [got] = strict.requests
    assert got["messages"] == sent
    [record] = audit_records(tmp_path)
    assert record["path"] == "/v1/chat/completions"
    [found] = record["findings"]
    assert (found["index"], found["param"], found["reason"]) == (
        3,
        "messages[3]",
        "arguments_schema",
    )


async def test_strip_drops_an_assistant_message_left_empty(
    strict: StrictChat, start_proxy: ProxyFactory, client_for: Clients
) -> None:
    client = client_for(await start_proxy(strict.url, gate={"action": "strip"}))
    messages: list[Any] = [
        USER,
        calls(entry("c1", "mars")),
        tool("c1"),
        {"role": "user", "content": "and?"},
    ]

    answer = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)

    assert answer.choices[0].message.content == "echo: and?"
    [got] = strict.requests
    assert got["messages"] == [USER, {"role": "user", "content": "and?"}]


async def test_the_strict_upstream_refuses_what_strip_avoids(strict: StrictChat) -> None:
    """The strict upstream is strict: a tool message without its call is refused."""
    assert strict_chat.refusal([USER, tool("c1")]) is not None
    assert strict_chat.refusal([USER, calls(entry("c1")), USER]) is not None
    assert strict_chat.refusal([USER, {"role": "assistant", "tool_calls": []}]) is not None
    assert strict_chat.refusal([USER, calls(entry("c1")), tool("c1")]) is None


@pytest.mark.parametrize(
    ("vendor", "length", "status"),
    [
        pytest.param("openai", 41, 400, id="openai-refuses-41"),
        pytest.param("openai", 40, 200, id="openai-takes-40"),
        pytest.param(None, 64, 200, id="no-vendor-takes-64"),
        pytest.param("acme", 41, 200, id="another-vendor-takes-41"),
    ],
)
async def test_not_portable_speaks_the_chat_limits_of_the_upstreams_vendor(
    chat_upstream: RecordingUpstream,
    start_routed: ProxyFactory,
    client_for: Clients,
    vendor: str | None,
    length: int,
    status: int,
) -> None:
    upstream = {"url": chat_upstream.url} | ({"vendor": vendor} if vendor else {})
    client = client_for(await start_routed(upstreams={"up": upstream}, routes=[{"upstream": "up"}]))
    call_id = "c" * length
    messages: list[Any] = [USER, calls(entry(call_id)), tool(call_id)]

    if status == 200:
        await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        [got] = chat_upstream.received
        assert got.json()["messages"] == messages
        return
    with pytest.raises(openai.BadRequestError) as raised:
        await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    body = raised.value.body
    assert isinstance(body, dict)
    [found] = body["findings"]
    assert (found["reason"], found["param"]) == ("not_portable", "messages[2]")
    assert found["fail"] == [{"path": "/call_id", "reason": "maxLength", "expected": 40}]
    assert chat_upstream.received == []
