"""A stub Open Responses upstream for benchmarks: a canned JSON response, or an SSE stream.

`python bench/stub_upstream.py --port P`. A POST whose body starts with `{"model":…,"stream":true`
(the benchmark bodies put `stream` first, so nothing is parsed) gets the SSE answer, its events
`x-bench-event-gap-ms` apart (default 0); any other request gets the JSON answer. With
`x-bench-call: ok` (or `bad`) the answer (JSON or SSE) also emits a `lookup_order`
function_call whose arguments pass (or fail: a `fields` value outside its enum)
the benchmark's schema.
Every answer carries a response id and a message id of its own, as a real server's would,
and a call's `order_id` differs from one answer to the next (no verdict is cached twice).
`GET /-/served` counts the requests answered so far (the benchmark's per-request CPU divides
by it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from aiohttp import web

# Placeholders of a fixed width, replaced in the encoded answer by each request's own ids.
RESP_ID = "resp_" + "0" * 16
MSG_ID = "msg_" + "0" * 16
ORDER_ID = "ORD-000000"
_TEXT = ("EMEA sales rose 4.2% week on week, ", "led by Kraków and Lyon; ", "order ORD-100001 ")
_TEXT_ALL = "".join(_TEXT) + "has shipped."
_MESSAGE: dict[str, Any] = {
    "type": "message",
    "id": MSG_ID,
    "status": "completed",
    "role": "assistant",
    "content": [{"type": "output_text", "text": _TEXT_ALL, "annotations": []}],
}
_RESPONSE: dict[str, Any] = {
    "id": RESP_ID,
    "object": "response",
    "created_at": 1777000000,
    "status": "completed",
    "model": "bench-model",
    "previous_response_id": None,
    "output": [_MESSAGE],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "usage": {
        "input_tokens": 7012,
        "input_tokens_details": {"cached_tokens": 6912},
        "output_tokens": 31,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 7043,
    },
}
JSON_ANSWER = json.dumps(_RESPONSE, separators=(",", ":")).encode()


def _event(kind: str, **fields: Any) -> bytes:
    data = json.dumps({"type": kind, **fields}, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()


_IN_PROGRESS = {**_RESPONSE, "status": "in_progress", "output": [], "usage": None}
_PART = {"type": "output_text", "text": "", "annotations": []}
SSE_EVENTS: tuple[bytes, ...] = (
    _event("response.created", sequence_number=0, response=_IN_PROGRESS),
    _event("response.in_progress", sequence_number=1, response=_IN_PROGRESS),
    _event(
        "response.output_item.added",
        sequence_number=2,
        output_index=0,
        item={**_MESSAGE, "status": "in_progress", "content": []},
    ),
    _event(
        "response.content_part.added",
        sequence_number=3,
        item_id=MSG_ID,
        output_index=0,
        content_index=0,
        part=_PART,
    ),
    *(
        _event(
            "response.output_text.delta",
            sequence_number=4 + i,
            item_id=MSG_ID,
            output_index=0,
            content_index=0,
            delta=delta,
        )
        for i, delta in enumerate(_TEXT)
    ),
    _event(
        "response.output_text.done",
        sequence_number=7,
        item_id=MSG_ID,
        output_index=0,
        content_index=0,
        text=_TEXT_ALL,
    ),
    _event(
        "response.content_part.done",
        sequence_number=8,
        item_id=MSG_ID,
        output_index=0,
        content_index=0,
        part={**_PART, "text": _TEXT_ALL},
    ),
    _event("response.output_item.done", sequence_number=9, output_index=0, item=_MESSAGE),
    _event("response.completed", sequence_number=10, response=_RESPONSE),
    b"data: [DONE]\n\n",
)


def _call(arguments: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": "fc_" + MSG_ID[4:],
        "call_id": "call_" + MSG_ID[4:],
        "name": "lookup_order",
        "arguments": arguments,
        "status": "completed",
    }


def _with_call(call: dict[str, Any]) -> tuple[bytes, ...]:
    """The SSE answer with `call` after the message: its item done, and in the completed output."""
    response = {**_RESPONSE, "output": [_MESSAGE, call]}
    *head, _, _ = SSE_EVENTS
    return (
        *head,
        _event("response.output_item.done", sequence_number=10, output_index=1, item=call),
        _event("response.completed", sequence_number=11, response=response),
        b"data: [DONE]\n\n",
    )


SSE_WITH_CALL: dict[str, tuple[bytes, ...]] = {
    "ok": _with_call(_call(f'{{"order_id":"{ORDER_ID}","fields":["status","lines"]}}')),
    "bad": _with_call(_call(f'{{"order_id":"{ORDER_ID}","fields":["status","price"]}}')),
}


JSON_WITH_CALL: dict[str, bytes] = {
    kind: json.dumps(
        {**_RESPONSE, "output": [_MESSAGE, json.loads(events[-3].split(b"data: ", 1)[1])["item"]]},
        separators=(",", ":"),
    ).encode()
    for kind, events in SSE_WITH_CALL.items()
}


SERVED = web.AppKey("served", list[int])


async def served(request: web.Request) -> web.Response:
    return web.Response(text=str(request.app[SERVED][0]))


def _with_ids(answer: bytes, serial: int) -> bytes:
    return (
        answer.replace(RESP_ID.encode(), b"resp_%016x" % serial)
        .replace(MSG_ID.encode(), b"msg_%016x" % serial)
        .replace(ORDER_ID.encode(), b"ORD-%06d" % (serial % 1_000_000))
    )


async def respond(request: web.Request) -> web.StreamResponse:
    data = await request.read()
    request.app[SERVED][0] += 1
    serial = request.app[SERVED][0]
    if b'"stream":true' not in data[:64]:
        answer = JSON_WITH_CALL.get(request.headers.get("x-bench-call", ""), JSON_ANSWER)
        return web.Response(body=_with_ids(answer, serial), content_type="application/json")
    gap_s = float(request.headers.get("x-bench-event-gap-ms", "0")) / 1000
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    events = SSE_WITH_CALL.get(request.headers.get("x-bench-call", ""), SSE_EVENTS)
    for index, event in enumerate(events):
        if index and gap_s:
            await asyncio.sleep(gap_s)
        await response.write(_with_ids(event, serial))
    await response.write_eof()
    return response


def make_app() -> web.Application:
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app[SERVED] = [0]
    app.router.add_get("/-/served", served)
    app.router.add_route("*", "/{tail:.*}", respond)
    return app


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(make_app(), host="127.0.0.1", port=args.port, access_log=None, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
