"""Fixtures of the server tests: a plain client, a proxy served as `serve` serves it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from proxy.running.config_file import parse_config
from proxy.server.app import make_app
from tests.fixture_types import ProxyFactory


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


@pytest.fixture
async def serve_proxy(tmp_path: Path) -> AsyncIterator[ProxyFactory]:
    """Like `start_proxy`, but run the way `proxy.running.serving.serve` runs it: an
    `AppRunner` with aiohttp's defaults, where a handler is not cancelled when its client goes
    away (the `TestServer` behind `start_proxy` cancels it, which would hide the proxy's own
    handling)."""
    runners: list[web.AppRunner] = []

    async def start(upstream: str) -> str:
        config = parse_config(
            {"upstream": {"url": upstream}, "audit": {"path": str(tmp_path / "audit.jsonl")}}
        )
        runner = web.AppRunner(
            make_app(config), handle_signals=False, access_log=None, shutdown_timeout=1
        )
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()
