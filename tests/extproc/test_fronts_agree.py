"""Every front answers alike: one table of requests through `serve` over HTTP, over a WebSocket
(as `response.create` frames, where a row applies) and through Envoy + `extproc`.

Each front must give the same answer, send the same body upstream, write the same audit records
and add the same metric samples (requests by outcome, findings, emitted calls, ledger writes) as
`serve` over HTTP does. What differs by the front's wire alone is normalised here, and said where.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.builders import (
    JSON_HEADERS,
    at,
    clean_body,
    failing_body,
    odd_bytes,
    request_body,
    sales_call,
    sales_output,
)
from tests.extproc.conftest import MiB, routed
from tests.extproc.fronts import (
    BAD_CALL,
    COUNTED,
    OWN_FIELDS,
    Emitting,
    Front,
    Sample,
    Seen,
    counted_since,
    counts,
    envoy_scrape,
    seen,
)
from tests.fixture_types import ProxyFactory
from tests.server.checks import scrape
from tests.server.test_chat_completions import TOOLS, USER, calls, entry, tool
from tests.server.test_websocket import turn_of
from tests.servers.recording import RecordingUpstream

# The families compared: door 2's calls and the ledger's writes (as tests/extproc/test_envoy.py
# compares them), and the requests by outcome and the findings, which every front counts too.
FAMILIES = (*COUNTED, "replay_proxy_requests_total", "replay_proxy_findings_total")
CHAT = "/v1/chat/completions"
# How a WebSocket frame carries a body: its members after the frame's `type`.
FRAME_HEAD = b'{"type":"response.create",'


def framed(data: bytes) -> bytes:
    """The `response.create` frame of an HTTP body (an object: `{` opens it)."""
    assert data.startswith(b"{")
    return FRAME_HEAD + data.removeprefix(b"{")


def unframed(frame: bytes) -> bytes:
    """The body a forwarded frame carries: the frame without its `type`, byte for byte. A
    frame admission rewrote is written compactly, its `type` still first."""
    assert frame.startswith(FRAME_HEAD), frame[:60]
    return b"{" + frame.removeprefix(FRAME_HEAD)


@dataclass(frozen=True)
class Row:
    """One request of the table, and what the fronts make of it on `serve` over HTTP."""

    target: str
    headers: dict[str, str]
    data: bytes
    status: int
    said: str | None  # the error's `code`, or the `x-replay-gate` of a forwarded request
    # Its `response.create` frame, or why the row does not apply to a WebSocket.
    frame: bytes | NotOnWebSocket | None = None

    def frame_of(self) -> bytes | NotOnWebSocket:
        return framed(self.data) if self.frame is None else self.frame


@dataclass(frozen=True)
class NotOnWebSocket:
    """Why a row has no WebSocket counterpart."""

    why: str


def typed(call_type: str) -> dict[str, Any]:
    return sales_call("call_1") | {"type": call_type}


ROWS = {
    "clean": Row("/v1/responses", JSON_HEADERS, odd_bytes(clean_body()), 200, None),
    "blocked": Row(
        "/v1/responses", JSON_HEADERS, odd_bytes(failing_body()), 400, "replay_rejected"
    ),
    "stripped": Row(
        "/v1/responses",
        JSON_HEADERS,
        odd_bytes(request_body(sales_call("call_1", status="in_progress"), sales_output("call_1"))),
        200,
        "stripped=1",
    ),
    "rewritten": Row(
        "/v1/responses",
        JSON_HEADERS,
        odd_bytes(request_body(sales_call("call_1", arguments="{bad"), sales_output("call_1"))),
        200,
        "rewritten=1",
    ),
    "logged": Row(
        "/v1/responses",
        JSON_HEADERS,
        odd_bytes(request_body(typed("acme:function_call"), sales_output("call_1"))),
        200,
        "logged=1",
    ),
    # Under a route's `path_prefix`: judged under that route (upstream `acme`).
    "prefixed-blocked": Row(
        "/acme/v1/responses", JSON_HEADERS, odd_bytes(failing_body()), 400, "replay_rejected"
    ),
    "unreadable-duplicate-keys": Row(
        "/v1/responses",
        JSON_HEADERS,
        b'{"model":"m","input":[],"input":"hi"}',
        400,
        "invalid_json",
    ),
    "unreadable-not-an-object": Row(
        "/v1/responses",
        JSON_HEADERS,
        b"[1]",
        400,
        "invalid_body",
        frame=b"[1]",
    ),
    "unreadable-input-a-number": Row(
        "/v1/responses",
        JSON_HEADERS,
        b'{"input":5}',
        400,
        "invalid_input",
    ),
    "unreadable-not-json": Row(
        "/v1/responses",
        JSON_HEADERS,
        b"{not json",
        400,
        "invalid_json",
        frame=b"{not json",
    ),
    "unreadable-gzip-truncated": Row(
        "/v1/responses",
        JSON_HEADERS | {"Content-Encoding": "gzip"},
        gzip.compress(odd_bytes(clean_body()))[:-6],
        400,
        "invalid_content_encoding",
        frame=NotOnWebSocket("a frame has no content coding"),
    ),
    "unreadable-text-plain": Row(
        "/v1/responses",
        {"Content-Type": "text/plain"},
        odd_bytes(clean_body()),
        415,
        "unsupported_media_type",
        frame=NotOnWebSocket("a frame has no content type"),
    ),
    "unreadable-oversized": Row(
        "/v1/responses",
        JSON_HEADERS,
        b'{"input":"' + b"a" * MiB + b'"}',
        413,
        "body_too_large",
        frame=NotOnWebSocket(
            "a frame over limits.max_body_bytes is refused by the socket itself (close 1009, "
            "the socket's max_msg_size): there is no answer to compare"
        ),
    ),
    "refused-target": Row(
        "/v1/responses%zz",
        JSON_HEADERS,
        odd_bytes(clean_body()),
        400,
        "invalid_request_target",
        frame=NotOnWebSocket(
            "the target is the upgrade's, refused before any frame: "
            "tests/server/test_targets_http.py::test_a_websocket_upgrade_is_refused_like_any_request"
        ),
    ),
    # Door 2: the upstream answers with a call that fails its schema; relayed, counted, audited.
    "emits-failing-call": Row(
        "/v1/responses",
        JSON_HEADERS | BAD_CALL,
        odd_bytes(clean_body()),
        200,
        None,
    ),
    "emits-failing-call-sse": Row(
        "/v1/responses",
        JSON_HEADERS | BAD_CALL,
        odd_bytes(clean_body(stream=True)),
        200,
        None,
        frame=NotOnWebSocket("a WebSocket turn is answered with events whatever `stream` says"),
    ),
}


NO_CHAT_SOCKET = NotOnWebSocket(
    "Chat Completions has no WebSocket mode: its upgrade is refused, "
    "tests/server/test_targets_http.py::test_a_websocket_upgrade_is_refused_like_any_request"
)


def chat_row(
    messages: list[Any], status: int, said: str | None, *, target: str = CHAT, **more: Any
) -> Row:
    body = {"model": "m", "messages": messages, "tools": TOOLS} | more
    return Row(target, JSON_HEADERS, odd_bytes(body), status, said, frame=NO_CHAT_SOCKET)


def chat_pair(**changed: Any) -> list[Any]:
    return [USER, calls(entry("c1", **changed)), tool("c1")]


# The Chat path, through the same fronts: gated, acted on and door-2 checked alike.
ROWS |= {
    "chat-clean": chat_row(chat_pair(), 200, None),
    "chat-unversioned-clean": chat_row(chat_pair(), 200, None, target="/chat/completions"),
    "chat-blocked": chat_row(
        [USER, calls(entry("c1", "mars")), tool("c1")], 400, "replay_rejected"
    ),
    "chat-rewritten": chat_row(chat_pair(function={"arguments": "{bad"}), 200, "rewritten=1"),
    "chat-logged": chat_row(chat_pair(type="acme:function"), 200, "logged=1"),
    "chat-prefixed-blocked": chat_row(
        [USER, calls(entry("c1", "mars")), tool("c1")],
        400,
        "replay_rejected",
        target="/acme/v1/chat/completions",
    ),
}
CHAT_EMITTING = {
    "chat-emits-failing-call": chat_row([USER], 200, None),
    "chat-emits-failing-call-sse": chat_row([USER], 200, None, stream=True),
}
ROWS |= {name: replace(row, headers=row.headers | BAD_CALL) for name, row in CHAT_EMITTING.items()}


def cases(front: str) -> list[Any]:
    """The rows that apply to `front`: every row, but those a WebSocket has no frame for."""
    return [
        pytest.param(row, id=name)
        for name, row in ROWS.items()
        if front != "websocket" or not isinstance(row.frame_of(), NotOnWebSocket)
    ]


def check_row(by_http: Seen, row: Row) -> None:
    """`serve` over HTTP answered the row as the table says (the reference the others meet)."""
    assert by_http.status == row.status
    if row.status != 200:
        assert by_http.answer["error"]["code"] == row.said
        assert by_http.upstream == []
    else:
        assert by_http.headers["x-replay-gate"] == row.said
        assert len(by_http.upstream) == 1


async def served_over_http(
    client: aiohttp.ClientSession, start_routed: ProxyFactory, upstream: str, audit: Path
) -> Front:
    served = await start_routed(**routed(upstream))

    async def read() -> str:
        return await scrape(client, served)

    return Front(served, audit, "http", read)


@pytest.mark.parametrize("row", cases("envoy"))
async def test_envoy_and_extproc_answer_as_serve_over_http(
    recording_upstream: RecordingUpstream,
    emitting: Emitting,
    start_routed: ProxyFactory,
    behind_envoy: Callable[..., Any],
    tmp_path: Path,
    row: Row,
) -> None:
    envoy = await behind_envoy(recording_upstream.url)
    async with aiohttp.ClientSession(auto_decompress=False) as client:
        http = await served_over_http(
            client, start_routed, recording_upstream.url, tmp_path / "audit.jsonl"
        )
        extproc = Front(envoy.url, envoy.audit, "extproc", envoy_scrape(envoy.processor))
        by_http, by_envoy = [
            await seen(
                client, front, recording_upstream, row.target, row.data, row.headers, FAMILIES
            )
            for front in (http, extproc)
        ]

    check_row(by_http, row)
    assert by_envoy == by_http


@pytest.mark.parametrize("row", cases("websocket"))
async def test_a_websocket_frame_is_answered_as_its_http_request(
    recording_upstream: RecordingUpstream,
    emitting: Emitting,
    start_routed: ProxyFactory,
    tmp_path: Path,
    row: Row,
) -> None:
    frame = row.frame_of()
    assert isinstance(frame, bytes)
    async with aiohttp.ClientSession(auto_decompress=False) as client:
        http = await served_over_http(
            client, start_routed, recording_upstream.url, tmp_path / "audit.jsonl"
        )
        by_http = await seen(
            client, http, recording_upstream, row.target, row.data, row.headers, FAMILIES
        )
        websocket = replace(http, transport="websocket")
        by_websocket = await seen_over_websocket(client, websocket, recording_upstream, row, frame)

    check_row(by_http, row)
    assert by_websocket == as_over_websocket(by_http, row, frame)


async def seen_over_websocket(
    client: aiohttp.ClientSession,
    front: Front,
    upstream: RecordingUpstream,
    row: Row,
    frame: bytes,
) -> Seen:
    """What `front` did with `frame` on a WebSocket opened at the row's target (with its
    headers, but those of a body: a frame has none), read as `seen` reads a request."""
    upstream.frames.clear()
    emitting = upstream.handler
    assert isinstance(emitting, Emitting)
    calls = emitting.calls
    before = counts(await front.scrape(), FAMILIES)
    written = len(audit_lines(front.audit))
    headers = {k: v for k, v in row.headers.items() if k.lower() != "content-type"}
    async with client.ws_connect(at(front.url, row.target), headers=headers) as ws:
        events = await turn_of(ws, frame.decode())
    last = events[-1]
    if last["type"] == "error":
        status, answer = last["status"], {"error": last["error"]}
        answer["error"].pop("request_id", None)
    else:
        status, answer = 200, last["response"]
    grown = await counted_since(front, before, emitting.calls - calls, FAMILIES)
    records = list(map(json.loads, audit_lines(front.audit)[written:]))
    assert all(r["transport"] == "websocket" for r in records)
    audited = [{k: v for k, v in r.items() if k not in OWN_FIELDS} for r in records]
    sent: list[tuple[str, bytes, str | None, str | None]] = [
        (FRAMED, unframed(f.encode()), None, None) for f in upstream.frames
    ]
    return Seen(status, answer, {}, sent, audited, grown)


# A frame has no target, coding or length of its own: only its body is compared upstream.
FRAMED = "(a frame)"


def as_over_websocket(by_http: Seen, row: Row, frame: bytes) -> Seen:
    """What the WebSocket front should do with `frame`, given what `serve` did with the row
    over HTTP. Normalised, each for its wire:

    - no answer headers (`x-replay-gate`, content type and length): events carry none;
    - upstream, the frame's body only (see `unframed`): no target, coding or length;
    - the audit record's `body_sha256` is of the body as received, and a frame's is the body
      with its `type`: it is the frame's hash (`request_id` and `transport` are left out for
      every front, OWN_FIELDS);
    - a frame's requests are counted under route `websocket`, where HTTP's are under their
      path's (`responses`, `responses_compact`).
    """
    sha = hashlib.sha256(row.data).hexdigest()
    audited = [
        r | {"body_sha256": hashlib.sha256(frame).hexdigest()} if r["body_sha256"] == sha else r
        for r in by_http.audited
    ]
    return replace(
        by_http,
        headers={},
        upstream=[(FRAMED, body, None, None) for _, body, _, _ in by_http.upstream],
        audited=audited,
        counted={relabelled(sample): n for sample, n in by_http.counted.items()},
    )


def relabelled(sample: Sample) -> Sample:
    name, labels = sample
    if name != "replay_proxy_requests_total":
        return sample
    return name, tuple(
        (k, "websocket" if k == "route" and v.startswith("responses") else v) for k, v in labels
    )


def audit_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
