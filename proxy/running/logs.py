"""The operational log on stderr: text for people or JSON for a shipper, every line of a
request carrying its id."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

from proxy.server.access import RequestIdFilter

# What every line says before its message (text), or its first keys (JSON).
_TEXT_HEAD = "%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"


class TextFormatter(logging.Formatter):
    """One line: time, level, logger and process, then the message, which begins with the
    request's id (added when the message does not name it already); an access line's fields
    follow as `key=value`."""

    def __init__(self) -> None:
        super().__init__(_TEXT_HEAD)

    def formatMessage(self, record: logging.LogRecord) -> str:  # logging's name
        request_id = getattr(record, "request_id", None)
        if request_id and request_id not in record.message:
            record.message = f"{request_id} {record.message}"
        line = super().formatMessage(record)
        fields: dict[str, Any] = getattr(record, "access", None) or {}
        return " ".join([line, *(f"{name}={_word(value)}" for name, value in fields.items())])


def _word(value: Any) -> str:
    """A value as one word: a string with a space, a quote or a control character quoted."""
    text = str(value)
    if text and text.isprintable() and not any(c in text for c in ' "='):
        return text
    return json.dumps(text)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: `ts` (UTC, ISO 8601), `level`, `logger`, `pid`, `message`,
    `request_id` when the line is about a request, an access line's fields, and `exc` (the
    traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id:
            line["request_id"] = request_id
        fields: dict[str, Any] = getattr(record, "access", None) or {}
        line.update((name, value) for name, value in fields.items() if name not in line)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def _iso(created: float) -> str:
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


FORMATTERS: dict[str, type[logging.Formatter]] = {"text": TextFormatter, "json": JsonFormatter}


def log_handler(log_format: str, stream: TextIO | None = None) -> logging.Handler:
    """A handler writing to `stream` (stderr) in `log_format`, every record with its request."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(FORMATTERS[log_format]())
    handler.addFilter(RequestIdFilter())
    return handler


def configure_logging(level: str, log_format: str) -> None:
    """The process's log: `level` and above to stderr in `log_format` (once, at start)."""
    root = logging.getLogger()
    root.addHandler(log_handler(log_format))
    root.setLevel(level.upper())
