"""Behind a real Envoy: the processor decides as `serve` decides, from the same code.

Every case is sent to both fronts under the same config: the real `replay-proxy serve` (the
`start_routed` fixture) and a real Envoy with the real `replay-proxy extproc`; the client's
answer, what the recording upstream received, the audit records and the counts of the calls
the upstream emitted (door 2) and of the responses recorded must be the same.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.builders import (
    BOMB,
    BOMB_HEADERS,
    JSON_HEADERS,
    clean_body,
    failing_body,
    odd_bytes,
    request_body,
    sales_call,
    sales_output,
)
from tests.extproc.conftest import MiB, routed
from tests.extproc.fronts import BAD_CALL, Emitting, Front, envoy_scrape, seen
from tests.fixture_types import ProxyFactory
from tests.server.checks import scrape
from tests.servers.recording import RecordingUpstream


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
    # Under the `path_prefix` of a route (`/acme`, upstream `acme`): judged under that route,
    # and forwarded without the prefix.
    pytest.param(
        "/acme/v1/responses",
        JSON_HEADERS,
        odd_bytes(failing_body()),
        400,
        "replay_rejected",
        id="prefixed-block",
    ),
    pytest.param(
        "/ACME/V1/Responses/",
        JSON_HEADERS,
        odd_bytes(failing_body()),
        400,
        "replay_rejected",
        id="prefixed-block-path-variant",
    ),
    pytest.param(
        "/acme/v1/responses",
        JSON_HEADERS,
        odd_bytes(clean_body()),
        200,
        None,
        id="prefixed-clean-goes-up-without-it",
    ),
    # A prefix the bootstrap has no route of its own for is read by the processor all the same.
    pytest.param(
        "/team/v1/responses",
        JSON_HEADERS,
        odd_bytes(failing_body()),
        400,
        "replay_rejected",
        id="prefix-without-an-envoy-route-block",
    ),
    # Door 2: the upstream's own call fails its schema; relayed as it came, counted, audited.
    pytest.param(
        "/v1/responses",
        JSON_HEADERS | BAD_CALL,
        odd_bytes(clean_body()),
        200,
        None,
        id="emitted-bad-call-json",
    ),
    pytest.param(
        "/v1/responses",
        JSON_HEADERS | BAD_CALL,
        odd_bytes(clean_body(stream=True)),
        200,
        None,
        id="emitted-bad-call-sse",
    ),
    pytest.param(
        "/acme/v1/responses",
        JSON_HEADERS | BAD_CALL,
        odd_bytes(clean_body(stream=True)),
        200,
        None,
        id="prefixed-emitted-bad-call-sse",
    ),
]


@pytest.mark.parametrize(("target", "headers", "data", "status", "said"), CASES)
async def test_envoy_answers_as_serve_answers(
    recording_upstream: RecordingUpstream,
    emitting: Emitting,
    start_routed: ProxyFactory,
    behind_envoy: Callable[..., Any],
    tmp_path: Path,
    target: str,
    headers: dict[str, str],
    data: bytes,
    status: int,
    said: str | None,
) -> None:
    served = await start_routed(**routed(recording_upstream.url))
    envoy = await behind_envoy(recording_upstream.url)
    async with aiohttp.ClientSession(auto_decompress=False) as client:

        async def scrape_serve() -> str:
            return await scrape(client, served)

        fronts = (
            Front(served, tmp_path / "audit.jsonl", "http", scrape_serve),
            Front(envoy.url, envoy.audit, "extproc", envoy_scrape(envoy.processor)),
        )
        by_serve, by_envoy = [
            await seen(client, front, recording_upstream, target, data, headers) for front in fronts
        ]

    assert by_envoy == by_serve
    assert by_envoy.status == status
    upstream = "acme" if target.lower().startswith("/acme/") else "default"
    reasons = [[f["reason"] for f in r["findings"]] for r in by_envoy.audited]
    if status != 200:
        assert by_envoy.upstream == []  # never forwarded
        assert by_envoy.answer["error"]["code"] == said
        assert by_envoy.headers["content-type"] == "application/json"
        assert by_envoy.counted == {}
        if said == "replay_rejected":
            assert [(r["action"], r["upstream"]) for r in by_envoy.audited] == [("block", upstream)]
        return
    ((upstream_target, body, coding, length),) = by_envoy.upstream
    assert (upstream_target, coding, length) == ("/v1/responses", None, str(len(body)))
    assert by_envoy.headers["x-replay-gate"] == said
    if said is None:
        # Clean: byte for byte as the gate judged it (decoded, when it came coded).
        judged = gzip.decompress(data) if "Content-Encoding" in headers else data
        assert body == judged
    writes = {("replay_proxy_ledger_writes_total", ()): 1.0}  # the answer, recorded
    if BAD_CALL.items() <= headers.items():
        emitted = ("replay_proxy_emitted_calls_total", TOOL_FAILED)
        assert by_envoy.counted == writes | {emitted: 1.0}
        [record] = by_envoy.audited
        assert (record["event"], record["action"], record["upstream"]) == (
            "emitted_call_rejected",
            "log",
            upstream,
        )
        assert reasons == [["arguments_schema"]]
    else:
        assert by_envoy.counted == writes
        assert all(r["event"] == "replay_rejected" for r in by_envoy.audited)
        assert len(by_envoy.audited) == (said is not None)


TOOL_FAILED = (
    ("dialect", "responses"),
    ("tool", "get_latest_sales_report"),
    ("verdict", "arguments_schema"),
)


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
