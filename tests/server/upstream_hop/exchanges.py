"""What the upstream hop's tests share: a clean body, a scripted upstream, one POST, TLS."""

from __future__ import annotations

import json
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import trustme

from tests.builders import JSON_HEADERS, SALES_TOOL, sales_call, sales_output
from tests.servers.wire import (
    ScriptedWire,
)

POLL_S = 0.01
CLEAN = json.dumps(
    {
        "model": "m",
        "tools": [SALES_TOOL],
        "input": [{"role": "user", "content": "hi"}, sales_call("c1"), sales_output("c1")],
    }
).encode()

Wire = Callable[..., Awaitable[ScriptedWire]]


async def post(client: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    async with client.post(url + "/v1/responses", data=CLEAN, headers=JSON_HEADERS) as got:
        return got.status, await got.read()


def tls_pair(tmp_path: Path) -> tuple[trustme.CA, ssl.SSLContext, Path]:
    """A CA, a server context for 127.0.0.1 it issued, and the CA's certificate as a file."""
    ca = trustme.CA()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(tls)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return ca, tls, ca_file
