"""Behind a real Envoy: the processor decides as `serve` decides, from the same code.

Every case is sent to both fronts under the same config: the real `replay-proxy serve` (the
`start_proxy` fixture) and a real Envoy with the real `replay-proxy extproc`; the client's
answer and what the recording upstream received must be the same.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from tests.builders import (
    BOMB,
    BOMB_HEADERS,
    JSON_HEADERS,
    at,
    clean_body,
    failing_body,
    odd_bytes,
    request_body,
    sales_call,
    sales_output,
)
from tests.extproc.conftest import SECTIONS, MiB
from tests.fixture_types import ProxyFactory
from tests.servers.recording import RecordingUpstream


@dataclass(frozen=True)
class Seen:
    """What one front did with a request: the client's answer and the upstream's view."""

    status: int
    answer: Any  # the JSON answer, its request id left out (each front makes its own)
    headers: dict[str, str | None]
    upstream: list[tuple[str, bytes, str | None, str | None]]  # target, body, coding, length


# Content-Length too: Envoy drops an answer's when a processor reads its body.
ANSWER_HEADERS = ("content-type", "content-length", "x-should-retry", "x-replay-gate")


async def seen(
    client: aiohttp.ClientSession,
    base: str,
    upstream: RecordingUpstream,
    target: str,
    data: bytes,
    headers: dict[str, str],
) -> Seen:
    upstream.received.clear()
    async with client.post(at(base, target), data=io.BytesIO(data), headers=headers) as resp:
        raw = await resp.read()
        assert resp.headers["x-request-id"].startswith("req_")
        shown = {name: resp.headers.get(name) for name in ANSWER_HEADERS}
        if shown["content-type"] is not None:
            shown["content-type"] = shown["content-type"].split(";")[0]
        status = resp.status
    answer = json.loads(raw)
    if isinstance(answer.get("error"), dict):
        answer["error"].pop("request_id", None)
    received = [
        (
            r.target,
            r.body,
            r.headers.get("Content-Encoding"),
            r.headers.get("Content-Length"),
        )
        for r in upstream.received
    ]
    return Seen(status, answer, shown, received)


def typed(call_type: str) -> dict[str, Any]:
    return sales_call("call_1") | {"type": call_type}


CASES = [
    # (target, headers, body, status, code or the x-replay-gate header of a forwarded one)
    pytest.param("/v1/responses", JSON_HEADERS, odd_bytes(clean_body()), 200, None, id="clean"),
    pytest.param(
        "/v1/responses", JSON_HEADERS, odd_bytes(failing_body()), 400, "replay_rejected", id="block"
    ),
    pytest.param(
        "/V1//Responses/",
        JSON_HEADERS,
        odd_bytes(failing_body()),
        400,
        "replay_rejected",
        id="block-path-variant",
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS,
        odd_bytes(request_body(sales_call("call_1", status="in_progress"), sales_output("call_1"))),
        200,
        "stripped=1",
        id="strip",
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS,
        odd_bytes(request_body(sales_call("call_1", arguments="{bad"), sales_output("call_1"))),
        200,
        "rewritten=1",
        id="rewrite",
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS,
        odd_bytes(request_body(typed("acme:function_call"), sales_output("call_1"))),
        200,
        "logged=1",
        id="log",
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS | {"Content-Encoding": "gzip"},
        gzip.compress(odd_bytes(clean_body())),
        200,
        None,
        id="gzip-clean-goes-up-decoded",
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS | {"Content-Encoding": "gzip"},
        gzip.compress(odd_bytes(failing_body())),
        400,
        "replay_rejected",
        id="gzip-block",
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS,
        b'{"model":"m","input":[],"input":"hi"}',
        400,
        "invalid_json",
        id="duplicate-keys",
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS | {"Content-Encoding": "gzip"},
        gzip.compress(odd_bytes(clean_body()))[:-6],
        400,
        "invalid_content_encoding",
        id="gzip-truncated",
    ),
    pytest.param(
        "/v1/responses", BOMB_HEADERS, BOMB, 413, "body_too_large", id="gzip-bomb-of-10-gib"
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS,
        b'{"input":"' + b"a" * MiB + b'"}',
        413,
        "body_too_large",
        id="oversized",
    ),
    pytest.param(
        "/v1/responses",
        {"Content-Type": "text/plain"},
        odd_bytes(clean_body()),
        415,
        "unsupported_media_type",
        id="text-plain",
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS | {"Content-Encoding": "zstd"},
        b"(\xb5/\xfd",
        415,
        "unsupported_content_encoding",
        id="zstd",
    ),
    pytest.param("/v1/responses", JSON_HEADERS, b"[1]", 400, "invalid_body", id="not-an-object"),
    pytest.param(
        "/v1/responses", JSON_HEADERS, b'{"input":5}', 400, "invalid_input", id="input-a-number"
    ),
    pytest.param(
        "/v1/responses/compact",
        JSON_HEADERS,
        odd_bytes(failing_body()),
        400,
        "replay_rejected",
        id="compact-block",
    ),
]


@pytest.mark.parametrize(("target", "headers", "data", "status", "said"), CASES)
async def test_envoy_answers_as_serve_answers(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    behind_envoy: Callable[..., Any],
    target: str,
    headers: dict[str, str],
    data: bytes,
    status: int,
    said: str | None,
) -> None:
    served = await start_proxy(recording_upstream.url, **SECTIONS)
    envoy = await behind_envoy(recording_upstream.url)
    async with aiohttp.ClientSession(auto_decompress=False) as client:
        by_serve = await seen(client, served, recording_upstream, target, data, headers)
        by_envoy = await seen(client, envoy.url, recording_upstream, target, data, headers)

    assert by_envoy == by_serve
    assert by_envoy.status == status
    if status != 200:
        assert by_envoy.upstream == []  # never forwarded
        assert by_envoy.answer["error"]["code"] == said
        assert by_envoy.headers["content-type"] == "application/json"
    else:
        ((upstream_target, body, coding, length),) = by_envoy.upstream
        assert (upstream_target, coding, length) == ("/v1/responses", None, str(len(body)))
        assert by_envoy.headers["x-replay-gate"] == said
        if said is None:
            # Clean: byte for byte as the gate judged it (decoded, when it came coded).
            judged = gzip.decompress(data) if "Content-Encoding" in headers else data
            assert body == judged


async def test_blocked_through_envoy_is_audited_as_extproc(
    recording_upstream: RecordingUpstream, behind_envoy: Callable[..., Any]
) -> None:
    envoy = await behind_envoy(recording_upstream.url)
    sent = odd_bytes(failing_body())
    async with (
        aiohttp.ClientSession() as client,
        client.post(f"{envoy.url}/v1/responses", data=sent, headers=JSON_HEADERS) as resp,
    ):
        request_id = resp.headers["x-request-id"]
        answer = await resp.json()
    assert answer["error"]["request_id"] == request_id
    records = [json.loads(line) for line in envoy.audit.read_text().splitlines()]
    (record,) = [r for r in records if r["request_id"] == request_id]
    assert record["transport"] == "extproc"
    assert record["action"] == "block"
    assert record["path"] == "/v1/responses"
    assert recording_upstream.received == []


async def test_upstream_request_id_moves_aside(
    recording_upstream: RecordingUpstream, behind_envoy: Callable[..., Any]
) -> None:
    async def answer(request: Any, received: Any) -> Any:
        from aiohttp import web

        body = {"object": "response", "id": "resp_x", "output": []}
        return web.json_response(body, headers={"x-request-id": "upstream-id"})

    recording_upstream.handler = answer
    envoy = await behind_envoy(recording_upstream.url)
    async with (
        aiohttp.ClientSession() as client,
        client.post(
            f"{envoy.url}/v1/responses", data=odd_bytes(clean_body()), headers=JSON_HEADERS
        ) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["x-request-id"].startswith("req_")
        assert resp.headers["x-upstream-request-id"] == "upstream-id"
