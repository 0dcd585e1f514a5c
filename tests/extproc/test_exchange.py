"""The processor's translation, message by message: ProcessingRequests in, ProcessingResponses
out, no sockets (the Envoy tests run the same code behind a real Envoy)."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc

from proxy.admission import exchange as exchange_module
from proxy.admission import pipeline
from proxy.admission.tap import ResponseTap
from proxy.extproc.exchange import ExtprocStream as Exchange
from proxy.extproc.exchange import Front
from proxy.extproc.service import open_front
from proxy.running.config_file import parse_config
from tests.builders import (
    AMPLIFYING,
    clean_body,
    failing_body,
    request_body,
    sales_call,
    sales_output,
)
from tests.extproc.conftest import NOWHERE

LIMIT = 1024 * 1024
KEY_SHA256 = "a" * 64  # no key hashes to it


@pytest.fixture
async def front(tmp_path: Path) -> AsyncIterator[Front]:
    config = parse_config(
        {
            "audit": {"path": str(tmp_path / "audit.jsonl")},
            "limits": {"max_body_bytes": LIMIT},
            "gate": {"actions": {"status": "strip"}},
            "upstreams": {"default": {"url": NOWHERE}, "acme": {"url": NOWHERE}},
            "routes": [{"path_prefix": "/acme", "upstream": "acme"}, {"upstream": "default"}],
        }
    )
    async with open_front(config) as opened:
        yield opened


def headers_message(
    method: str,
    path: str,
    headers: Mapping[str, str | bytes] | None = None,
    *,
    end_of_stream: bool = False,
) -> Any:
    headers = headers or {}
    values = [(":method", method), (":path", path), *headers.items()]
    if method == "POST" and "content_type" not in headers:
        values.append(("content-type", "application/json"))
    return ext_proc.ProcessingRequest(
        request_headers=ext_proc.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(
                        key=name.replace("_", "-"),
                        raw_value=value if isinstance(value, bytes) else value.encode(),
                    )
                    for name, value in values
                ]
            ),
            end_of_stream=end_of_stream,
        )
    )


def body_message(data: bytes, *, end_of_stream: bool = True) -> Any:
    return ext_proc.ProcessingRequest(
        request_body=ext_proc.HttpBody(body=data, end_of_stream=end_of_stream)
    )


def response_headers_message(**headers: str) -> Any:
    return ext_proc.ProcessingRequest(
        response_headers=ext_proc.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=name.replace("_", "-"), raw_value=value.encode())
                    for name, value in headers.items()
                ]
            )
        )
    )


_Mode = processing_mode_pb2.ProcessingMode
# A mode override replaces the whole mode (a field left out is its zero: NONE, DEFAULT).
_MODES = {
    (_Mode.SKIP, _Mode.NONE): "nothing",
    (_Mode.DEFAULT, _Mode.NONE): "no-body",
    (_Mode.DEFAULT, _Mode.BUFFERED): "whole",
}


def described(response: Any) -> tuple[Any, ...]:
    """A response as a row of a table: an answer of the processor's own (status, code), or
    `continue` with the headers set (request ids left out), removed, a new body, and the mode
    for the rest of the stream."""
    kind = response.WhichOneof("response")
    if kind == "immediate_response":
        immediate = response.immediate_response
        return ("answer", immediate.status.code, json.loads(immediate.body)["error"]["code"])
    common = getattr(response, kind).response
    mutation = common.header_mutation
    set_headers = {
        option.header.key: option.header.raw_value.decode()
        for option in mutation.set_headers
        if option.header.key != "x-request-id"
    }
    body = common.body_mutation.body if common.HasField("body_mutation") else None
    override = response.mode_override
    modes = (override.response_header_mode, override.response_body_mode)
    mode = _MODES[modes] if response.HasField("mode_override") else None
    return ("continue", set_headers, list(mutation.remove_headers), body, mode)


CONTINUE: tuple[Any, ...] = ("continue", {}, [], None, None)
NOTHING_MORE: tuple[Any, ...] = ("continue", {}, [], None, "nothing")

HEADERS = [
    pytest.param(
        "GET", "/v1/models", {}, True, ("continue", {}, [], None, "nothing"), id="ungated"
    ),
    pytest.param("GET", "/v1/responses", {}, True, ("continue", {}, [], None, "nothing"), id="get"),
    pytest.param("POST", "/v1/responses", {}, False, CONTINUE, id="gated"),
    pytest.param("POST", "/v1/responses?x=1", {}, False, CONTINUE, id="gated-with-query"),
    pytest.param(
        "POST",
        "/V1/Responses/",
        {},
        False,
        ("continue", {":path": "/v1/responses"}, [], None, None),
        id="gated-goes-up-canonical",
    ),
    pytest.param(
        "POST",
        "/v1/responses%2Fcompact",
        {},
        False,
        ("continue", {":path": "/v1/responses/compact"}, [], None, None),
        id="escaped-slash-reads-as-compact",
    ),
    pytest.param(
        "POST",
        "/v1/responses/compact%3F%2F..",
        {},
        False,
        ("answer", 400, "invalid_request_target"),
        id="reads-as-two-gated-paths",
    ),
    pytest.param(
        "GET", "/v1/%zz", {}, True, ("answer", 400, "invalid_request_target"), id="bad-escape"
    ),
    # `serve`'s own namespace; behind Envoy there is none to keep apart.
    pytest.param("GET", "/-/healthy", {}, True, NOTHING_MORE, id="serve-own-path"),
    pytest.param("GET", "/%2D/x", {}, True, NOTHING_MORE, id="serve-own-path-escaped"),
    pytest.param("GET", "/v1/responses/resp_1", {}, True, CONTINUE, id="read-is-recorded"),
    # Under a route's `path_prefix`: read, gated and forwarded without it, as `serve` does.
    pytest.param(
        "POST",
        "/acme/v1/responses",
        {},
        False,
        ("continue", {":path": "/v1/responses"}, [], None, None),
        id="prefixed-gated-goes-up-without-it",
    ),
    pytest.param(
        "POST",
        "/Acme/v1/responses/compact?x=1",
        {},
        False,
        ("continue", {":path": "/v1/responses/compact?x=1"}, [], None, None),
        id="prefixed-any-case-with-query",
    ),
    pytest.param(
        "GET",
        "/acme/v1/models",
        {},
        True,
        ("continue", {":path": "/v1/models"}, [], None, "nothing"),
        id="prefixed-ungated-goes-up-without-it",
    ),
    pytest.param(
        "GET",
        "/acme/v1/responses/resp_1",
        {},
        True,
        ("continue", {":path": "/v1/responses/resp_1"}, [], None, None),
        id="prefixed-read-is-recorded",
    ),
    pytest.param("GET", "/acmex/v1/responses", {}, True, NOTHING_MORE, id="not-under-the-prefix"),
    pytest.param(
        "POST",
        "/v1/responses",
        {"content_type": "text/plain"},
        False,
        ("answer", 415, "unsupported_media_type"),
        id="text-plain",
    ),
    pytest.param(
        "POST",
        "/v1/responses",
        {"content_length": str(LIMIT + 1)},
        False,
        ("answer", 413, "body_too_large"),
        id="declared-too-large",
    ),
    pytest.param(
        "POST", "/v1/responses", {}, True, ("answer", 400, "invalid_json"), id="no-body-at-all"
    ),
    pytest.param(
        "POST",
        "/v1/responses",
        {"upgrade": "websocket"},
        False,
        ("answer", 400, "websocket_not_gated"),
        id="websocket",
    ),
    pytest.param(
        "GET",
        "/v1/chat/completions",
        {"upgrade": "websocket"},
        True,
        ("answer", 400, "websocket_not_supported"),
        id="chat-has-no-websocket",
    ),
    pytest.param(
        "POST",
        "/v1/responses",
        {"accept_encoding": "zstd, gzip"},
        False,
        ("continue", {"accept-encoding": "gzip"}, [], None, None),
        id="asks-for-readable-codings",
    ),
    pytest.param(
        "POST",
        "/v1/responses",
        {"x_note": b"\xff"},
        False,
        ("answer", 400, "invalid_header"),
        id="header-not-utf-8",
    ),
]


@pytest.mark.parametrize(("method", "path", "headers", "end", "expected"), HEADERS)
async def test_request_headers(
    front: Front,
    method: str,
    path: str,
    headers: dict[str, str],
    end: bool,
    expected: tuple[Any, ...],
) -> None:
    message = headers_message(method, path, headers, end_of_stream=end)
    assert described(await Exchange(front).answer(message)) == expected


def compact(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


STRIPPED = request_body(sales_call("call_1", status="in_progress"), sales_output("call_1"))

BODIES = [
    pytest.param({}, compact(clean_body()), CONTINUE, id="clean-unchanged"),
    pytest.param(
        {"content_encoding": "gzip"},
        gzip.compress(compact(clean_body())),
        (
            "continue",
            {"content-length": str(len(compact(clean_body())))},
            ["content-encoding"],
            compact(clean_body()),
            None,
        ),
        id="gzip-goes-up-decoded",
    ),
    pytest.param(
        {},
        compact(STRIPPED),
        (
            "continue",
            {"content-length": str(len(compact(request_body())))},
            [],
            compact(request_body()),
            None,
        ),
        id="strip",
    ),
    pytest.param({}, compact(failing_body()), ("answer", 400, "replay_rejected"), id="block"),
    pytest.param(
        {}, b'{"input":"' + b"a" * LIMIT + b'"}', ("answer", 413, "body_too_large"), id="too-large"
    ),
    pytest.param({}, b'{"a":1,"a":2}', ("answer", 400, "invalid_json"), id="duplicate-keys"),
]


@pytest.mark.parametrize(("headers", "data", "expected"), BODIES)
async def test_request_body(
    front: Front, headers: dict[str, str], data: bytes, expected: tuple[Any, ...]
) -> None:
    exchange = Exchange(front)
    assert described(await exchange.answer(headers_message("POST", "/v1/responses", headers)))[
        0
    ] == ("continue")
    assert described(await exchange.answer(body_message(data))) == expected


async def test_an_amplifying_body_gets_a_bounded_answer(front: Front) -> None:
    # The admission's caps hold behind Envoy too: its answer is the pipeline's.
    exchange = Exchange(front)
    await exchange.answer(headers_message("POST", "/v1/responses"))
    response = await exchange.answer(body_message(AMPLIFYING))

    immediate = response.immediate_response
    assert immediate.status.code == 400
    assert len(immediate.body) < 256 * 1024
    [finding] = json.loads(immediate.body)["error"]["findings"]
    assert (len(finding["fail"]), finding["fail_omitted"]) == (20, 5980)


ANSWERS = [
    pytest.param(
        compact(clean_body()),
        {":status": "200", "content_type": "application/json", "content_length": "2"},
        ("continue", {"content-length": "2"}, [], None, "whole"),
        id="json-read-whole",
    ),
    pytest.param(
        compact(clean_body()),
        {":status": "200", "content_type": "application/json", "content_length": str(LIMIT + 1)},
        ("continue", {}, [], None, None),
        id="json-too-large-to-read-whole-streamed",
    ),
    pytest.param(
        compact(clean_body()),
        {":status": "200", "content_type": "application/json"},
        ("continue", {}, [], None, None),
        id="json-of-unknown-length-streamed",
    ),
    pytest.param(
        compact(clean_body()),
        {":status": "200", "content_type": "text/event-stream"},
        ("continue", {}, [], None, None),
        id="sse-streamed",
    ),
    pytest.param(
        compact(clean_body()),
        {":status": "500", "content_type": "application/json"},
        ("continue", {}, [], None, "no-body"),
        id="error-not-read",
    ),
    pytest.param(
        compact(STRIPPED),
        {":status": "200", "content_type": "application/json", "x_request_id": "theirs"},
        (
            "continue",
            {"x-replay-gate": "stripped=1", "x-upstream-request-id": "theirs"},
            [],
            None,
            None,
        ),
        id="finding-named-upstream-id-moved",
    ),
]


@pytest.mark.parametrize(("data", "answer_headers", "expected"), ANSWERS)
async def test_response_headers(
    front: Front, data: bytes, answer_headers: dict[str, str], expected: tuple[Any, ...]
) -> None:
    exchange = Exchange(front)
    await exchange.answer(headers_message("POST", "/v1/responses"))
    await exchange.answer(body_message(data))
    answered = await exchange.answer(response_headers_message(**answer_headers))
    assert described(answered) == expected
    (request_id,) = [
        o.header.raw_value.decode()
        for o in answered.response_headers.response.header_mutation.set_headers
        if o.header.key == "x-request-id"
    ]
    assert request_id == exchange.request_id


async def test_the_answer_is_recorded_before_its_last_chunk_is_let_go(front: Front) -> None:
    exchange = Exchange(front)
    await exchange.answer(headers_message("POST", "/v1/responses"))
    await exchange.answer(body_message(compact(clean_body())))
    answer = compact({"object": "response", "id": "resp_x", "output": [sales_call("call_9")]})
    await exchange.answer(
        response_headers_message(
            **{":status": "200", "content_type": "application/json"},
            content_length=str(len(answer)),
        )
    )
    assert await front.ledger.store.size() == 0
    last = ext_proc.ProcessingRequest(
        response_body=ext_proc.HttpBody(body=answer, end_of_stream=True)
    )
    let_go = await exchange.answer(last)
    assert let_go.WhichOneof("response") == "response_body"
    assert await front.ledger.store.size() == 1


@pytest.mark.parametrize(
    ("then", "expected"),
    [
        pytest.param("/acme/v1/responses", CONTINUE, id="same-upstream-pairs"),
        pytest.param(
            "/v1/responses",
            ("answer", 400, "foreign_previous_response"),
            id="other-upstream-refused",
        ),
    ],
)
async def test_the_ledger_records_which_upstream_made_a_response(
    front: Front, then: str, expected: tuple[Any, ...]
) -> None:
    """A response made under `/acme` is recorded as upstream acme's, as `serve` records it: a
    follow-up on another route's upstream is refused, not paired with calls it never had."""
    first = Exchange(front)
    await first.answer(headers_message("POST", "/acme/v1/responses"))
    await first.answer(body_message(compact(request_body())))
    answer = compact({"object": "response", "id": "resp_a", "output": [sales_call("call_9")]})
    sent = {":status": "200", "content_type": "application/json"}
    await first.answer(response_headers_message(**sent, content_length=str(len(answer))))
    last = ext_proc.HttpBody(body=answer, end_of_stream=True)
    await first.answer(ext_proc.ProcessingRequest(response_body=last))

    follow_up = request_body(sales_output("call_9"), previous_response_id="resp_a")
    second = Exchange(front)
    await second.answer(headers_message("POST", then))
    assert described(await second.answer(body_message(compact(follow_up)))) == expected


async def test_the_calls_of_an_answer_cut_short_are_checked(front: Front, tmp_path: Path) -> None:
    """Envoy ends the stream before the answer's end (the client went away): the calls of the
    responses recorded by then are checked all the same (door 2), as `serve` checks those of
    an answer cut short, under the route the request took."""
    exchange = Exchange(front)
    await exchange.answer(headers_message("POST", "/acme/v1/responses"))
    await exchange.answer(body_message(compact(clean_body(stream=True))))
    sse = {":status": "200", "content_type": "text/event-stream"}
    await exchange.answer(response_headers_message(**sse))
    response = {"object": "response", "id": "resp_cut", "output": [sales_call("call_9", "mars")]}
    completed = compact({"type": "response.completed", "response": response})
    chunk = ext_proc.HttpBody(body=b"event: response.completed\ndata: " + completed + b"\n\n")
    await exchange.answer(ext_proc.ProcessingRequest(response_body=chunk))
    assert await front.ledger.store.size() == 1  # recorded; the answer is not over yet

    exchange.close()
    await front.emitted.wait()
    labels = {
        "tool": "get_latest_sales_report",
        "verdict": "arguments_schema",
        "dialect": "responses",
    }
    counted = front.metrics.registry.get_sample_value("replay_proxy_emitted_calls_total", labels)
    assert counted == 1
    [record] = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert (record["event"], record["transport"], record["upstream"], record["path"]) == (
        "emitted_call_rejected",
        "extproc",
        "acme",
        "/v1/responses",
    )
    assert record["request_id"] == exchange.request_id


class Bug(Exception):
    """A failure of the processor's own, raised where no answer was decided."""


def raise_bug(*args: Any, **kwargs: Any) -> Any:
    raise Bug("a bug")


@pytest.mark.parametrize(
    ("where", "name"),
    [
        pytest.param(pipeline, "admit", id="admission"),
        pytest.param(exchange_module, "tenant_for", id="tenant"),
    ],
)
async def test_a_bug_before_anything_went_up_is_a_500_naming_the_request(
    front: Front,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    where: Any,
    name: str,
) -> None:
    monkeypatch.setattr(where, name, raise_bug)
    exchange = Exchange(front)
    answered = await exchange.answer(headers_message("POST", "/v1/responses"))
    if answered.WhichOneof("response") != "immediate_response":
        answered = await exchange.answer(body_message(compact(clean_body())))
    assert described(answered) == ("answer", 500, "internal_error")
    assert exchange.request_id in json.loads(answered.immediate_response.body)["error"]["message"]
    assert any(exchange.request_id in r.getMessage() and r.exc_info for r in caplog.records)


async def test_a_bug_once_the_answer_is_on_its_way_ends_the_stream(
    front: Front, monkeypatch: pytest.MonkeyPatch
) -> None:
    exchange = Exchange(front)
    await exchange.answer(headers_message("POST", "/v1/responses"))
    await exchange.answer(body_message(compact(clean_body())))
    await exchange.answer(
        response_headers_message(**{":status": "200", "content_type": "text/event-stream"})
    )
    monkeypatch.setattr(ResponseTap, "feed", raise_bug)
    chunk = ext_proc.ProcessingRequest(response_body=ext_proc.HttpBody(body=b"data: {}\n\n"))
    with pytest.raises(Bug):
        await exchange.answer(chunk)


async def test_a_body_in_parts_is_refused_not_judged_in_part(front: Front) -> None:
    """Envoy set to stream request bodies (not BUFFERED): the gate never judges a part."""
    exchange = Exchange(front)
    await exchange.answer(headers_message("POST", "/v1/responses"))
    whole = compact(clean_body())
    answered = await exchange.answer(body_message(whole, end_of_stream=False))
    assert described(answered) == ("answer", 500, "gate_misconfigured")


@pytest.mark.parametrize(
    ("headers", "outcome"),
    [
        pytest.param({"x-gate": "soft"}, "continue", id="header-route-strips"),
        pytest.param({}, "answer", id="default-route-blocks"),
    ],
)
async def test_a_route_s_gate_settings_apply_behind_envoy(
    tmp_path: Path, headers: dict[str, str], outcome: str
) -> None:
    """Which upstream a request takes is Envoy's; the gate settings of the route it matches
    are the processor's, from the same route table as `serve`."""
    config = parse_config(
        {
            "audit": {"path": str(tmp_path / "audit.jsonl")},
            "upstreams": {"a": {"url": "http://127.0.0.1:9"}},
            "routes": [
                {
                    "header": {"name": "x-gate", "value": "soft"},
                    "upstream": "a",
                    "gate": {"action": "strip"},
                },
                {"upstream": "a"},
            ],
        }
    )
    async with open_front(config) as opened:
        exchange = Exchange(opened)
        await exchange.answer(headers_message("POST", "/v1/responses", headers))
        answered = described(await exchange.answer(body_message(compact(failing_body()))))
    assert answered[0] == outcome
    if outcome == "continue":
        stripped = answered[3]
        assert b"call_1" not in stripped  # the pair goes, with the length it leaves
        assert answered[1]["content-length"] == str(len(stripped))
    else:
        assert answered[1:] == (400, "replay_rejected")
