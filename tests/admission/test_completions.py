"""A Chat completion's tool calls as the ledger and door 2 read them: a table of answers and
streams, each with the calls (and their places) it holds."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.admission.completions import StreamedCompletion, completion_of


def call(call_id: str, arguments: str, status: str = "completed", name: str = "f") -> Any:
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def entry(call_id: str, arguments: str, kind: str = "function") -> Any:
    return {"id": call_id, "type": kind, kind: {"name": "f", "arguments": arguments}}


def answer(*choices: tuple[list[Any], Any], kind: Any = "chat.completion") -> Any:
    listed = [
        {"index": i, "message": {"role": "assistant", "tool_calls": c}, "finish_reason": f}
        for i, (c, f) in enumerate(choices)
    ]
    return {"id": "chatcmpl-1", "object": kind, "model": "m", "choices": listed}


@pytest.mark.parametrize(
    ("given", "output", "places"),
    [
        pytest.param(
            answer(([entry("a", "{}"), entry("b", "[]")], "tool_calls")),
            [call("a", "{}"), call("b", "[]")],
            ["choices[0].message.tool_calls[0]", "choices[0].message.tool_calls[1]"],
            id="two-calls",
        ),
        pytest.param(
            answer(([entry("a", "{")], "length")),
            [call("a", "{", "incomplete")],
            ["choices[0].message.tool_calls[0]"],
            id="cut-by-length",
        ),
        pytest.param(
            answer(([entry("a", "{}")], "content_filter"), ([entry("b", "{}")], "stop")),
            [call("a", "{}", "incomplete"), call("b", "{}")],
            ["choices[0].message.tool_calls[0]", "choices[1].message.tool_calls[0]"],
            id="n-choices",
        ),
        pytest.param(
            answer(([entry("a", "x", "custom"), entry("b", "{}")], "tool_calls")),
            [call("b", "{}")],
            ["choices[0].message.tool_calls[1]"],
            id="a-custom-call-is-no-function-call",
        ),
        pytest.param(answer(([], "stop")), None, None, id="no-calls"),
        pytest.param(answer(([entry("a", "{}")], "stop"), kind="response"), None, None, id="other"),
        pytest.param({"choices": "x"}, None, None, id="choices-not-a-list"),
    ],
)
def test_a_json_answer(given: Any, output: Any, places: Any) -> None:
    found = completion_of(given)
    if output is None:
        assert found is None
        return
    assert found is not None
    assert found.response == {"id": "chatcmpl-1", "model": "m", "output": output}
    assert list(found.places) == places
    assert found.recorded_as("chat/req_1")["id"] == "chat/req_1"


def chunk(*fragments: Any, finish: Any = None, choice: int = 0) -> Any:
    delta = {"tool_calls": list(fragments)} if fragments else {"content": "hi"}
    return {
        "id": "chatcmpl-s",
        "model": "m",
        "choices": [{"index": choice, "delta": delta, "finish_reason": finish}],
    }


def head(index: int, call_id: str) -> Any:
    return {"index": index, "id": call_id, "type": "function", "function": {"name": "f"}}


def piece(index: int, arguments: str) -> Any:
    return {"index": index, "function": {"arguments": arguments}}


@pytest.mark.parametrize(
    ("chunks", "output"),
    [
        pytest.param(
            [
                chunk(head(0, "a")),
                chunk(piece(0, '{"x"')),
                chunk(piece(0, ":1}"), finish="tool_calls"),
            ],
            [call("a", '{"x":1}')],
            id="pieces-of-one-call",
        ),
        pytest.param(
            [
                chunk(head(0, "a"), head(1, "b")),
                chunk(piece(1, "[")),
                chunk(piece(0, "{}")),
                chunk(piece(1, "]")),
                chunk(finish="tool_calls"),
            ],
            [call("a", "{}"), call("b", "[]")],
            id="interleaved-by-index",
        ),
        pytest.param(
            [chunk(head(0, "a")), chunk(piece(0, '{"x'), finish="length")],
            [call("a", '{"x', "incomplete")],
            id="cut-by-length",
        ),
        pytest.param(
            [chunk(head(0, "a")), chunk(piece(0, "{}"))],
            [call("a", "{}", "incomplete")],
            id="never-ended",
        ),
        pytest.param(
            [chunk(head(0, "a"), choice=1), chunk(head(0, "b")), chunk(finish="stop", choice=1)],
            [call("b", "", "incomplete"), call("a", "", "completed")],
            id="choices-in-order",
        ),
        pytest.param([chunk(), chunk(finish="stop")], None, id="text-only"),
    ],
)
def test_a_stream(chunks: list[Any], output: Any) -> None:
    stream = StreamedCompletion()
    for each in chunks:
        stream.add(each)
    found = stream.completion()
    if output is None:
        assert found is None
        return
    assert found is not None
    # A call's name comes in its first fragment; a head without arguments has none yet.
    for expected in output:
        if expected["arguments"] == "":
            del expected["arguments"]
    assert found.response["output"] == output
