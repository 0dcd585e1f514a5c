"""Request bodies of the gated routes: content type, content coding, strict JSON; pure tables."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable
from typing import Any

import brotli
import jiter
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.admission import body
from proxy.admission.body import (
    BodyError,
    check_content_type,
    codings,
    decode,
    dumps,
    exact,
    parse,
    with_input,
)
from tests.builders import raw_deflate

LIMIT = 4096
DOC = b'{"model": "m", "input": "hello"}'


def bomb(compress: Callable[[bytes], bytes]) -> bytes:
    """A few KB of compressed bytes that inflate to 100 times the limit."""
    packed = compress(b" " * (100 * LIMIT))
    assert len(packed) < LIMIT
    return packed


@pytest.mark.parametrize(
    "content_type",
    [
        pytest.param("application/json", id="plain"),
        pytest.param("application/json; charset=utf-8", id="charset"),
        pytest.param("application/json;charset=UTF-8", id="charset-upper"),
        pytest.param('application/json; charset="utf-8"', id="charset-quoted"),
        pytest.param("application/json; charset=utf8", id="charset-utf8"),
        pytest.param("Application/JSON", id="case"),
        pytest.param("application/json; foo=bar", id="other-parameter"),
    ],
)
def test_content_type_accepted(content_type: str) -> None:
    check_content_type(content_type)


@pytest.mark.parametrize(
    ("content_type", "code"),
    [
        pytest.param("", "unsupported_media_type", id="missing"),
        pytest.param("text/plain", "unsupported_media_type", id="text"),
        pytest.param("application/x-www-form-urlencoded", "unsupported_media_type", id="form"),
        pytest.param("multipart/form-data; boundary=x", "unsupported_media_type", id="multipart"),
        pytest.param("application/jsonl", "unsupported_media_type", id="jsonl"),
        pytest.param("application/json-patch+json", "unsupported_media_type", id="json-patch"),
        pytest.param("application/json; charset=latin-1", "unsupported_charset", id="latin-1"),
        pytest.param("application/json; charset=utf-16", "unsupported_charset", id="utf-16"),
    ],
)
def test_content_type_refused(content_type: str, code: str) -> None:
    with pytest.raises(BodyError) as caught:
        check_content_type(content_type)
    assert (caught.value.status, caught.value.code) == (415, code)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        pytest.param("", [], id="none"),
        pytest.param("identity", [], id="identity"),
        pytest.param("gzip", ["gzip"], id="gzip"),
        pytest.param("GZIP, br", ["gzip", "br"], id="stacked-case"),
        pytest.param(" gzip , identity ", ["gzip"], id="identity-dropped"),
    ],
)
def test_codings(header: str, expected: list[str]) -> None:
    assert codings(header) == expected


@pytest.mark.parametrize(
    ("encoded", "applied", "expected"),
    [
        pytest.param(gzip.compress(DOC), ["gzip"], DOC, id="gzip"),
        pytest.param(gzip.compress(DOC), ["x-gzip"], DOC, id="x-gzip"),
        pytest.param(zlib.compress(DOC), ["deflate"], DOC, id="deflate-zlib"),
        pytest.param(raw_deflate(DOC), ["deflate"], DOC, id="deflate-raw"),
        pytest.param(brotli.compress(DOC), ["br"], DOC, id="br"),
        pytest.param(brotli.compress(gzip.compress(DOC)), ["gzip", "br"], DOC, id="gzip-then-br"),
        pytest.param(gzip.compress(b"x" * LIMIT), ["gzip"], b"x" * LIMIT, id="exactly-the-limit"),
        pytest.param(
            brotli.compress(b"x" * LIMIT), ["br"], b"x" * LIMIT, id="br-exactly-the-limit"
        ),
    ],
)
def test_decode(encoded: bytes, applied: list[str], expected: bytes) -> None:
    assert decode(encoded, applied, LIMIT) == expected


GZ = gzip.compress(DOC)
BR = brotli.compress(DOC)


@pytest.mark.parametrize(
    ("encoded", "applied", "status", "code"),
    [
        pytest.param(DOC, ["compress"], 415, "unsupported_content_encoding", id="compress"),
        pytest.param(DOC, ["zstd"], 415, "unsupported_content_encoding", id="zstd"),
        pytest.param(bomb(gzip.compress), ["gzip"], 413, "body_too_large", id="gzip-bomb"),
        pytest.param(bomb(zlib.compress), ["deflate"], 413, "body_too_large", id="deflate-bomb"),
        pytest.param(bomb(raw_deflate), ["deflate"], 413, "body_too_large", id="raw-deflate-bomb"),
        pytest.param(bomb(brotli.compress), ["br"], 413, "body_too_large", id="br-bomb"),
        pytest.param(
            gzip.compress(b"x" * (LIMIT + 1)), ["gzip"], 413, "body_too_large", id="limit-plus-one"
        ),
        pytest.param(DOC, ["gzip"], 400, "invalid_content_encoding", id="gzip-not-gzip"),
        pytest.param(
            GZ[:10] + b"\xff" * 8 + GZ[18:], ["gzip"], 400, "invalid_content_encoding", id="corrupt"
        ),
        pytest.param(GZ[:-6], ["gzip"], 400, "invalid_content_encoding", id="gzip-truncated"),
        pytest.param(b"", ["gzip"], 400, "invalid_content_encoding", id="gzip-empty"),
        pytest.param(GZ + b"junk", ["gzip"], 400, "invalid_content_encoding", id="gzip-trailing"),
        pytest.param(DOC, ["deflate"], 400, "invalid_content_encoding", id="deflate-corrupt"),
        pytest.param(BR[:-3], ["br"], 400, "invalid_content_encoding", id="br-truncated"),
        pytest.param(b"\xff" * 16, ["br"], 400, "invalid_content_encoding", id="br-corrupt"),
        pytest.param(BR + b"junk", ["br"], 400, "invalid_content_encoding", id="br-trailing"),
        pytest.param(b"", ["br"], 400, "invalid_content_encoding", id="br-empty"),
    ],
)
def test_decode_refused(encoded: bytes, applied: list[str], status: int, code: str) -> None:
    with pytest.raises(BodyError) as caught:
        decode(encoded, applied, LIMIT)
    assert (caught.value.status, caught.value.code) == (status, code)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(DOC, {"model": "m", "input": "hello"}, id="string-input"),
        pytest.param(b'{"input": []}', {"input": []}, id="array-input"),
        pytest.param(b'{"model": "m"}', {"model": "m"}, id="no-input"),
        pytest.param(b' \r\n\t{"a": 1}\n ', {"a": 1}, id="whitespace"),
        pytest.param(b'{"a": "\\ud83d\\ude00"}', {"a": "\U0001f600"}, id="surrogate-pair"),
        pytest.param('{"a": "é"}'.encode(), {"a": "é"}, id="utf-8"),
    ],
)
def test_parse(raw: bytes, expected: dict[str, Any]) -> None:
    assert parse(raw) == expected


def test_a_big_integer_is_read_exactly_where_it_is_forwarded() -> None:
    """An integer past 64 bits is read exactly, and goes on exactly when the body is stripped."""
    raw = b'{"n": 100000000000000000000000, "input": [{"role": "user", "content": "hi"}]}'
    parsed = parse(raw)
    assert parsed["n"] == 10**23
    assert isinstance(parsed["n"], int)
    assert exact(raw)["n"] == 10**23
    forwarded = with_input(parsed, parsed["input"])
    assert forwarded == b'{"n":100000000000000000000000,"input":[{"role":"user","content":"hi"}]}'


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        pytest.param(b"", "invalid_json", id="empty"),
        pytest.param(b"model=m", "invalid_json", id="not-json"),
        pytest.param(b'{"input": [}', "invalid_json", id="bad-syntax"),
        pytest.param(b"{} {}", "invalid_json", id="trailing-data"),
        pytest.param(b'\xef\xbb\xbf{"a": 1}', "invalid_json", id="byte-order-mark"),
        pytest.param(b'{"a": 1, "a": 2}', "invalid_json", id="duplicate-key"),
        pytest.param(
            b'{"input": [{"type": "x", "call_id": "a", "call_id": "b"}]}',
            "invalid_json",
            id="duplicate-key-at-depth",
        ),
        pytest.param(b'{"a": NaN}', "invalid_json", id="nan"),
        pytest.param(b'{"a": Infinity}', "invalid_json", id="infinity"),
        pytest.param(b'{"a": -Infinity}', "invalid_json", id="minus-infinity"),
        pytest.param(b'{"a": 1e400}', "invalid_json", id="overflowing-number"),
        pytest.param(
            b'{"input": [{"x": [[{"y": -1e400}]]}]}', "invalid_json", id="overflow-at-depth"
        ),
        pytest.param(b'{"a": 1' + b"0" * 400 + b".5}", "invalid_json", id="overflow-by-digits"),
        pytest.param(b'{"a": 1' + b"0" * 5000 + b"}", "invalid_json", id="too-many-digits"),
        pytest.param(b'{"a": "\xff"}', "invalid_json", id="invalid-utf-8"),
        pytest.param(b'{"a": "\xed\xa0\x80"}', "invalid_json", id="utf-8-encoded-surrogate"),
        pytest.param(b'{"a": "\\ud800"}', "invalid_json", id="lone-high-surrogate"),
        pytest.param(b'{"a": "\\udc00x"}', "invalid_json", id="lone-low-surrogate"),
        pytest.param(b'{"\\ud800": 1}', "invalid_json", id="lone-surrogate-key"),
        pytest.param(b"[]", "invalid_body", id="array"),
        pytest.param(b'"input"', "invalid_body", id="string"),
        pytest.param(b"null", "invalid_body", id="null"),
        pytest.param(b'{"input": 1}', "invalid_input", id="input-number"),
        pytest.param(b'{"input": {"role": "user"}}', "invalid_input", id="input-object"),
        pytest.param(b'{"input": true}', "invalid_input", id="input-boolean"),
    ],
)
def test_parse_refused(raw: bytes, code: str) -> None:
    with pytest.raises(BodyError) as caught:
        parse(raw)
    assert (caught.value.status, caught.value.code) == (400, code)


@pytest.mark.parametrize("depth", [199, 200, 201, 500])
def test_nesting_the_fast_reader_refuses_is_read_exactly(depth: int) -> None:
    """The native reader stops at 200 levels; deeper bodies are still read, the slow way."""
    raw = b'{"a": ' + b"[" * depth + b"1" + b"]" * depth + b"}"
    assert parse(raw) == exact(raw)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param({"input": [{"role": "user", "content": "é"}]}, id="plain"),
        pytest.param({"n": 10**30, "m": -(10**30)}, id="beyond-64-bits"),
    ],
)
def test_dumps_is_compact_and_exact(value: dict[str, Any]) -> None:
    out = dumps(value)
    assert b" " not in out
    assert json.loads(out) == value


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(b"[" * 250 + b"]" * 250, id="past-jiters-200-levels"),
        pytest.param(b"[1e999]", id="past-a-double"),
        pytest.param(b'[{"a": 1, "a": 2}]', id="duplicate-key"),
        pytest.param(b"[1] 2", id="trailing-data"),
    ],
)
def test_a_part_of_a_body_is_read_alone_only_where_no_second_read_is_needed(doc: bytes) -> None:
    # Read alone, a body's items are nested a level less than in it: a part is taken only
    # where jiter reads it at once, never where the exact reader would have to decide.
    assert body.loads_shallow(doc) is None


def test_what_jiter_reads_at_once_is_read_alike_alone() -> None:
    doc = b'[{"type": "message", "n": 123456789012345678901234567890}]'
    assert body.loads_shallow(doc) == body.loads(doc)
    assert body.loads(b"null") is None


# Pieces of JSON text: numbers that overflow a double or not, integers beyond 64 bits, and
# strings that hold `null` literally, escaped, or split by an escape.
_NUMBERS = st.sampled_from(
    ["1", "-0.5", "1e308", "1e309", "-1e400", "1.8e308", "1E+999", "12345678901234567890123", "0"]
)
_STRINGS = st.sampled_from(
    ['"null"', '"\\null"', '"nul\\u006c"', '"\\u006eull"', '"a\\"null"', '"n\\u0000ull"', '"x"']
)
_SCALARS = st.one_of(_NUMBERS, _STRINGS, st.sampled_from(["null", "true", "false"]))


def _json_text(
    leaves: st.SearchStrategy[str], comma: str = ", ", colon: str = ": "
) -> st.SearchStrategy[str]:
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4).map(lambda xs: "[" + comma.join(xs) + "]"),
            st.lists(inner, max_size=4).map(
                lambda xs: "{" + comma.join(f'"k{i}"{colon}{x}' for i, x in enumerate(xs)) + "}"
            ),
        ),
        max_leaves=12,
    )


@settings(max_examples=400, deadline=None)
@given(_json_text(_SCALARS))
def test_a_body_is_told_free_of_infinities_as_a_walk_tells_it(text: str) -> None:
    # Small bodies are told by writing them again, large ones by the walk: both as the walk.
    raw = text.encode()
    value = jiter.from_json(raw, allow_inf_nan=False, catch_duplicate_keys=True)
    assert body._has_infinity(raw, value) == body._walk(value)
    padded = b'{"pad": "' + b"x" * 9000 + b'", "v": ' + raw + b"}"
    assert body._has_infinity(padded, {"pad": "x" * 9000, "v": value}) == body._walk(value)


@settings(max_examples=400, deadline=None)
@given(_json_text(_SCALARS, comma=",", colon=":"))
def test_a_compact_body_is_told_free_of_infinities_as_a_walk_tells_it(text: str) -> None:
    # Compact bodies are often written back byte for byte: told at once, unless a number
    # became an infinity (written `null`).
    raw = text.encode()
    value = jiter.from_json(raw, allow_inf_nan=False, catch_duplicate_keys=True)
    assert body._has_infinity(raw, value) == body._walk(value)
