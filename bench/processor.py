"""The External Processor driven in-process, without gRPC: the four ext_proc messages Envoy
sends for one request (headers, body, answer headers, answer body), answered by
`proxy.extproc.exchange` with the admission pipeline and the ledger, and the CPU that takes."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from stub_upstream import JSON_ANSWER, RESP_ID
from workload import GATE_CONFIG, HEADERS, PATH, Body, bodies

from proxy.extproc.exchange import ExtprocStream as Exchange
from proxy.extproc.service import open_front
from proxy.running.config_file import parse_config

WARM = 200
MEASURED = 2000


def _headers(pairs: dict[str, str]) -> Any:
    return base_pb2.HeaderMap(
        headers=[
            base_pb2.HeaderValue(key=k.lower(), raw_value=v.encode()) for k, v in pairs.items()
        ]
    )


def messages(body: Body, serial: int) -> list[Any]:
    """What Envoy sends for one request of `body` answered with the stub's JSON answer."""
    request = {":method": "POST", ":path": PATH, ":authority": "127.0.0.1", **HEADERS}
    request["content-length"] = str(len(body.data))
    answer = JSON_ANSWER.replace(RESP_ID.encode(), b"resp_%016x" % serial)
    answered = {":status": "200", "content-type": "application/json"}
    answered["content-length"] = str(len(answer))
    return [
        ext_proc.ProcessingRequest(request_headers=ext_proc.HttpHeaders(headers=_headers(request))),
        ext_proc.ProcessingRequest(
            request_body=ext_proc.HttpBody(body=body.data, end_of_stream=True)
        ),
        ext_proc.ProcessingRequest(
            response_headers=ext_proc.HttpHeaders(headers=_headers(answered))
        ),
        ext_proc.ProcessingRequest(
            response_body=ext_proc.HttpBody(body=answer, end_of_stream=True)
        ),
    ]


async def cost(body: Body, directory: Path) -> float:
    """CPU µs per request: the mean over MEASURED requests, after WARM ones (schemas compiled)."""
    config = parse_config({**GATE_CONFIG, "audit": {"path": str(directory / "audit.jsonl")}})
    async with open_front(config) as front:

        async def one(sent: list[Any]) -> None:
            exchange = Exchange(front)
            for message in sent:
                await exchange.answer(message)

        for serial in range(WARM):
            await one(messages(body, serial))
        # Built before the timer starts, as Envoy builds them: only the processor's work is timed.
        stream = [messages(body, serial) for serial in range(WARM, WARM + MEASURED)]
        started = time.process_time()
        for sent in stream:
            await one(sent)
        return (time.process_time() - started) / MEASURED * 1e6


def costs(names: tuple[str, ...]) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="replay-extproc-") as tmp:
        return {b.name: asyncio.run(cost(b, Path(tmp))) for b in bodies() if b.name in names}
