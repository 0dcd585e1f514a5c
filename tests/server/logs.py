"""The proxy's log as the command line configures it, captured for a test: JSON lines."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from proxy.running.logs import log_handler


class Captured:
    """The log lines written so far, as `configure_logging` would write them."""

    def __init__(self, stream: io.StringIO) -> None:
        self.stream = stream

    def text(self) -> str:
        return self.stream.getvalue()

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.text().splitlines()]

    def access(self) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line["logger"] == "replay_proxy.access"]


@contextmanager
def captured_log(log_format: str = "json", level: int = logging.DEBUG) -> Iterator[Captured]:
    """Every record of the proxy's loggers (and aiohttp's) at `level` and above, formatted."""
    stream = io.StringIO()
    handler = log_handler(log_format, stream)
    root = logging.getLogger()
    loggers = [logging.getLogger(name) for name in ("replay_proxy", "aiohttp")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
    root.addHandler(handler)
    try:
        yield Captured(stream)
    finally:
        root.removeHandler(handler)
        for logger, old in zip(loggers, levels, strict=True):
            logger.setLevel(old)
