"""The upstream hop through forward proxies, CA bundles and client certificates."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fixture_types import ProxyFactory
from tests.server.upstream_hop.exchanges import CLEAN, Wire, post, tls_pair
from tests.servers.wire import (
    ForwardProxy,
    answer,
)

# Proxies, CA bundles and client certificates.


async def test_an_http_proxy_from_the_environment_carries_the_hop(
    wire: Wire,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    forward_proxy: ForwardProxy,
) -> None:
    upstream = await wire([(answer(b"via proxy"), False)])
    proxy = await start_proxy(upstream.url, environ={"HTTP_PROXY": forward_proxy.url})
    assert await post(client, proxy) == (200, b"via proxy")
    assert forward_proxy.lines == [b"POST " + upstream.url.encode() + b"/v1/responses HTTP/1.1"]
    assert upstream.seen[0].body == CLEAN


@pytest.mark.parametrize(
    ("environ", "settings"),
    [
        pytest.param({"NO_PROXY": "127.0.0.1"}, {}, id="no-proxy-names-the-host"),
        pytest.param({"no_proxy": "*"}, {}, id="no-proxy-star"),
        pytest.param({}, {"trust_env": False}, id="trust-env-false"),
    ],
)
async def test_a_proxy_the_settings_exclude_is_not_used(
    wire: Wire,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    forward_proxy: ForwardProxy,
    environ: dict[str, str],
    settings: dict[str, Any],
) -> None:
    upstream = await wire([(answer(b"direct"), False)])
    proxy = await start_proxy(
        upstream.url, environ={"HTTP_PROXY": forward_proxy.url, **environ}, upstream=settings
    )
    assert await post(client, proxy) == (200, b"direct")
    assert forward_proxy.lines == []


async def test_an_https_upstream_through_a_tunnel_with_its_own_ca_file(
    wire: Wire,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    forward_proxy: ForwardProxy,
    tmp_path: Path,
) -> None:
    """HTTPS_PROXY is tunnelled to with CONNECT; `upstream.ca_file` is the trust the TLS hop
    checks the upstream's certificate against."""
    _, tls, ca_file = tls_pair(tmp_path)
    upstream = await wire([(answer(b"tunnelled"), False)], tls)
    proxy = await start_proxy(
        upstream.url,
        environ={"HTTPS_PROXY": forward_proxy.url},
        upstream={"ca_file": str(ca_file)},
    )
    assert await post(client, proxy) == (200, b"tunnelled")
    authority = upstream.url.removeprefix("https://").encode()
    assert forward_proxy.lines == [b"CONNECT " + authority + b" HTTP/1.1"]
    assert upstream.seen[0].body == CLEAN


async def test_a_client_certificate_is_presented_to_an_upstream_that_requires_one(
    wire: Wire, start_proxy: ProxyFactory, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    ca, tls, ca_file = tls_pair(tmp_path)
    tls.verify_mode = ssl.CERT_REQUIRED
    ca.configure_trust(tls)
    issued = ca.issue_cert("replay-proxy.test")
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    upstream = await wire([(answer(b"mutual"), False)], tls)
    without = await start_proxy(upstream.url, upstream={"ca_file": str(ca_file)})
    status, _ = await post(client, without)
    assert status == 502
    assert upstream.seen == []
    with_cert = await start_proxy(
        upstream.url,
        upstream={"ca_file": str(ca_file), "client_cert": str(cert), "client_key": str(key)},
    )
    assert await post(client, with_cert) == (200, b"mutual")
