"""Real servers on 127.0.0.1 for the HTTP tests: a recording upstream, fastresponses, the proxy."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict
from openai import AsyncOpenAI

from proxy.app import make_app
from proxy.config import Config, parse_config
from proxy.workers import free_port
from tests.servers.scripted_agent import serve_in_thread


@dataclass
class Received:
    """One request exactly as the upstream saw it."""

    method: str
    target: str
    headers: CIMultiDict[str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Handler = Callable[[web.Request, Received], Awaitable[web.StreamResponse]]


async def _ok(request: web.Request, received: Received) -> web.StreamResponse:
    return web.json_response({"object": "response", "id": "resp_1", "output": []})


@dataclass
class RecordingUpstream:
    """A tiny upstream that records every request and answers with `handler`."""

    received: list[Received] = field(default_factory=list)
    handler: Handler = _ok
    url: str = ""
    frames: list[str] = field(default_factory=list)
    # WebSocket upgrades asked of it.
    upgrades: int = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self.websocket(request)
        received = Received(
            request.method, request.raw_path, CIMultiDict(request.headers), await request.read()
        )
        self.received.append(received)
        return await self.handler(request, received)

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        """Records every text frame; answers each with a completed response naming its turn."""
        self.upgrades += 1
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            self.frames.append(message.data)
            turn = len(self.frames)
            response = {"id": f"resp_ws_{turn}", "object": "response", "output": []}
            await ws.send_json({"type": "response.completed", "response": response})
        return ws


@pytest.fixture
async def recording_upstream() -> AsyncIterator[RecordingUpstream]:
    upstream = RecordingUpstream()
    app = web.Application(handler_args={"auto_decompress": False}, client_max_size=1 << 28)
    app.router.add_route("*", "/{tail:.*}", upstream.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    upstream.url = str(server.make_url("")).rstrip("/")
    yield upstream
    await server.close()


ProxyFactory = Callable[..., Awaitable[str]]


@pytest.fixture
async def start_proxy(tmp_path: Path) -> AsyncIterator[ProxyFactory]:
    """Start a proxy in front of `upstream` with config sections given as keyword arguments
    (and `environ` standing in for the environment `upstream.api_key_env` is read from).

    Returns the proxy's base URL; its audit log goes to `tmp_path / "audit.jsonl"`.
    """
    servers: list[TestServer] = []

    async def start(
        upstream: str, /, environ: dict[str, str] | None = None, **sections: Any
    ) -> str:
        data: dict[str, Any] = {
            "upstream": {"url": upstream},
            "audit": {"path": str(tmp_path / "audit.jsonl")},
        }
        for name, value in sections.items():
            data[name] = (data.get(name, {}) | value) if isinstance(value, dict) else value
        config: Config = parse_config(data).with_secrets(environ or {})
        server = TestServer(make_app(config), host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return str(server.make_url("")).rstrip("/")

    yield start
    for server in servers:
        await server.close()


Clients = Callable[[str], AsyncOpenAI]


@pytest.fixture
async def client_for() -> AsyncIterator[Clients]:
    """The official openai SDK pointed at a base URL, only `base_url` changed."""
    clients: list[AsyncOpenAI] = []

    def make(base: str) -> AsyncOpenAI:
        client = AsyncOpenAI(base_url=base + "/v1", api_key="sk-test-client", max_retries=0)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


@pytest.fixture(scope="session")
def scripted_upstream() -> Iterator[str]:
    """fastresponses serving the scripted agent; yields its base URL with `/v1`."""
    with serve_in_thread() as url:
        yield url.removesuffix("/v1")


class RedisServer:
    """A real redis-server on a free loopback port, started and stopped by the tests."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port("127.0.0.1")
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not installed (.ci/run installs Debian's redis-server)")
        self.process = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        self.process = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
