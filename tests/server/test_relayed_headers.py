"""Which headers are relayed: a table of headers in, headers out, order and repeats kept."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from proxy.server.headers import body_headers_named, relayed_headers

Pairs = list[tuple[str, str]]

CASES = [
    pytest.param([], frozenset(), [], id="none"),
    pytest.param(
        [("Content-Type", "application/json"), ("X-A", "1"), ("x-a", "2"), ("X-B", "3")],
        frozenset(),
        [("Content-Type", "application/json"), ("X-A", "1"), ("x-a", "2"), ("X-B", "3")],
        id="no-connection-header-every-repeat-kept-in-order",
    ),
    pytest.param(
        [
            ("Keep-Alive", "timeout=5"),
            ("TE", "trailers"),
            ("Transfer-Encoding", "chunked"),
            ("Upgrade", "h2c"),
            ("Proxy-Authorization", "Basic x"),
            ("X-Kept", "1"),
        ],
        frozenset(),
        [("X-Kept", "1")],
        id="hop-by-hop",
    ),
    pytest.param(
        [
            ("Connection", "keep-alive, X-Secret ,, x-other"),
            ("X-Secret", "s"),
            ("X-Other", "o"),
            ("X-Kept", "1"),
        ],
        frozenset(),
        [("X-Kept", "1")],
        id="named-by-connection",
    ),
    pytest.param(
        [
            ("Connection", "content-length"),
            ("connection", "Transfer-Encoding, x-gone"),
            ("Content-Length", "2"),
            ("Transfer-Encoding", "chunked"),
            ("X-Gone", "g"),
        ],
        frozenset(),
        [("Content-Length", "2")],
        id="a-body-header-named-stays-but-hop-by-hop-does-not",
    ),
    pytest.param(
        [("Content-Encoding", "gzip"), ("Content-Length", "9"), ("X-Kept", "1")],
        frozenset({"content-encoding", "content-length"}),
        [("X-Kept", "1")],
        id="dropped",
    ),
    pytest.param(
        [("Connection", "x-named"), ("X-Named", "n"), ("Content-Length", "9"), ("X-Kept", "1")],
        frozenset({"content-length"}),
        [("X-Kept", "1")],
        id="named-and-dropped",
    ),
]


@pytest.mark.parametrize(("given", "drop", "relayed"), CASES)
def test_relayed_headers(given: Pairs, drop: frozenset[str], relayed: Pairs) -> None:
    assert list(relayed_headers(CIMultiDict(given), drop).items()) == relayed


@pytest.mark.parametrize(
    ("connection", "named"),
    [
        pytest.param([], [], id="none"),
        pytest.param(["keep-alive"], [], id="no-body-header"),
        pytest.param(
            ["Content-Type, x-a", "content-encoding"], ["content-type", "content-encoding"]
        ),
    ],
)
def test_body_headers_named(connection: list[str], named: list[str]) -> None:
    headers = CIMultiDict([("Connection", value) for value in connection])
    assert body_headers_named(headers) == named
