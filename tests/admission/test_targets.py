"""Which raw request targets the gate inspects: one row a case, no event loop."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.admission.targets import (
    GATED,
    Target,
    TargetError,
    gated_path,
    normalise,
    read_target,
    split_target,
)
from tests.servers.routing_upstreams import lax_route


@pytest.mark.parametrize(
    ("raw_path", "expected"),
    [
        pytest.param("/v1/responses", "/v1/responses", id="canonical"),
        pytest.param("/v1/responses/compact", "/v1/responses/compact", id="compact"),
        pytest.param("/responses", "/responses", id="no-v1"),
        pytest.param("/responses/compact", "/responses/compact", id="no-v1-compact"),
        pytest.param("/v1/responses/", "/v1/responses", id="trailing-slash"),
        pytest.param("//v1//responses/", "/v1/responses", id="duplicate-slashes"),
        pytest.param("/v1/./responses", "/v1/responses", id="dot-segment"),
        pytest.param("/v1/x/../responses", "/v1/responses", id="dot-dot-segment"),
        pytest.param("/../v1/responses", "/v1/responses", id="dot-dot-above-root"),
        pytest.param("/v1/%2E%2E/v1/responses", "/v1/responses", id="encoded-dot-dot"),
        pytest.param("/v1/%2e/responses", "/v1/responses", id="encoded-dot-lower"),
        pytest.param("/v1/respons%65s", "/v1/responses", id="encoded-unreserved"),
        pytest.param("/%76%31/%72esponses", "/v1/responses", id="encoded-letters-and-digit"),
        pytest.param("/V1/Responses", "/v1/responses", id="case"),
        pytest.param("/V1/RESPONSES/COMPACT", "/v1/responses/compact", id="case-compact"),
        pytest.param("/v1%2Fresponses", "/v1/responses", id="encoded-slash"),
        pytest.param(
            "/v1%2fresponses%2Fcompact", "/v1/responses/compact", id="encoded-slash-lower"
        ),
        pytest.param("/v1\\responses", "/v1/responses", id="backslash"),
        pytest.param("/v1%5Cresponses", "/v1/responses", id="encoded-backslash"),
        pytest.param("/v1/responses;v=1", "/v1/responses", id="path-parameter"),
        pytest.param("/v1;x/responses", "/v1/responses", id="path-parameter-inner"),
        pytest.param("/v1/responses/compact/", "/v1/responses/compact", id="compact-trailing"),
        pytest.param("/v1/responses/compact/..", "/v1/responses", id="compact-dot-dot"),
        pytest.param("/v1/models", None, id="models"),
        pytest.param("/v1/responses/resp_1", None, id="retrieve"),
        pytest.param("/v1/responses/resp_1/input_items", None, id="input-items"),
        pytest.param("/v1/responses/compact/x", None, id="below-compact"),
        pytest.param("/v1/responsesx", None, id="longer-name"),
        pytest.param("/v2/responses", None, id="other-version"),
        pytest.param("/v1/responses/..", None, id="dot-dot-leaves"),
        pytest.param("/v1/chat/completions", "/v1/chat/completions", id="chat-completions"),
        pytest.param("/-/healthy", None, id="admin"),
        pytest.param("/", None, id="root"),
    ],
)
def test_gated_path(raw_path: str, expected: str | None) -> None:
    assert gated_path(raw_path) == expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("/v1/responses", "/v1/responses", id="unchanged"),
        pytest.param("", "/", id="empty"),
        pytest.param("/", "/", id="root"),
        # A trailing slash is kept: it is what goes upstream, where it can be significant.
        pytest.param("//a//b//", "/a/b/", id="duplicate-slashes"),
        pytest.param("/a/./b/.", "/a/b/", id="dot"),
        pytest.param("/a/b/..", "/a/", id="dot-dot-last"),
        pytest.param("/a%2fb%5c", "/a%2Fb%5C", id="escapes-upper-case"),
        pytest.param("/a/b/../c", "/a/c", id="dot-dot"),
        pytest.param("/../../a", "/a", id="dot-dot-above-root"),
        pytest.param("/%61%2D%2E%5F%7E%30", "/a-._~0", id="unreserved-decoded"),
        pytest.param("/a%2Fb", "/a%2Fb", id="reserved-slash-kept"),
        pytest.param("/a%20b", "/a%20b", id="space-kept"),
        pytest.param("/a%3Bb", "/a%3Bb", id="semicolon-kept"),
        pytest.param("/%2E%2E/a", "/a", id="encoded-dot-dot"),
        pytest.param("/A/B", "/A/B", id="case-kept"),
    ],
)
def test_normalise(path: str, expected: str) -> None:
    assert normalise(path) == expected


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        pytest.param("/v1/responses", ("/v1/responses", ""), id="no-query"),
        pytest.param("/v1/responses?a=1&b=2", ("/v1/responses", "?a=1&b=2"), id="query"),
        pytest.param("/v1/responses?", ("/v1/responses", "?"), id="empty-query"),
        pytest.param("/a?b?c", ("/a", "?b?c"), id="question-mark-in-query"),
        pytest.param("http://h/v1/responses?x=1", ("/v1/responses", "?x=1"), id="absolute-form"),
        pytest.param("HTTPS://u@h:1/V1/Responses", ("/V1/Responses", ""), id="absolute-form-case"),
        pytest.param("http://h", ("/", ""), id="absolute-form-no-path"),
        pytest.param("http://h?x", ("/", "?x"), id="absolute-form-query-only"),
    ],
)
def test_split_target(target: str, expected: tuple[str, str]) -> None:
    assert split_target(target) == expected


@pytest.mark.parametrize(
    ("target", "forward", "kind"),
    [
        # Gated: a reading names a gated path; it goes upstream as that canonical path.
        pytest.param("/v1/responses", "/v1/responses", "gated", id="canonical"),
        pytest.param("/v1/responses?a=%2f", "/v1/responses?a=%2f", "gated", id="query-kept"),
        pytest.param("/V1/Responses/", "/v1/responses", "gated", id="case-trailing"),
        pytest.param("/v1%2Fresponses", "/v1/responses", "gated", id="encoded-slash"),
        pytest.param("/v1%252Fresponses", "/v1/responses", "gated", id="double-encoded"),
        pytest.param("/v1%5Cresponses", "/v1/responses", "gated", id="encoded-backslash"),
        pytest.param("/v1;a/responses;b", "/v1/responses", "gated", id="params"),
        pytest.param("/v1/x%2F..%2Fresponses", "/v1/responses", "gated", id="encoded-dot-dot"),
        pytest.param("/v1/x/..;/responses", "/v1/responses", "gated", id="dot-dot-param"),
        pytest.param("/v1/responses%3Fx", "/v1/responses", "gated", id="encoded-query"),
        pytest.param("/v1/responses%23x", "/v1/responses", "gated", id="encoded-fragment"),
        pytest.param("/v1/responses%00.json", "/v1/responses", "gated", id="encoded-nul"),
        pytest.param("/v1/re%C5%BFponses", "/v1/responses", "gated", id="long-s-folds"),
        pytest.param("/v1/%EF%BD%92esponses", "/v1/responses", "gated", id="fullwidth"),
        pytest.param("/v1%EF%BC%8Fresponses", "/v1/responses", "gated", id="fullwidth-slash"),
        pytest.param("/v1/responses/a%2F%2F..%2F..", "/v1/responses", "gated", id="rfc-empties"),
        pytest.param("/responses/compact", "/responses/compact", "gated", id="compact"),
        pytest.param("HTTP://h:80/v1/x/../responses?x", "/v1/responses?x", "gated", id="absolute"),
        # Pass-through: forwarded under the normalised path, the query as it came.
        pytest.param("/v1/models?a=%2f&b=..", "/v1/models?a=%2f&b=..", "pass", id="models"),
        pytest.param("/v1/models/", "/v1/models/", "pass", id="trailing-slash-kept"),
        pytest.param("//v1//%6Dodels", "/v1/models", "pass", id="merged-and-decoded"),
        pytest.param("/v1/files/a%2fb", "/v1/files/a%2Fb", "pass", id="encoded-slash-kept"),
        pytest.param("/v1/responses/resp_1", "/v1/responses/resp_1", "pass", id="retrieve"),
        pytest.param("/v1/responses/..;/x", "/v1/responses/..;/x", "pass", id="dot-dot-param-not"),
        pytest.param("/v1/responses/%2E%2E", "/v1/", "pass", id="leaves-gated-path"),
        pytest.param("/v1/responses%2Fx", "/v1/responses%2Fx", "pass", id="below-gated"),
        pytest.param("http://h", "/", "pass", id="absolute-no-path"),
        # The proxy's own namespace, however spelt: never forwarded, never gated.
        pytest.param("/-/x", "/-/x", "own", id="own"),
        pytest.param("/%2D/x", "/-/x", "own", id="own-encoded"),
        pytest.param("//-/x", "/-/x", "own", id="own-double-slash"),
        pytest.param("/./-/x", "/-/x", "own", id="own-dot"),
        pytest.param("/v1/../-/x", "/-/x", "own", id="own-dot-dot"),
        pytest.param("/-%2Fx", "/-%2Fx", "own", id="own-encoded-slash"),
        pytest.param("/-;a/x", "/-;a/x", "own", id="own-param"),
        pytest.param("/-", "/-", "own", id="own-root"),
        pytest.param("/-/..%2Fv1/responses", "/-/..%2Fv1/responses", "own", id="own-wins"),
        pytest.param("/-x/y", "/-x/y", "pass", id="not-own"),
    ],
)
def test_read_target(target: str, forward: str, kind: str) -> None:
    read = read_target(target)
    path = forward.partition("?")[0]
    gated = path if kind == "gated" else None
    assert (read.forward, read.gated, read.own) == (forward, gated, kind == "own")
    # What goes upstream reads as what was classified.
    assert read_target(read.forward) == Target(path, read.query, gated, kind == "own")


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        pytest.param("/v1/responses#x", "fragment", id="fragment"),
        pytest.param("/v1/responses?a#", "fragment", id="fragment-after-query"),
        pytest.param("http://h/v1/responses#x", "fragment", id="fragment-absolute"),
        pytest.param("/v1/res ponses", "raw space", id="space"),
        pytest.param("/v1/res\tponses", "control character (0x09)", id="tab"),
        pytest.param("/v1/responses\x00", "control character (0x00)", id="nul"),
        pytest.param("/v1/responses\x7f", "control character (0x7f)", id="del"),
        pytest.param("/v1/r\u00e9sponses", "non-ASCII", id="non-ascii"),
        pytest.param("/v1/r\udcffsponses", "non-ASCII", id="undecodable-byte"),
        pytest.param("/v1/responses%zz", "malformed percent-escape", id="bad-escape"),
        pytest.param("/v1/responses%2", "malformed percent-escape", id="short-escape"),
        pytest.param("/v1/responses%", "malformed percent-escape", id="bare-percent"),
        pytest.param("/v1/models?x=%G0", "malformed percent-escape", id="bad-escape-in-query"),
        pytest.param("/v1\\responses", "'\\\\'", id="backslash"),
        pytest.param("/v1/res|ponses", "'|'", id="pipe"),
        pytest.param('/v1/"x"', "'\"'", id="quote"),
        pytest.param("/v1/{x}", "'{'", id="brace"),
        pytest.param("/v1/[x]", "'['", id="bracket"),
        pytest.param("v1/responses", "neither origin-form", id="relative"),
        pytest.param("*", "neither origin-form", id="asterisk-form"),
        pytest.param("h:443", "neither origin-form", id="authority-form"),
        pytest.param("", "neither origin-form", id="empty"),
        pytest.param("ftp://h/v1/responses", "scheme", id="other-scheme"),
        pytest.param("http://u:p@h/v1/responses", "credentials", id="userinfo"),
        pytest.param("http:///v1/responses", "authority", id="no-host"),
        pytest.param("http://h:x/v1/responses", "authority", id="bad-port"),
        pytest.param("/v1%25252Fresponses", "nested too deep", id="nested-escapes"),
        pytest.param("/v1/responses/compact%3F%2F..", "reads as", id="two-gated-readings"),
        pytest.param("/v1/a%2F%2F..%2F..%2Fresponses", "reads as", id="empty-segment-readings"),
    ],
)
def test_read_target_refuses(target: str, problem: str) -> None:
    with pytest.raises(TargetError) as refused:
        read_target(target)
    assert problem in str(refused.value)


# Pieces a spelling of a gated path is made of, and pieces that bend how it is read.
PIECES = st.sampled_from(
    [
        *("/", "//", "v1", "V1", "%76%31", "responses", "RESPONSES", "respons%65s", "compact"),
        *("-", "x", "resp_1", ".", "..", "%2E", "%2F", "%2f", "%5C", "%252F", ";p", "%3F", "%23"),
        "%00",
    ]
)


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(pieces=st.lists(PIECES, max_size=10))
def test_no_spelling_a_lax_upstream_routes_to_a_gated_path_goes_ungated(pieces: list[str]) -> None:
    target = "/" + "".join(pieces)
    try:
        read = read_target(target)
    except TargetError:
        return  # refused: nothing is forwarded
    if read.own:
        return  # answered by the proxy: nothing is forwarded
    # Sent as it came (as before), a lax upstream would have routed it here: it is gated.
    if lax_route(target) in GATED:
        assert read.gated is not None
    # Sent as it goes now, a lax upstream routes it exactly where the proxy classified it.
    routed = lax_route(read.forward)
    assert read.gated == (routed if routed in GATED else None)


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(segments=st.lists(st.sampled_from(["v1", "V1", "responses", "Compact", "-", "~x_1"])))
@pytest.mark.parametrize("query", ["", "?", "?a=1&b=/x?y", "?a=%2F"])
def test_a_simple_target_reads_as_its_absolute_form(segments: list[str], query: str) -> None:
    # The absolute form takes the long way through every reading; the answer is the same.
    target = "/" + "/".join(segments) + query
    assert read_target(target) == read_target("http://h" + target)
