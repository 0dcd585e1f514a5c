"""The tap records the response an answer completes, however the answer is cut into chunks."""

from __future__ import annotations

import gzip
import json
import re
import zlib
from typing import Any

import brotli
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.admission.tap import ResponseTap, event_data
from proxy.server.headers import readable_accept_encoding
from proxy.state.ledger import Ledger
from proxy.state.stores import MemoryStore

CALL = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "call_1",
    "name": "get_latest_sales_report",
    "arguments": '{"region": "emea"}',
    "status": "completed",
}
MESSAGE = {"type": "message", "id": "msg_1", "role": "assistant", "content": []}


def sse(events: list[dict[str, Any]], newline: str) -> bytes:
    blocks = [f"event: {e['type']}{newline}data: {json.dumps(e)}{newline}" for e in events]
    return newline.join(blocks).encode() + newline.encode()


def stream(*, output_in_completed: bool, newline: str) -> bytes:
    response = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
    done = {**response, "status": "completed", "output": [MESSAGE, CALL]}
    return sse(
        [
            {"type": "response.created", "response": response},
            {"type": "response.output_text.delta", "delta": "response.completed is text"},
            {"type": "response.output_item.done", "output_index": 0, "item": MESSAGE},
            {"type": "response.output_item.done", "output_index": 1, "item": CALL},
            {
                "type": "response.completed",
                "response": done if output_in_completed else {**done, "output": []},
            },
        ],
        newline,
    )


async def tapped(
    answer: bytes, chunk: int, content_type: str, coding: str = "", length: int | None = None
) -> MemoryStore:
    """What the tap recorded of `answer` fed in chunks of `chunk` bytes (0: an event a chunk,
    each ending with its blank line, as most servers write them)."""
    store = MemoryStore(max_responses=10, ttl_s=60)
    ledger = Ledger(store, max_chain=8, fail_open=False)
    tap = ResponseTap(ledger, "t", content_type, length, 1 << 20, content_encoding=coding)
    if chunk:
        chunks = [answer[start : start + chunk] for start in range(0, len(answer), chunk)]
    else:
        chunks = [part for part in re.split(rb"(?<=\n\n)|(?<=\r\n\r\n)", answer) if part]
    for part in chunks:
        if (waiting := tap.feed(part)) is not None:
            await waiting
    await tap.finish()
    return store


@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize(
    "chunk", [0, 1, 7, 64, 1 << 20], ids=lambda n: f"chunks-of-{n}" if n else "an-event-a-chunk"
)
@pytest.mark.parametrize("output_in_completed", [True, False], ids=["whole", "from-items"])
async def test_a_stream_is_recorded_once_with_its_calls(
    newline: str, chunk: int, output_in_completed: bool
) -> None:
    answer = stream(output_in_completed=output_in_completed, newline=newline)
    store = await tapped(answer, chunk, "text/event-stream; charset=utf-8")
    assert len(store) == 1
    (recording,) = await store.chain("t", "resp_1", 8)
    # A message is kept by its id only (a reference may name it); the call with what the
    # gate needs of it.
    assert recording.items == ({"type": "message", "id": "msg_1"}, CALL)


@pytest.mark.parametrize("chunk", [1, 100, 1 << 20], ids=lambda n: f"chunks-of-{n}")
async def test_a_json_answer_is_recorded(chunk: int) -> None:
    answer = json.dumps({"id": "resp_1", "object": "response", "output": [CALL]}).encode()
    store = await tapped(answer, chunk, "application/json")
    (recording,) = await store.chain("t", "resp_1", 8)
    assert recording.items == (CALL,)


async def test_a_stream_that_never_completes_records_nothing() -> None:
    answer = stream(output_in_completed=True, newline="\n")
    cut = answer[: answer.index(b"event: response.completed")]
    store = await tapped(cut, 1 << 20, "text/event-stream")
    assert len(store) == 0


def encoded(data: bytes, coding: str) -> bytes:
    if coding == "gzip":
        return gzip.compress(data)
    if coding == "deflate":
        return zlib.compress(data)
    assert coding == "br"
    return bytes(brotli.compress(data))


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br"])
@pytest.mark.parametrize("chunk", [1, 50, 1 << 20], ids=lambda n: f"chunks-of-{n}")
@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
async def test_a_compressed_answer_is_read_decoded(coding: str, chunk: int, sse: bool) -> None:
    if sse:
        plain, content_type = stream(output_in_completed=False, newline="\n"), "text/event-stream"
    else:
        plain = json.dumps({"id": "resp_1", "object": "response", "output": [CALL]}).encode()
        content_type = "application/json"
    body = encoded(plain, coding)
    store = await tapped(body, chunk, content_type, coding, len(body))
    (recording,) = await store.chain("t", "resp_1", 8)
    assert recording.items[-1:] == (CALL,)


@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
async def test_an_answer_that_decodes_past_the_limit_is_not_recorded(sse: bool) -> None:
    plain = json.dumps({"id": "resp_1", "object": "response", "output": [CALL]}).encode()
    bomb = plain[:-1] + b', "pad": "' + b"0" * (2 << 20) + b'"}'
    content_type = "text/event-stream" if sse else "application/json"
    store = await tapped(gzip.compress(bomb), 4096, content_type, "gzip")
    assert len(store) == 0


async def test_an_answer_in_a_coding_the_tap_cannot_read_is_relayed_unrecorded() -> None:
    answer = stream(output_in_completed=True, newline="\n")
    store = await tapped(answer, 64, "text/event-stream", "zstd")
    assert len(store) == 0


@pytest.mark.parametrize(
    ("accept", "asked"),
    [
        pytest.param("gzip, deflate, br", "gzip, deflate, br", id="all-readable"),
        pytest.param("gzip, deflate, br, zstd", "gzip, deflate, br", id="zstd-dropped"),
        pytest.param("zstd;q=1.0, gzip;q=0.5", "gzip;q=0.5", id="weights-kept"),
        pytest.param("*", "identity", id="any"),
        pytest.param("zstd", "identity", id="none-readable"),
        pytest.param("GZIP, Identity", "GZIP, Identity", id="any-case"),
    ],
)
def test_the_upstream_is_asked_only_for_codings_the_tap_reads(accept: str, asked: str) -> None:
    assert readable_accept_encoding(accept) == asked


@pytest.mark.parametrize(
    ("block", "data"),
    [
        pytest.param(b'event: x\ndata: {"a": 1}', b'{"a": 1}', id="one-line"),
        pytest.param(b'data:{"a": 1}\nid: 7', b'{"a": 1}', id="no-space-then-a-field"),
        pytest.param(b"data: [1,\ndata: 2]", b"[1,\n2]", id="lines-joined"),
        pytest.param(b'data: {"t": "data: no"}', b'{"t": "data: no"}', id="data-in-the-json"),
        pytest.param(b'event: data: x\ndata: "y"', b'"y"', id="data-in-another-line"),
        pytest.param(b'event: x\r\ndata: "y"\r', b'"y"', id="crlf"),
        pytest.param(b"event: x\rdata: 1", b"1", id="cr"),
        pytest.param(b"event: x", b"", id="no-data"),
    ],
)
def test_an_events_data_is_read_as_the_spec_reads_it(block: bytes, data: bytes) -> None:
    assert event_data(block) == data
    assert event_data(bytearray(block)) == data


@given(
    st.lists(st.sampled_from([b"data:", b"data: ", b"event: ", b"x", b" ", b"\n", b"\r", b"{}"]))
)
def test_the_usual_events_data_is_what_its_lines_say(parts: list[bytes]) -> None:
    # The one-line shortcut decides as reading every line does (the spec's reading).
    block = b"".join(parts)
    lines = block.splitlines()
    data = [line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")]
    assert event_data(block) == b"\n".join(data)
