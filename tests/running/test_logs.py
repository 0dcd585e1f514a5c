"""The log's two formats: a record in, the line written out."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
from typing import Any

import pytest

from proxy.running.logs import JsonFormatter, TextFormatter, log_handler
from proxy.server.access import CURRENT_REQUEST_ID

ID = "req_0123456789abcdef0123456789abcdef"


def record(
    message: str,
    *args: Any,
    request_id: str | None = None,
    access: dict[str, Any] | None = None,
    level: int = logging.INFO,
    name: str = "replay_proxy",
    exc_info: Any = None,
) -> logging.LogRecord:
    made = logging.LogRecord(name, level, __file__, 1, message, args, exc_info)
    made.created = 1_780_000_000.25  # 2026-05-28T20:26:40.250Z
    made.process = 42
    made.request_id = request_id
    if access is not None:
        made.access = access
    return made


def failure() -> Any:
    try:
        raise ValueError("boom")
    except ValueError:
        return sys.exc_info()


@pytest.mark.parametrize(
    ("made", "expected"),
    [
        pytest.param(record("listening on %s", "x"), "listening on x", id="no-request"),
        pytest.param(
            record("upstream failed", request_id=ID), f"{ID} upstream failed", id="id-added"
        ),
        pytest.param(
            record("%s upstream failed", ID, request_id=ID),
            f"{ID} upstream failed",
            id="id-already-first",
        ),
        pytest.param(
            record("req_frame answered a frame of WebSocket %s", ID, request_id=ID),
            f"req_frame answered a frame of WebSocket {ID}",
            id="id-named-in-the-message",
        ),
        pytest.param(
            record(
                "GET /v1/models 200 forward",
                request_id=ID,
                name="replay_proxy.access",
                access={"route": "passthrough", "status": 200, "upstream_ms": 1.5},
            ),
            f"{ID} GET /v1/models 200 forward route=passthrough status=200 upstream_ms=1.5",
            id="access-fields",
        ),
        pytest.param(
            record("GET / 200 -", access={"path": "/a b\n", "tenant": 'x"y', "route": ""}),
            'GET / 200 - path="/a b\\n" tenant="x\\"y" route=""',
            id="fields-that-are-not-one-word-are-quoted",
        ),
    ],
)
def test_text_line(made: logging.LogRecord, expected: str) -> None:
    line = TextFormatter().format(made)
    head, _, message = line.partition(": ")
    assert re.fullmatch(r"\S+ \S+ INFO replay_proxy(\.access)?\[42\]", head), head
    assert message == expected


@pytest.mark.parametrize(
    ("made", "expected"),
    [
        pytest.param(
            record("listening on %s", "x"),
            {"level": "INFO", "logger": "replay_proxy", "pid": 42, "message": "listening on x"},
            id="no-request",
        ),
        pytest.param(
            record("%s cut", ID, request_id=ID, level=logging.WARNING),
            {
                "level": "WARNING",
                "logger": "replay_proxy",
                "pid": 42,
                "message": f"{ID} cut",
                "request_id": ID,
            },
            id="request",
        ),
        pytest.param(
            record(
                "GET /-/healthy 200 admin",
                request_id=ID,
                name="replay_proxy.access",
                access={"route": "admin", "status": 200, "message": "not over the message"},
            ),
            {
                "level": "INFO",
                "logger": "replay_proxy.access",
                "pid": 42,
                "message": "GET /-/healthy 200 admin",
                "request_id": ID,
                "route": "admin",
                "status": 200,
            },
            id="access-fields-beside-the-head",
        ),
    ],
)
def test_json_line(made: logging.LogRecord, expected: dict[str, Any]) -> None:
    line = json.loads(JsonFormatter().format(made))
    assert line.pop("ts") == "2026-05-28T20:26:40.250Z"
    assert line == expected


def test_json_line_carries_the_traceback() -> None:
    line = json.loads(JsonFormatter().format(record("bug", exc_info=failure())))
    assert line["exc"].startswith("Traceback")
    assert line["exc"].endswith("ValueError: boom")


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_handler_stamps_the_request_in_progress(log_format: str) -> None:
    """A record written while a request is handled carries its id, whoever writes it."""
    stream = io.StringIO()
    handler = log_handler(log_format, stream)
    token = CURRENT_REQUEST_ID.set(ID)
    try:
        handler.handle(logging.LogRecord("redis", logging.WARNING, __file__, 1, "slow", (), None))
    finally:
        CURRENT_REQUEST_ID.reset(token)
    handler.handle(logging.LogRecord("redis", logging.WARNING, __file__, 1, "later", (), None))
    during, after = stream.getvalue().splitlines()
    if log_format == "json":
        assert json.loads(during)["request_id"] == ID
        assert "request_id" not in json.loads(after)
    else:
        assert during.endswith(f": {ID} slow")
        assert after.endswith(": later")
