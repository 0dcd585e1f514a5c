"""Fixtures that start real servers on 127.0.0.1: a recording upstream, fastresponses, the proxy."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from openai import AsyncOpenAI

from proxy.config import Config
from proxy.running.config_file import parse_config
from proxy.server.app import make_app
from tests.fixture_types import Clients, ProxyFactory
from tests.servers.recording import RecordingUpstream
from tests.servers.redis_server import RedisServer
from tests.servers.scripted_agent import serve_in_thread


@pytest.fixture(autouse=True, scope="session")
def _no_forward_proxy_from_the_environment() -> Iterator[None]:
    """The suite's traffic stays on 127.0.0.1: a forward proxy named in the environment of the
    machine running it must not carry the proxies under test (in process or as subprocesses,
    which honour `HTTP_PROXY` by default) to their upstreams. Tests that want one name it."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
            patch.delenv(name, raising=False)
            patch.delenv(name.upper(), raising=False)
        yield


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


@pytest.fixture
async def start_routed(tmp_path: Path) -> AsyncIterator[ProxyFactory]:
    """Start a proxy from the config sections given as keyword arguments, in either form
    (`upstream:`, or `upstreams:` with `routes:`), and `environ` standing in for the
    environment `api_key_env` is read from.

    Returns the proxy's base URL; its audit log goes to `tmp_path / "audit.jsonl"`.
    """
    servers: list[TestServer] = []

    async def start(environ: dict[str, str] | None = None, **sections: Any) -> str:
        data: dict[str, Any] = {"audit": {"path": str(tmp_path / "audit.jsonl")}}
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


@pytest.fixture
def start_proxy(start_routed: ProxyFactory) -> ProxyFactory:
    """Start a proxy in front of `upstream` with config sections given as keyword arguments
    (and `environ` standing in for the environment `upstream.api_key_env` is read from).

    Returns the proxy's base URL; its audit log goes to `tmp_path / "audit.jsonl"`.
    """

    async def start(
        upstream: str, /, environ: dict[str, str] | None = None, **sections: Any
    ) -> str:
        url = {"url": upstream}
        return await start_routed(environ, upstream=url | sections.pop("upstream", {}), **sections)

    return start


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


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
