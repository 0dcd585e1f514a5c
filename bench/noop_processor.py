"""An External Processor that does nothing: every message answered `continue`, at once.

`python bench/noop_processor.py --listen 127.0.0.1:PORT`. The Envoy benchmark runs it beside
the real processor: the CPU it takes is the floor that grpcio's asyncio server and Envoy's
ext_proc client cost per request, before any gating.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc

CONTINUE = {
    "request_headers": ext_proc.ProcessingResponse(request_headers=ext_proc.HeadersResponse()),
    "request_body": ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse()),
    "response_headers": ext_proc.ProcessingResponse(response_headers=ext_proc.HeadersResponse()),
    "response_body": ext_proc.ProcessingResponse(response_body=ext_proc.BodyResponse()),
}


class Noop(ext_proc_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    async def Process(  # the gRPC method's own name
        self, request_iterator: AsyncIterable[Any], context: Any
    ) -> AsyncIterator[Any]:
        async for message in request_iterator:
            yield CONTINUE[message.WhichOneof("request")]


async def serve(listen: str) -> None:
    server = grpc.aio.server()
    ext_proc_grpc.add_ExternalProcessorServicer_to_server(Noop(), server)
    server.add_insecure_port(listen)
    await server.start()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", required=True)
    asyncio.run(serve(parser.parse_args().listen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
