"""Request targets through the real proxy: however a gated path is spelt it is gated, a target
that is not valid is refused, `/-/` is never forwarded, and the upstream gets exactly the path
the proxy classified. Each gated spelling is first shown to reach a gated route at a real
upstream (aiohttp's router, or a lax one), so that no row of the table is vacuous."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict
from prometheus_client.parser import text_string_to_metric_families
from yarl import URL

from tests.builders import SALES_TOOL, USER, sales_call, sales_output
from tests.fixture_types import ProxyFactory
from tests.servers.routing_upstreams import (
    GATED_ROUTES,
    RoutingUpstream,
    Served,
    lax_route,
    serve_routing_upstream,
)

HANG_GUARD_S = 30
FAILING = json.dumps(
    {
        "model": "m",
        "tools": [SALES_TOOL],
        "input": [USER, sales_call("call_1", "mars"), sales_output("call_1")],
    }
).encode()
CLEAN = json.dumps(
    {"model": "m", "tools": [SALES_TOOL], "input": [USER, sales_call("c"), sales_output("c")]}
).encode()


@dataclass(frozen=True)
class Answer:
    status: int
    headers: CIMultiDict[str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def send(
    base: str,
    method: str,
    target: bytes,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """One request with exactly these target bytes (no client normalises them), on a
    connection of its own; the answer read to EOF."""
    url = URL(base)
    head = [b"%s %s HTTP/1.1" % (method.encode(), target), b"Host: " + url.raw_authority.encode()]
    head += [f"{name}: {value}".encode() for name, value in (headers or {}).items()]
    if body is not None:
        head += [b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
    head.append(b"Connection: close")
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(b"\r\n".join(head) + b"\r\n\r\n" + (body or b""))
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), HANG_GUARD_S)
    finally:
        writer.close()
        await writer.wait_closed()
    status_line, _, rest = raw.partition(b"\r\n")
    header_block, _, payload = rest.partition(b"\r\n\r\n")
    parsed: CIMultiDict[str] = CIMultiDict()
    for line in header_block.decode("latin-1").split("\r\n"):
        name, _, value = line.partition(":")
        parsed.add(name.strip(), value.strip())
    return Answer(int(status_line.split()[1]), parsed, payload)


async def requests_counted(base: str, outcome: str) -> float | None:
    """The proxy's count of requests it answered itself with this outcome."""
    metrics = (await send(base, "GET", b"/-/metrics")).body.decode()
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            labels = {"route": "any", "outcome": outcome, "upstream": "-", "dialect": "-"}
            if sample.name == "replay_proxy_requests_total" and sample.labels == labels:
                return sample.value
    return None


@pytest.fixture
async def strict() -> AsyncIterator[RoutingUpstream]:
    async with serve_routing_upstream("strict") as upstream:
        yield upstream


@pytest.fixture
async def lax() -> AsyncIterator[RoutingUpstream]:
    async with serve_routing_upstream("lax") as upstream:
        yield upstream


def pick(kind: str, strict: RoutingUpstream, lax: RoutingUpstream) -> RoutingUpstream:
    return strict if kind == "strict" else lax


# Targets an upstream routes to a gated path, the upstream that does, the canonical path, and
# how the proxy refuses a failing pair sent there.
GATED_SPELLINGS = [
    pytest.param(b"/v1/responses", "strict", "/v1/responses", "replay_rejected", id="canonical"),
    pytest.param(b"/v1/respons%65s", "strict", "/v1/responses", "replay_rejected", id="escape"),
    pytest.param(
        b"/v1/%72esponses/compact",
        "strict",
        "/v1/responses/compact",
        "replay_rejected",
        id="escape-compact",
    ),
    pytest.param(b"/responses", "strict", "/responses", "replay_rejected", id="no-v1"),
    pytest.param(
        b"http://api.test/v1/responses", "strict", "/v1/responses", "replay_rejected", id="absolute"
    ),
    pytest.param(
        b"/v1/responses#x", "strict", "/v1/responses", "invalid_request_target", id="fragment"
    ),
    pytest.param(
        b"/v1/responses?stream=true#x",
        "strict",
        "/v1/responses",
        "invalid_request_target",
        id="query-fragment",
    ),
    pytest.param(
        b"http://h/v1/responses#x",
        "strict",
        "/v1/responses",
        "invalid_request_target",
        id="absolute-fragment",
    ),
    pytest.param(b"/v1%2Fresponses", "lax", "/v1/responses", "replay_rejected", id="slash"),
    pytest.param(b"/v1%2fresponses", "lax", "/v1/responses", "replay_rejected", id="slash-lower"),
    pytest.param(b"/V1/Responses", "lax", "/v1/responses", "replay_rejected", id="case"),
    pytest.param(
        b"/V1/RESPONSES/COMPACT",
        "lax",
        "/v1/responses/compact",
        "replay_rejected",
        id="case-compact",
    ),
    pytest.param(b"//v1//responses/", "lax", "/v1/responses", "replay_rejected", id="slashes"),
    pytest.param(b"/v1/./responses", "lax", "/v1/responses", "replay_rejected", id="dot"),
    pytest.param(b"/v1/x/../responses", "lax", "/v1/responses", "replay_rejected", id="dot-dot"),
    pytest.param(
        b"/v1/x/%2E%2E/responses", "lax", "/v1/responses", "replay_rejected", id="encoded-dot-dot"
    ),
    pytest.param(
        b"/v1/x%2F..%2Fresponses", "lax", "/v1/responses", "replay_rejected", id="slash-dot-dot"
    ),
    pytest.param(
        b"/v1/responses/compact/..", "lax", "/v1/responses", "replay_rejected", id="up-from-compact"
    ),
    pytest.param(b"/v1;a/responses;b", "lax", "/v1/responses", "replay_rejected", id="params"),
    pytest.param(
        b"/v1/x/..;/responses", "lax", "/v1/responses", "replay_rejected", id="dot-dot-param"
    ),
    pytest.param(b"/v1%5Cresponses", "lax", "/v1/responses", "replay_rejected", id="backslash"),
    pytest.param(b"/%76%31/responses", "lax", "/v1/responses", "replay_rejected", id="digits"),
    pytest.param(
        b"http://h/V1/x/../Responses/", "lax", "/v1/responses", "replay_rejected", id="absolute-lax"
    ),
    pytest.param(
        b"/v1\\responses", "lax", "/v1/responses", "invalid_request_target", id="raw-backslash"
    ),
    pytest.param(
        b"/V1/Responses#x", "lax", "/v1/responses", "invalid_request_target", id="case-fragment"
    ),
]


@pytest.mark.parametrize(("target", "kind", "canonical", "code"), GATED_SPELLINGS)
async def test_the_upstream_routes_the_spelling_to_a_gated_path(
    strict: RoutingUpstream,
    lax: RoutingUpstream,
    target: bytes,
    kind: str,
    canonical: str,
    code: str,
) -> None:
    upstream = pick(kind, strict, lax)

    answer = await send(upstream.url, "POST", target, FAILING)

    assert (answer.status, answer.json()["routed"]) == (200, canonical)
    [served] = upstream.served
    assert (served.routed, served.body) == (canonical, FAILING)


@pytest.mark.parametrize(("target", "kind", "canonical", "code"), GATED_SPELLINGS)
async def test_a_gated_spelling_is_gated_and_reaches_the_canonical_path(
    start_proxy: ProxyFactory,
    strict: RoutingUpstream,
    lax: RoutingUpstream,
    target: bytes,
    kind: str,
    canonical: str,
    code: str,
) -> None:
    upstream = pick(kind, strict, lax)
    base = await start_proxy(upstream.url)

    blocked = await send(base, "POST", target, FAILING)

    assert (blocked.status, blocked.json()["error"]["code"]) == (400, code)
    assert upstream.served == []

    clean = await send(base, "POST", target, CLEAN)

    if code == "replay_rejected":
        assert clean.status == 200
        query = target.partition(b"?")[2].decode()
        forwarded = canonical + ("?" + query if query else "")
        assert upstream.served == [Served("POST", forwarded, canonical, CLEAN)]
    else:
        assert clean.status == 400
        assert upstream.served == []


# Targets that stay pass-through, and the target the upstream receives for them: routed to no
# gated path by either upstream.
PASS_THROUGH = [
    pytest.param("POST", b"/v1/models", "/v1/models", id="models"),
    pytest.param("POST", b"/v1/models/", "/v1/models/", id="trailing-slash-kept"),
    pytest.param("POST", b"/v1/%6Dodels", "/v1/models", id="unreserved-decoded"),
    pytest.param("POST", b"//v1//models", "/v1/models", id="slashes-merged"),
    pytest.param("POST", b"/v1/x/../models", "/v1/models", id="dot-dot-resolved"),
    pytest.param("POST", b"/v1/files/a%2fb", "/v1/files/a%2Fb", id="escape-upper-cased"),
    pytest.param("GET", b"/v1/responses/resp_1", "/v1/responses/resp_1", id="retrieve"),
    pytest.param(
        "GET",
        b"/v1/responses/resp_1/input_items?after=a%2f&x=..",
        "/v1/responses/resp_1/input_items?after=a%2f&x=..",
        id="query-verbatim",
    ),
    pytest.param("POST", b"/v1/responses%2Fresp_1", "/v1/responses%2Fresp_1", id="encoded-below"),
    pytest.param("POST", b"/v1/responses/..;/models", "/v1/responses/..;/models", id="dot-param"),
    pytest.param("POST", b"/v1/responses/%2E%2E/models", "/v1/models", id="leaves-gated"),
    pytest.param("POST", b"/v1/responsesx", "/v1/responsesx", id="longer-name"),
    pytest.param("POST", b"/v2/responses", "/v2/responses", id="other-version"),
    pytest.param("POST", b"/v1/responses/compact/x", "/v1/responses/compact/x", id="below-compact"),
    pytest.param("POST", b"http://h/v1/models?x=1", "/v1/models?x=1", id="absolute-form"),
    # Body-less requests on a gated spelling pass through, under the canonical path.
    pytest.param("GET", b"//V1/Responses/", "/v1/responses", id="get-gated-spelling"),
    pytest.param("OPTIONS", b"/v1%2Fresponses", "/v1/responses", id="options-gated-spelling"),
]


@pytest.mark.parametrize("kind", ["strict", "lax"])
@pytest.mark.parametrize(("method", "target", "forwarded"), PASS_THROUGH)
async def test_a_pass_through_target_reaches_the_upstream_normalised(
    start_proxy: ProxyFactory,
    strict: RoutingUpstream,
    lax: RoutingUpstream,
    kind: str,
    method: str,
    target: bytes,
    forwarded: str,
) -> None:
    upstream = pick(kind, strict, lax)
    base = await start_proxy(upstream.url)
    body = FAILING if method == "POST" else None

    answer = await send(base, method, target, body)

    path = forwarded.partition("?")[0]
    routed = path if path in GATED_ROUTES else None
    assert routed is None or method != "POST"
    assert answer.json()["routed"] == routed
    assert upstream.served == [Served(method, forwarded, routed, body or b"")]
    # The lax upstream would route what it got where the proxy thought it would.
    assert (lax_route(forwarded) in GATED_ROUTES) == (routed is not None)


# Targets that are not valid origin-form or absolute-form, on gated, pass-through and admin
# paths, and who refuses them: the proxy (the API's error shape) or aiohttp's parser, before
# any handler runs (a plain-text 400 and the connection closed; no hook of aiohttp's changes it).
INVALID_TARGETS = [
    pytest.param("POST", b"/v1/responses#x", "proxy", id="fragment-gated"),
    pytest.param("GET", b"/v1/models#x", "proxy", id="fragment-pass-through"),
    pytest.param("GET", b"/-/healthy#x", "proxy", id="fragment-admin"),
    pytest.param("GET", b"/-/metrics#", "proxy", id="empty-fragment-admin"),
    pytest.param("POST", b"/v1/responses%zz", "proxy", id="bad-escape"),
    pytest.param("GET", b"/v1/models%2", "proxy", id="short-escape"),
    pytest.param("GET", b"/v1/models?x=%G1", "proxy", id="bad-escape-in-query"),
    pytest.param("POST", b"/v1/res|ponses", "proxy", id="pipe"),
    pytest.param("GET", b"/v1/{x}", "proxy", id="brace"),
    pytest.param("POST", b"ftp://h/v1/responses", "proxy", id="other-scheme"),
    pytest.param("POST", b"http://u:p@h/v1/responses", "proxy", id="userinfo"),
    pytest.param("POST", b"/v1%25252Fresponses", "proxy", id="nested-escapes"),
    pytest.param("OPTIONS", b"*", "proxy", id="asterisk-form"),
    pytest.param("POST", b"/v1/res ponses", "aiohttp", id="space"),
    pytest.param("POST", b"/v1/res\tponses", "aiohttp", id="tab"),
    pytest.param("POST", b"/v1/res\x01ponses", "aiohttp", id="control"),
    pytest.param("POST", b"/v1/responses\x7f", "aiohttp", id="del"),
    pytest.param("POST", b"/v1/r\xc3\xa9sponses", "aiohttp", id="non-ascii"),
    pytest.param("GET", b"/v1/models?x=\x80", "aiohttp", id="non-ascii-query"),
    pytest.param("POST", b"v1/responses", "aiohttp", id="relative"),
    pytest.param("POST", b"http:///v1/responses", "aiohttp", id="no-host"),
]


@pytest.mark.parametrize(("method", "target", "by"), INVALID_TARGETS)
async def test_an_invalid_target_is_refused_and_never_forwarded(
    start_proxy: ProxyFactory, lax: RoutingUpstream, method: str, target: bytes, by: str
) -> None:
    base = await start_proxy(lax.url)

    answer = await send(base, method, target, FAILING if method == "POST" else None)

    assert answer.status == 400
    if by == "proxy":
        error = answer.json()["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_request_target")
        assert error["message"].startswith("the request target")
        assert await requests_counted(base, "invalid_target") == 1
    else:
        assert answer.headers["Content-Type"].startswith("text/plain")
    assert lax.served == []


# Paths in the proxy's own namespace that are not admin endpoints, however spelt.
NOT_ADMIN = [
    pytest.param("GET", b"/-/x", id="plain"),
    pytest.param("GET", b"/%2D/x", id="encoded-dash"),
    pytest.param("GET", b"//-/x", id="double-slash"),
    pytest.param("GET", b"/./-/x", id="dot"),
    pytest.param("GET", b"/v1/../-/x", id="dot-dot"),
    pytest.param("GET", b"/-%2Fx", id="encoded-slash"),
    pytest.param("GET", b"/-;a/x", id="param"),
    pytest.param("GET", b"/-/", id="root"),
    pytest.param("GET", b"/-", id="bare"),
    pytest.param("GET", b"/-/healthy/x", id="below-admin"),
    pytest.param("GET", b"//-/healthy", id="admin-double-slash"),
    pytest.param("POST", b"/-/healthy", id="admin-other-method"),
    pytest.param("DELETE", b"/-/metrics", id="metrics-other-method"),
    pytest.param("POST", b"/-/..%2Fv1/responses", id="reads-as-gated-too"),
    pytest.param("GET", b"http://h/-/x", id="absolute-form"),
]


@pytest.mark.parametrize(("method", "target"), NOT_ADMIN)
async def test_the_proxys_namespace_is_never_forwarded(
    start_proxy: ProxyFactory, lax: RoutingUpstream, method: str, target: bytes
) -> None:
    base = await start_proxy(lax.url)

    answer = await send(base, method, target, FAILING if method == "POST" else None)

    assert answer.status == 404
    error = answer.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "not_found")
    assert await requests_counted(base, "not_found") == 1
    assert lax.served == []


@pytest.mark.parametrize("target", [b"/-/healthy", b"/%2D/healthy", b"/-/%68ealthy"])
async def test_admin_endpoints_answer_however_spelt(
    start_proxy: ProxyFactory, lax: RoutingUpstream, target: bytes
) -> None:
    base = await start_proxy(lax.url)

    answer = await send(base, "GET", target)

    assert (answer.status, answer.json()["status"]) == (200, "ok")
    assert lax.served == []


UPGRADE = {
    "Upgrade": "websocket",
    "Sec-WebSocket-Key": base64.b64encode(b"sixteen byte key").decode(),
    "Sec-WebSocket-Version": "13",
}


@pytest.mark.parametrize(
    ("target", "status", "code"),
    [
        pytest.param(b"/v1/responses#x", 400, "invalid_request_target", id="fragment"),
        pytest.param(b"/V1/Responses%zz", 400, "invalid_request_target", id="bad-escape"),
        pytest.param(b"/%2D/x", 404, "not_found", id="namespace"),
    ],
)
async def test_a_websocket_upgrade_is_refused_like_any_request(
    start_proxy: ProxyFactory, lax: RoutingUpstream, target: bytes, status: int, code: str
) -> None:
    base = await start_proxy(lax.url)

    answer = await send(base, "GET", target, headers={"Connection": "Upgrade", **UPGRADE})

    assert (answer.status, answer.json()["error"]["code"]) == (status, code)
    assert lax.served == []


@pytest.mark.parametrize("kind", ["strict", "lax"])
@pytest.mark.parametrize("target", ["/v1/responses", "/V1/Responses/", "/v1%2Fresponses"])
async def test_a_websocket_on_a_gated_spelling_goes_up_under_the_canonical_path(
    start_proxy: ProxyFactory, strict: RoutingUpstream, lax: RoutingUpstream, kind: str, target: str
) -> None:
    upstream = pick(kind, strict, lax)
    base = await start_proxy(upstream.url)

    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(URL(base + target, encoded=True)) as ws,
    ):
        await ws.close()

    assert upstream.served == [Served("GET", "/v1/responses", "/v1/responses", b"")]
