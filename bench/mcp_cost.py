"""What gating an MCP `tools/call` costs: the same call to the Python SDK's server, direct and
through replay-proxy's MCP door.

Run from the repository root: `python bench/mcp_cost.py [--calls N] [--rounds R]` (about half a
minute). It starts the SDK's `MCPServer` of tests/servers/mcp_tools.py (JSON answers) and
`replay-proxy serve` with that server under `mcp.servers`, opens one session on each (initialize,
tools/list), then sends N `tools/call`s one after the other, R rounds, the order rotated: a valid
call direct, the same call through the proxy (gated, forwarded), and a call that breaks the
schema through the proxy (answered by the proxy as a tool error; the server never sees it).
The figures are the medians, over the rounds, of each round's median latency per call.
Everything listens on 127.0.0.1 and is stopped (by PID) at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from servers import free_port, started

_HEADERS = {"Accept": "application/json, text/event-stream", "Authorization": "Bearer sk-bench"}
_VERSION = "2025-11-25"


async def opened(http: aiohttp.ClientSession, url: str) -> dict[str, str]:
    """A session at `url`: its headers for the calls that follow."""
    hello = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": _VERSION,
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"},
        },
    }
    async with http.post(url, json=hello, headers=_HEADERS) as answer:
        headers = {**_HEADERS, "Mcp-Session-Id": answer.headers["Mcp-Session-Id"]}
        await answer.read()
    headers["MCP-Protocol-Version"] = _VERSION
    for message in (
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
    ):
        async with http.post(url, json=message, headers=headers) as answer:
            await answer.read()
    return headers


async def timed(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], region: str, calls: int
) -> float:
    """The median µs of `calls` tools/calls, one after the other; each answer is checked."""
    took = []
    for n in range(calls):
        params = {"name": "get_report", "arguments": {"region": region}}
        message = {"jsonrpc": "2.0", "id": n + 2, "method": "tools/call", "params": params}
        start = time.perf_counter()
        async with http.post(url, json=message, headers=headers) as answer:
            found: Any = await answer.json()
        took.append(time.perf_counter() - start)
        assert answer.status == 200, found
        assert "result" in found, found
    return statistics.median(took) * 1e6


async def measure(urls: dict[str, str], calls: int, rounds: int) -> dict[str, float]:
    cases = [
        ("direct, valid call", "direct", "eu"),
        ("through the proxy, valid call (gated, forwarded)", "proxy", "eu"),
        ("through the proxy, failing call (rewritten, not forwarded)", "proxy", "mars"),
    ]
    found: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    async with aiohttp.ClientSession() as http:
        sessions = {name: await opened(http, url) for name, url in urls.items()}
        for round_ in range(rounds):
            for name, target, region in cases[round_ % 3 :] + cases[: round_ % 3]:
                found[name].append(await timed(http, urls[target], sessions[target], region, calls))
    return {name: statistics.median(times) for name, times in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        log = stack.enter_context(open(Path(tmp) / "servers.log", "wb"))
        mcp_port, proxy_port = free_port(), free_port()
        server_argv = [sys.executable, "-m", "tests.servers.mcp_tools", "--port", str(mcp_port)]
        stack.enter_context(started("mcp", [*server_argv, "--json"], mcp_port, log))
        server = f"http://127.0.0.1:{mcp_port}/mcp"
        config = Path(tmp) / "proxy.yaml"
        settings = {
            "audit": {"path": str(Path(tmp) / "audit.jsonl")},
            "mcp": {"servers": {"reports": {"url": server}}},
        }
        config.write_text(yaml.safe_dump(settings), encoding="utf-8")
        argv = [sys.executable, "-m", "proxy", "serve", "--upstream", "http://127.0.0.1:9"]
        argv += ["--port", str(proxy_port), "--config", str(config), "--log-level", "WARNING"]
        stack.enter_context(started("proxy", argv, proxy_port, log))
        urls = {"direct": server, "proxy": f"http://127.0.0.1:{proxy_port}/mcp/reports"}
        medians = asyncio.run(measure(urls, args.calls, args.rounds))
    direct = medians["direct, valid call"]
    print("| call | median µs per call | x direct |")  # noqa: T201
    print("| :--- | ---: | ---: |")  # noqa: T201
    for name, value in medians.items():
        print(f"| {name} | {value:,.0f} | {value / direct:.2f}x |")  # noqa: T201


if __name__ == "__main__":
    main()
