"""Hostile requests and misbehaving peers, over real sockets on 127.0.0.1.

Every hostile request is answered (in the API's error shape, or by aiohttp's own 400 for a
request it cannot frame), the upstream receives none of it, and the next clean request goes
through. Every upstream or client fault gets its documented answer, and afterwards the proxy's
file descriptors and upstream connections are back where they were.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import logging
import os
import re
import socket
import struct
import sys
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import jsonschema
import pytest
from yarl import URL

from proxy.admission import body
from proxy.gate import strictjson
from proxy.gate.items import Item
from proxy.gate.policy import Policy
from proxy.gate.verdict import Verdict, inspect
from proxy.running.config_file import parse_config
from proxy.settings import ConfigError
from tests.conftest import (
    SALES_TOOL,
    RecordingUpstream,
    sales_call,
    sales_output,
)

# Generous bounds that only stop a hang; nothing here asserts how long anything took.
HANG_GUARD_S = 10
# The read deadlines of the proxies under test, and the validation budget: short, so that the
# tests that wait for one wait little.
DEADLINE_S = 0.5
BUDGET_S = 0.1
MiB = 1 << 20
POLL_S = 0.02

JSON_HEADERS = {"Content-Type": "application/json"}
USER = {"role": "user", "content": "How did APAC do last quarter?"}
CLEAN = json.dumps(
    {"model": "m", "tools": [SALES_TOOL], "input": [USER, sales_call("c1"), sales_output("c1")]}
).encode()
FAILING = json.dumps(
    {
        "model": "m",
        "tools": [SALES_TOOL],
        "input": [USER, sales_call("c1", "mars"), sales_output("c1")],
    }
).encode()


# Proxies and clients


ProxyStarter = Callable[..., Awaitable[str]]


@pytest.fixture
def tight_proxy(start_proxy: ProxyStarter) -> ProxyStarter:
    """Like `start_proxy`, with read deadlines of DEADLINE_S and a validation budget of BUDGET_S."""
    tight = {
        "gate": {"validation_timeout_s": BUDGET_S},
        "listen": {"header_timeout_s": DEADLINE_S},
        "limits": {"body_timeout_s": DEADLINE_S},
    }

    async def start(upstream: str, /, **sections: Any) -> str:
        for name, settings in tight.items():
            sections[name] = settings | sections.get(name, {})
        return await start_proxy(upstream, **sections)

    return start


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    # A connection per request: nothing pooled on the client's side skews the count of open
    # descriptors, and no request lands on a connection a short deadline has just closed.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        yield session


async def served_clean(
    client: aiohttp.ClientSession, base: str, upstream: RecordingUpstream
) -> None:
    """The proxy still forwards a clean request, whole."""
    before = len(upstream.received)
    async with client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS) as resp:
        assert resp.status == 200
        await resp.read()
    assert [r.body for r in upstream.received[before:]] == [CLEAN]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def eventually(check: Callable[[], bool]) -> bool:
    """Whether `check` holds within the hang guard: sockets take a moment to close.

    Polled, because nothing signals that the kernel has let go of a socket.
    """
    for _ in range(int(HANG_GUARD_S / POLL_S)):
        if check():
            return True
        await asyncio.sleep(POLL_S)
    return check()


async def fds_after(baseline: int) -> int:
    """The count of open descriptors, once it is back to `baseline` or the hang guard is up."""
    await eventually(lambda: open_fds() <= baseline)
    return open_fds()


# Raw HTTP on a socket


async def connect(base: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    url = URL(base)
    return await asyncio.open_connection(url.host, url.port)


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with suppress(ConnectionError):
        await writer.wait_closed()


async def read_to_eof(reader: asyncio.StreamReader) -> bytes:
    """Everything until the peer closes (a reset counts as closing)."""
    data = bytearray()
    with suppress(ConnectionError):
        while chunk := await reader.read(65536):
            data += chunk
    return bytes(data)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, Any]:
        assert self.headers["content-type"].startswith("application/json")
        error: dict[str, Any] = json.loads(self.body)["error"]
        return error


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    """One HTTP/1.1 answer with a Content-Length (every answer these tests read has one)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = {
        name.strip().lower(): value.strip()
        for name, _, value in (line.partition(":") for line in lines)
    }
    data = await reader.readexactly(int(headers["content-length"]))
    return Answer(int(status_line.split()[1]), headers, data)


def request_head(target: str = "/v1/responses", **headers: str | int) -> bytes:
    lines = [f"POST {target} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunked(data: bytes, size: int = 1) -> bytes:
    """`data` in chunks of `size` bytes, and the last chunk."""
    chunks = (data[i : i + size] for i in range(0, len(data), size))
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


# A 10 GiB gzip bomb, a few hundred bytes on the wire


def crc32_of_zeros(size: int) -> int:
    """`zlib.crc32(bytes(size))` without the bytes.

    Feeding a zero byte to the CRC register is a linear map over GF(2): the map for one byte,
    raised to the power `size` by squaring (zlib's `crc32_combine` works the same way).
    """

    def apply(columns: list[int], vector: int) -> int:
        out = 0
        for column in columns:
            if vector & 1:
                out ^= column
            vector >>= 1
        return out

    # zlib.crc32(data, v) == ~register(data, ~v): column i is the register after one zero
    # byte, started at bit i.
    one = [zlib.crc32(b"\0", ~(1 << i) & 0xFFFFFFFF) ^ 0xFFFFFFFF for i in range(32)]
    power, result = one, [1 << i for i in range(32)]
    while size:
        if size & 1:
            result = [apply(power, column) for column in result]
        power = [apply(power, column) for column in power]
        size >>= 1
    return apply(result, 0xFFFFFFFF) ^ 0xFFFFFFFF


def gzip_of_zeros(mebibytes: int) -> bytes:
    """One gzip member of `mebibytes` MiB of zeros, from one compressed MiB repeated."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    # After a full flush the compressor starts afresh: every MiB compresses to this block.
    block = deflate.compress(bytes(MiB)) + deflate.flush(zlib.Z_FULL_FLUSH)
    size = mebibytes * MiB
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    trailer = struct.pack("<II", crc32_of_zeros(size), size & 0xFFFFFFFF)
    return header + block * mebibytes + deflate.flush() + trailer


# Three layers: 10 GiB of zeros, 10 MiB, 24 KiB, and about 560 bytes on the wire.
BOMB = gzip.compress(gzip.compress(gzip_of_zeros(10 * 1024), 9), 9)
BOMB_HEADERS = JSON_HEADERS | {"Content-Encoding": "gzip, gzip, gzip"}


@pytest.mark.parametrize("size", [0, 1, 255, 4096, 3 * MiB + 7])
def test_crc32_of_zeros(size: int) -> None:
    assert crc32_of_zeros(size) == zlib.crc32(bytes(size))


def test_the_bomb_is_a_valid_gzip_of_zeros() -> None:
    assert gzip.decompress(gzip_of_zeros(3)) == bytes(3 * MiB)
    assert len(BOMB) < 4096


def test_bomb_inflates_no_further_than_the_limit() -> None:
    limit = 16 * MiB
    tracemalloc.start()
    try:
        with pytest.raises(body.BodyError) as caught:
            body.decode(BOMB, ["gzip", "gzip", "gzip"], limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (caught.value.status, caught.value.code) == (413, "body_too_large")
    # The 10 MiB middle layer, the limit, and copies of them: never the 10 GiB.
    assert peak < 5 * limit


# 1. Hostile bodies: answered, never forwarded, and the proxy serves the next request

DEEP = 100_000
DIGITS = b"1" * 100_000
EVIL = "a" * 40 + "!"
RECURSIVE = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}


def replay(arguments: str, parameters: Any) -> bytes:
    """A request replaying one call of `lookup` with these arguments, under these parameters."""
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "lookup",
        "status": "completed",
        "arguments": arguments,
    }
    output = {"type": "function_call_output", "call_id": "call_1", "output": "found"}
    tool = {"type": "function", "name": "lookup", "parameters": parameters}
    return json.dumps({"model": "m", "tools": [tool], "input": [USER, call, output]}).encode()


def fails(reason: str, *at: tuple[str, str]) -> tuple[str, list[dict[str, str]] | None]:
    """The expected finding: its reason, and for arguments_schema its (path, reason) list."""
    if reason != "arguments_schema":
        return reason, None
    return reason, [{"path": path, "reason": why} for path, why in at]


HOSTILE = [
    pytest.param(
        JSON_HEADERS,
        b'{"input":' + b"[" * DEEP + b"]" * DEEP + b"}",
        400,
        "invalid_json",
        None,
        id="arrays-nested-100k-deep",
    ),
    pytest.param(
        JSON_HEADERS,
        b'{"a":' * DEEP + b"1" + b"}" * DEEP,
        400,
        "invalid_json",
        None,
        id="objects-nested-100k-deep",
    ),
    pytest.param(BOMB_HEADERS, BOMB, 413, "body_too_large", None, id="gzip-bomb-of-10-gib"),
    pytest.param(
        JSON_HEADERS,
        b'{"input":[],"temperature":' + DIGITS + b"}",
        400,
        "invalid_json",
        None,
        id="integer-of-100k-digits",
    ),
    pytest.param(
        JSON_HEADERS,
        b'{"input":[{"role":"user","content":"hi","n":-' + DIGITS + b"}]}",
        400,
        "invalid_json",
        None,
        id="negative-integer-of-100k-digits-in-an-item",
    ),
    pytest.param(
        JSON_HEADERS, b'{"input":"\xc0\xaf"}', 400, "invalid_json", None, id="utf-8-overlong"
    ),
    pytest.param(
        JSON_HEADERS,
        b'{"input":"\xed\xa0\x80"}',
        400,
        "invalid_json",
        None,
        id="utf-8-encoded-surrogate",
    ),
    pytest.param(
        JSON_HEADERS,
        b'{"input":"\xf4\x90\x80\x80"}',
        400,
        "invalid_json",
        None,
        id="utf-8-beyond-u10ffff",
    ),
    pytest.param(
        JSON_HEADERS, b'{"input":"ab\xe2\x82"}', 400, "invalid_json", None, id="utf-8-truncated"
    ),
    pytest.param(
        JSON_HEADERS, b'{"\xff":1,"input":[]}', 400, "invalid_json", None, id="utf-8-bad-in-key"
    ),
    pytest.param(
        JSON_HEADERS,
        b'{"\\ud800":1,"input":[]}',
        400,
        "invalid_json",
        None,
        id="lone-surrogate-in-a-key",
    ),
    pytest.param(
        JSON_HEADERS,
        b'{"input":[{"role":"user","content":"\\udfff"}]}',
        400,
        "invalid_json",
        None,
        id="lone-surrogate-in-a-value",
    ),
    pytest.param(
        JSON_HEADERS,
        b'{"input":"\\udc00\\ud800"}',
        400,
        "invalid_json",
        None,
        id="surrogates-swapped",
    ),
    # Inside `arguments`: the body is fine, the replayed call is not.
    pytest.param(
        JSON_HEADERS,
        replay("[" * DEEP + "]" * DEEP, {}),
        400,
        "replay_rejected",
        fails("arguments_parse"),
        id="arguments-nested-100k-deep",
    ),
    pytest.param(
        JSON_HEADERS,
        replay('{"n":' + DIGITS.decode() + "}", {}),
        400,
        "replay_rejected",
        fails("arguments_parse"),
        id="arguments-with-an-integer-of-100k-digits",
    ),
    pytest.param(
        JSON_HEADERS,
        replay('{"\\ud800":1}', {}),
        400,
        "replay_rejected",
        fails("arguments_parse"),
        id="arguments-with-a-lone-surrogate-key",
    ),
    pytest.param(
        JSON_HEADERS,
        replay('{"q":"\\udc00"}', {}),
        400,
        "replay_rejected",
        fails("arguments_parse"),
        id="arguments-with-a-lone-surrogate-value",
    ),
    pytest.param(
        JSON_HEADERS,
        replay("{}", RECURSIVE),
        400,
        "replay_rejected",
        fails("arguments_schema", ("", "schema_unusable")),
        id="tool-schema-with-a-recursive-ref",
    ),
    # Exponential for the standard library's matcher, which no timeout stops.
    pytest.param(
        JSON_HEADERS,
        replay(json.dumps({"q": EVIL}), {"properties": {"q": {"pattern": "^(a+)+$"}}}),
        400,
        "replay_rejected",
        fails("arguments_schema", ("/q", "pattern")),
        id="pattern-nested-quantifier",
    ),
    # Exponential for every backtracking matcher: it runs out of the validation budget.
    pytest.param(
        JSON_HEADERS,
        replay(json.dumps({"q": EVIL}), {"properties": {"q": {"pattern": "^(a|a)*$"}}}),
        400,
        "replay_rejected",
        fails("arguments_schema", ("/q", "pattern_timeout")),
        id="pattern-overlapping-alternatives",
    ),
    pytest.param(
        JSON_HEADERS,
        replay(json.dumps({EVIL: 1}), {"patternProperties": {"^(a|a)*$": {"type": "string"}}}),
        400,
        "replay_rejected",
        fails("arguments_schema", (f"/{EVIL}", "pattern_timeout")),
        id="pattern-properties-overlapping-alternatives",
    ),
    pytest.param(
        JSON_HEADERS,
        replay(
            json.dumps({EVIL: 1}),
            {"additionalProperties": False, "patternProperties": {"^(a|a)*$": {}}},
        ),
        400,
        "replay_rejected",
        fails("arguments_schema", ("", "pattern_timeout")),
        id="additional-properties-beside-overlapping-alternatives",
    ),
    pytest.param(
        JSON_HEADERS,
        replay("{}", {"unevaluatedProperties": False, "patternProperties": {"^(a|a)*$": {}}}),
        400,
        "replay_rejected",
        fails("arguments_schema", ("", "invalid_schema")),
        id="unevaluated-properties-beside-pattern-properties",
    ),
]


@pytest.mark.parametrize(("headers", "data", "status", "code", "finding"), HOSTILE)
async def test_hostile_body_is_answered_and_never_forwarded(
    recording_upstream: RecordingUpstream,
    tight_proxy: ProxyStarter,
    client: aiohttp.ClientSession,
    headers: dict[str, str],
    data: bytes,
    status: int,
    code: str,
    finding: tuple[str, list[dict[str, str]] | None] | None,
) -> None:
    base = await tight_proxy(recording_upstream.url)

    async with client.post(f"{base}/v1/responses", data=data, headers=headers) as resp:
        assert resp.status == status
        assert resp.content_type == "application/json"
        error = (await resp.json())["error"]

    assert error["code"] == code
    if finding is not None:
        [found] = error["findings"]
        assert (found["reason"], found.get("fail")) == finding
    assert recording_upstream.received == []
    await served_clean(client, base, recording_upstream)


def test_unique_items_over_twenty_thousand_objects() -> None:
    # jsonschema compares objects pairwise: for 20 000 of them, 200 million comparisons.
    rows = [{"i": i} for i in range(20_000)]
    parameters = {"properties": {"rows": {"uniqueItems": True}}}
    policy = Policy()
    unique = inspect(json.loads(replay(json.dumps({"rows": rows}), parameters)), policy)
    assert unique == Verdict("forward")
    repeated = json.dumps({"rows": [*rows, {"i": 7.0}]})  # 7.0 == 7 in JSON Schema
    [finding] = inspect(json.loads(replay(repeated, parameters)), policy).findings
    assert [v.as_dict() for v in finding.fail] == [{"path": "/rows", "reason": "uniqueItems"}]


@pytest.mark.parametrize(
    "rows",
    [
        pytest.param([1, True], id="true-is-not-1"),
        pytest.param([0, False], id="false-is-not-0"),
        pytest.param([1, 1.0], id="1-is-1.0"),
        pytest.param([[1], [True]], id="nested-bool"),
        pytest.param([{"a": [1]}, {"a": [1.0]}], id="nested-number"),
        pytest.param([{"a": 1, "b": 2}, {"b": 2, "a": 1}], id="key-order"),
        pytest.param(["1", 1], id="string-is-not-number"),
        pytest.param([None, None], id="nulls"),
        pytest.param([{}, []], id="empty-object-and-array"),
    ],
)
def test_unique_items_agrees_with_jsonschema(rows: list[Any]) -> None:
    parameters = {"properties": {"rows": {"uniqueItems": True}}}
    expected = jsonschema.Draft202012Validator(parameters).is_valid({"rows": rows})
    verdict = inspect(json.loads(replay(json.dumps({"rows": rows}), parameters)), Policy())
    assert (verdict.outcome == "forward") == expected


def test_integer_bound_holds_without_the_interpreters() -> None:
    # PYTHONINTMAXSTRDIGITS=0 lifts CPython's own bound: int() would then take quadratic time.
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        with pytest.raises(strictjson.StrictJSONError, match="Exceeds the limit"):
            strictjson.loads(DIGITS)
        assert strictjson.loads(b"9" * strictjson.MAX_DIGITS) == int("9" * strictjson.MAX_DIGITS)
    finally:
        sys.set_int_max_str_digits(previous)


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param(RECURSIVE, id="recursive-ref"),
        pytest.param({"$ref": "#"}, id="ref-to-itself"),
        pytest.param({"anyOf": [{"type": "string"}, {"$ref": "#"}]}, id="ref-cycle-in-anyof"),
        pytest.param(
            {"unevaluatedProperties": False, "patternProperties": {"^x": {}}},
            id="unevaluated-beside-pattern-properties",
        ),
    ],
)
def test_pinned_schema_no_call_could_finish_stops_the_start(schema: Any) -> None:
    with pytest.raises(ConfigError, match=r"^tools\.lookup: not a valid JSON Schema"):
        parse_config({"tools": {"lookup": schema}})


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param(RECURSIVE, id="recursive-ref"),
        pytest.param({"$ref": "#"}, id="ref-to-itself"),
        pytest.param({"anyOf": [{"type": "string"}, {"$ref": "#"}]}, id="ref-cycle-in-anyof"),
    ],
)
def test_request_schema_no_call_could_finish_is_found_before_validating(schema: Any) -> None:
    # A budget spent before validation starts: only a check that does not validate can answer.
    policy = Policy(validation_timeout_s=1e-9)
    [finding] = inspect(json.loads(replay("{}", schema)), policy).findings
    assert [v.as_dict() for v in finding.fail] == [{"path": "", "reason": "schema_unusable"}]


def test_pinned_schema_recursing_through_values_is_accepted() -> None:
    # Recursion that descends into the value ends with the value: a tree of any depth.
    tree = {"type": "object", "properties": {"children": {"items": {"$ref": "#"}}}}
    config = parse_config({"tools": {"lookup": tree}})
    arguments = json.dumps({"children": [{"children": [{"children": []}]}]})
    verdict = inspect(json.loads(replay(arguments, {})), config.gate)
    assert verdict == Verdict("forward")


# 2. The validation budget: per request, and a timeout never lets a call through

TIMEOUTS = ("pattern_timeout", "validation_timeout")


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param({"pattern": "^(a|a)*$"}, id="pattern"),
        pytest.param({"not": {"pattern": "^(a|a)*$"}}, id="under-not"),
        pytest.param({"anyOf": [{"pattern": "^(a|a)*$"}, {"type": "string"}]}, id="under-anyof"),
        pytest.param({"if": {"pattern": "^(a|a)*$"}, "then": True, "else": True}, id="under-if"),
        pytest.param({"propertyNames": {"pattern": "^(a|a)*$"}}, id="property-names"),
    ],
)
def test_a_validation_that_runs_out_of_time_fails(schema: dict[str, Any]) -> None:
    # Under `not`, `anyOf` or `if`, an undecided match must not count as a decided one.
    parameters = {"properties": {"q": schema}}
    arguments = json.dumps({"q": EVIL} if "propertyNames" not in schema else {"q": {EVIL: 1}})
    verdict = inspect(
        json.loads(replay(arguments, parameters)), Policy(validation_timeout_s=BUDGET_S)
    )
    [finding] = verdict.findings
    assert verdict.outcome == "block"
    assert finding.reason == "arguments_schema"
    assert any(v.reason in TIMEOUTS for v in finding.fail)


def evil_pairs(count: int) -> list[Item]:
    found: list[Item] = []
    for i in range(count):
        arguments = json.dumps({"q": EVIL + str(i)})  # no two alike: no cached verdict
        call = {
            "type": "function_call",
            "call_id": f"call_{i}",
            "name": "lookup",
            "status": "completed",
            "arguments": arguments,
        }
        found += [call, {"type": "function_call_output", "call_id": f"call_{i}", "output": "x"}]
    return found


LOOKUP = {
    "type": "function",
    "name": "lookup",
    "parameters": {"properties": {"q": {"pattern": "^(a|a)*$"}}},
}


def test_the_budget_is_for_the_whole_request() -> None:
    policy = Policy(validation_timeout_s=BUDGET_S)
    request = {"tools": [LOOKUP], "input": [USER, *evil_pairs(20)]}
    verdict = inspect(request, policy)
    assert verdict.outcome == "block"
    # The first call spends the budget; the other nineteen are not even started.
    reasons = [[v.as_dict() for v in f.fail] for f in verdict.findings]
    assert reasons[0] == [{"path": "/q", "reason": "pattern_timeout"}]
    assert reasons[1:] == [[{"path": "", "reason": "validation_timeout"}]] * 19


def test_a_timeout_is_not_remembered_for_the_next_request() -> None:
    policy = Policy(validation_timeout_s=BUDGET_S)
    benign = {
        "type": "function_call",
        "call_id": "call_ok",
        "name": "lookup",
        "status": "completed",
        "arguments": json.dumps({"q": "aaa"}),
    }
    answered = {"type": "function_call_output", "call_id": "call_ok", "output": "x"}
    # A busy request spends its budget before the benign call comes up: it fails with it.
    busy = inspect({"tools": [LOOKUP], "input": [*evil_pairs(1), benign, answered]}, policy)
    assert [f.call_id for f in busy.findings] == ["call_0", "call_ok"]
    # Alone, with a budget of its own, the same call passes: the timeout was not cached.
    assert inspect({"tools": [LOOKUP], "input": [benign, answered]}, policy) == Verdict("forward")


# 3. Ten thousand items


NOTE = {"type": "function", "name": "note", "parameters": {"type": "object"}}


def many_items(pairs: int, *, last_arguments: str = "{}") -> list[Item]:
    """A user message, `pairs` calls of `note` each with its output, and a user message.

    Items kept short: the body stays under a MiB (see the test after next).
    """
    found: list[Item] = [USER]
    for i in range(pairs):
        arguments = last_arguments if i == pairs - 1 else "{}"
        call = {
            "type": "function_call",
            "call_id": f"c{i}",
            "name": "note",
            "status": "completed",
            "arguments": arguments,
        }
        found += [call, {"type": "function_call_output", "call_id": f"c{i}", "output": ""}]
    return [*found, {"role": "user", "content": "Thanks."}]


@pytest.mark.parametrize(
    ("action", "last_arguments", "status", "forwarded_items"),
    [
        pytest.param("block", "{}", 200, 10_000, id="clean"),
        pytest.param("block", "{", 400, None, id="last-call-fails-blocked"),
        pytest.param("strip", "{", 200, 9_998, id="last-call-fails-stripped"),
    ],
)
async def test_ten_thousand_items_are_gated(
    recording_upstream: RecordingUpstream,
    start_proxy: Callable[..., Awaitable[str]],
    client: aiohttp.ClientSession,
    action: str,
    last_arguments: str,
    status: int,
    forwarded_items: int | None,
) -> None:
    base = await start_proxy(recording_upstream.url, gate={"action": action})
    items = many_items(4_999, last_arguments=last_arguments)
    sent = json.dumps({"model": "m", "tools": [NOTE], "input": items}).encode()
    assert len(items) == 10_000

    async with client.post(f"{base}/v1/responses", data=sent, headers=JSON_HEADERS) as resp:
        assert resp.status == status
        answer = await resp.json()

    if forwarded_items is None:
        [finding] = answer["error"]["findings"]
        assert (finding["index"], finding["paired_index"]) == (9_998, 9_997)
        assert finding["reason"] == "arguments_parse"
        assert recording_upstream.received == []
        return
    [got] = recording_upstream.received
    assert len(got.json()["input"]) == forwarded_items
    if action == "block":
        assert got.body == sent


async def test_a_clean_body_over_a_mebibyte_is_forwarded(
    recording_upstream: RecordingUpstream,
    start_proxy: Callable[..., Awaitable[str]],
    client: aiohttp.ClientSession,
) -> None:
    base = await start_proxy(recording_upstream.url)
    sent = json.dumps({"model": "m", "input": [USER], "pad": "x" * (2 * MiB)}).encode()
    async with client.post(
        f"{base}/v1/responses", data=io.BytesIO(sent), headers=JSON_HEADERS
    ) as resp:
        assert resp.status == 200
    assert [r.body for r in recording_upstream.received] == [sent]


class CountingLedger:
    """A Recorded double over fixed upstream calls that counts its look-ups."""

    trust_unpaired = False

    def __init__(self, calls: Sequence[Item]) -> None:
        self.by_id = {call["id"]: call for call in calls}
        self.lookups = 0

    def calls(self, call_id: str) -> tuple[Item, ...]:
        return ()

    def item(self, item_id: str) -> Item | None:
        self.lookups += 1
        return self.by_id.get(item_id)

    def emitted_statuses(self, call: Item) -> tuple[str, ...]:
        return ()


def test_ten_thousand_item_references_are_each_resolved_once() -> None:
    calls = [sales_call(f"call_{i}") for i in range(5_000)]
    references = [{"type": "item_reference", "id": call["id"]} for call in calls]
    outputs = [sales_output(call["call_id"]) for call in calls]
    ledger = CountingLedger(calls)

    verdict = inspect({"tools": [SALES_TOOL], "input": [*references, *outputs]}, Policy(), ledger)

    assert verdict == Verdict("forward")
    # Resolving every reference again for every output would be 12.5 million look-ups.
    assert ledger.lookups == 5_000


@pytest.mark.parametrize("action", ["block", "strip"])
def test_ten_thousand_items_sharing_one_call_id(action: str) -> None:
    same = [sales_call("call_1") for _ in range(5_000)] + [sales_output("call_1")] * 5_000
    verdict = inspect({"tools": [SALES_TOOL], "input": same}, Policy(action=action))  # type: ignore[arg-type]
    assert [f.reason for f in verdict.findings] == ["duplicate_call_id"] * 5_000
    assert verdict.outcome == action
    assert verdict.input == ([] if action == "strip" else None)


# 4. Framing: tiny chunks, ambiguous lengths, bodies that stop


async def send_bytewise(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Every byte a write of its own, with the event loop turned between them."""
    for i in range(len(data)):
        writer.write(data[i : i + 1])
        await writer.drain()
        await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("sent", "status"),
    [pytest.param(CLEAN, 200, id="clean"), pytest.param(FAILING, 400, id="failing")],
)
async def test_body_in_thousands_of_one_byte_chunks(
    recording_upstream: RecordingUpstream,
    start_proxy: Callable[..., Awaitable[str]],
    sent: bytes,
    status: int,
) -> None:
    base = await start_proxy(recording_upstream.url)
    head = request_head(
        Content_Type="application/json", Transfer_Encoding="chunked", Connection="close"
    )
    reader, writer = await connect(base)
    try:
        await send_bytewise(writer, head + chunked(sent))
        answer = await asyncio.wait_for(read_answer(reader), HANG_GUARD_S)
    finally:
        await close(writer)

    assert answer.status == status
    if status == 200:
        [got] = recording_upstream.received
        assert (got.body, got.headers["Content-Length"]) == (sent, str(len(sent)))
    else:
        assert answer.error()["code"] == "replay_rejected"
        assert recording_upstream.received == []


FRAMING = [
    pytest.param(
        request_head(
            Content_Type="application/json",
            Content_Length=len(CLEAN),
            Transfer_Encoding="chunked",
        )
        + chunked(CLEAN, 64),
        id="content-length-and-transfer-encoding",
    ),
    pytest.param(
        request_head(Content_Type="application/json", Transfer_Encoding="chunked").replace(
            b"\r\n\r\n", f"\r\nContent-Length: {len(CLEAN)}\r\n\r\n".encode()
        )
        + chunked(CLEAN, 64),
        id="transfer-encoding-then-content-length",
    ),
    pytest.param(
        request_head(Content_Type="application/json", Content_Length=len(CLEAN)).replace(
            b"\r\n\r\n", b"\r\nContent-Length: 3\r\n\r\n"
        )
        + CLEAN,
        id="two-content-lengths",
    ),
    pytest.param(
        request_head(Content_Type="application/json", Transfer_Encoding="chunked")
        + b"zz\r\n"
        + CLEAN
        + b"\r\n0\r\n\r\n",
        id="chunk-size-not-hex",
    ),
    pytest.param(
        request_head(Content_Type="application/json", Content_Length="-1") + CLEAN,
        id="negative-content-length",
    ),
]


@pytest.mark.parametrize("request_bytes", FRAMING)
async def test_ambiguous_framing_is_refused_and_never_forwarded(
    recording_upstream: RecordingUpstream,
    start_proxy: Callable[..., Awaitable[str]],
    client: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    request_bytes: bytes,
) -> None:
    # aiohttp's parser refuses these before any of the proxy's code runs, with its own
    # text/plain 400 (the request never reaches a handler that could shape it), and closes.
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    base = await start_proxy(recording_upstream.url)
    reader, writer = await connect(base)
    try:
        writer.write(request_bytes)
        await writer.drain()
        answer = await asyncio.wait_for(read_to_eof(reader), HANG_GUARD_S)
    finally:
        await close(writer)

    assert answer.startswith((b"HTTP/1.0 400 ", b"HTTP/1.1 400 "))
    assert recording_upstream.received == []
    await served_clean(client, base, recording_upstream)
    # The client's fault is logged as such: one line, no traceback, not an error.
    (logged,) = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert logged.levelno <= logging.INFO
    assert logged.exc_info is None
    assert logged.getMessage().startswith("Error handling request from")


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_body_that_stops_midway_is_never_forwarded(
    recording_upstream: RecordingUpstream,
    start_proxy: Callable[..., Awaitable[str]],
    client: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    framing: str,
) -> None:
    base = await start_proxy(recording_upstream.url)
    await served_clean(client, base, recording_upstream)  # the upstream connection is pooled
    baseline = open_fds()
    if framing == "content-length":
        head = request_head(Content_Type="application/json", Content_Length=len(CLEAN) + 1000)
        part = CLEAN
    else:
        head = request_head(Content_Type="application/json", Transfer_Encoding="chunked")
        part = chunked(CLEAN, 64)[:-5]  # every chunk but the last
    reader, writer = await connect(base)
    try:
        # The interim answer says the handler is reading the body: then the client leaves.
        writer.write(head.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n"))
        await writer.drain()
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HANG_GUARD_S)
        assert interim.startswith(b"HTTP/1.1 100 ")
        writer.write(part)
        await writer.drain()
    finally:
        await close(writer)

    await served_clean(client, base, recording_upstream)
    assert [r.body for r in recording_upstream.received] == [CLEAN, CLEAN]
    assert await fds_after(baseline) <= baseline
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


# 5. Slow clients: cut off by the read deadlines, holding up no one meanwhile


@dataclass
class Trickle:
    """Sends `data` over `writer`: `first` bytes at once, the rest a byte at a time (or never)."""

    writer: asyncio.StreamWriter
    data: bytes
    first: int
    pace_s: float | None
    sent: int = 0

    async def run(self) -> None:
        self.writer.write(self.data[: self.first])
        self.sent = self.first
        if self.pace_s is None:
            return
        with suppress(ConnectionError):
            for i in range(self.first, len(self.data)):
                await asyncio.sleep(self.pace_s)
                self.writer.write(self.data[i : i + 1])
                await self.writer.drain()
                self.sent = i + 1


# A byte every 20 ms: soon enough for any timeout on the next byte, while the whole takes
# seconds, far past the deadline.
PACES = [pytest.param(None, id="stalls"), pytest.param(0.02, id="trickles")]


@pytest.mark.parametrize("pace_s", PACES)
async def test_slow_head_is_cut_off_and_holds_up_no_one(
    recording_upstream: RecordingUpstream,
    tight_proxy: ProxyStarter,
    client: aiohttp.ClientSession,
    pace_s: float | None,
) -> None:
    base = await tight_proxy(recording_upstream.url)
    await served_clean(client, base, recording_upstream)
    baseline = open_fds()
    head = request_head(
        Content_Type="application/json", Content_Length=len(CLEAN), X_Padding="p" * 500
    )
    reader, writer = await connect(base)
    slow = Trickle(writer, head, first=20, pace_s=pace_s)
    sending = asyncio.create_task(slow.run())
    try:
        await served_clean(client, base, recording_upstream)
        answer = await asyncio.wait_for(read_to_eof(reader), HANG_GUARD_S)
    finally:
        sending.cancel()
        with suppress(asyncio.CancelledError):
            await sending
        await close(writer)

    # Closed with no answer: aiohttp's keep-alive timer bounds the wait for a whole head.
    assert answer == b""
    assert slow.sent < len(head)
    assert [r.body for r in recording_upstream.received] == [CLEAN, CLEAN]
    assert await fds_after(baseline) <= baseline


@pytest.mark.parametrize(
    ("pace_s", "target", "extra"),
    [
        pytest.param(None, "/v1/responses", {}, id="stalls"),
        pytest.param(0.02, "/v1/responses", {}, id="trickles"),
        pytest.param(None, "/v1/responses/compact", {}, id="stalls-compact"),
        # A POST does not upgrade: it may not escape the deadline by saying it would.
        pytest.param(None, "/v1/responses", {"Upgrade": "websocket"}, id="stalls-saying-upgrade"),
    ],
)
async def test_slow_body_is_answered_408_and_holds_up_no_one(
    recording_upstream: RecordingUpstream,
    tight_proxy: ProxyStarter,
    client: aiohttp.ClientSession,
    pace_s: float | None,
    target: str,
    extra: dict[str, str],
) -> None:
    base = await tight_proxy(recording_upstream.url)
    await served_clean(client, base, recording_upstream)
    baseline = open_fds()
    head = request_head(target, Content_Type="application/json", Content_Length=len(CLEAN), **extra)
    reader, writer = await connect(base)
    slow = Trickle(writer, head + CLEAN, first=len(head) + 10, pace_s=pace_s)
    sending = asyncio.create_task(slow.run())
    try:
        await served_clean(client, base, recording_upstream)
        answer = await asyncio.wait_for(read_answer(reader), HANG_GUARD_S)
    finally:
        sending.cancel()
        with suppress(asyncio.CancelledError):
            await sending
        await close(writer)

    assert answer.status == 408
    assert answer.error()["code"] == "body_timeout"
    assert slow.sent < len(head + CLEAN)
    assert [r.body for r in recording_upstream.received] == [CLEAN, CLEAN]
    assert await fds_after(baseline) <= baseline


async def test_a_body_read_in_time_may_take_longer_upstream(
    recording_upstream: RecordingUpstream,
    tight_proxy: ProxyStarter,
    client: aiohttp.ClientSession,
) -> None:
    # The body deadline ends with the body: the upstream may take longer than it to answer.
    answered = asyncio.Event()

    async def slow_answer(request: Any, received: Any) -> aiohttp.web.StreamResponse:
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(3):
            await asyncio.sleep(DEADLINE_S / 2)
            await response.write(b"data: tick\n\n")
        answered.set()
        return response

    recording_upstream.handler = slow_answer
    base = await tight_proxy(recording_upstream.url)
    async with client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS) as resp:
        assert resp.status == 200
        assert await resp.read() == b"data: tick\n\n" * 3
    assert answered.is_set()


# 6. Faults: a misbehaving upstream, a client that leaves


Behaviour = Callable[[asyncio.StreamReader, asyncio.StreamWriter, asyncio.Event], Awaitable[None]]

OK_BODY = b'{"object":"response","id":"resp_ok","output":[]}'
JSON_BODY = json.dumps({"object": "response", "id": "resp_2", "output": [], "pad": "x" * 200})
SSE_BODY = b"".join(
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","n":%d}\n\n' % n
    for n in range(3)
)


def answer_head(content_type: bytes, framing: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\n%s\r\nConnection: close\r\n\r\n" % (
        content_type,
        framing,
    )


JSON_ANSWER = answer_head(b"application/json", b"Content-Length: %d" % len(JSON_BODY))
SSE_ANSWER = answer_head(b"text/event-stream", b"Transfer-Encoding: chunked")


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset instead of a FIN."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def answer_ok(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proceed: asyncio.Event
) -> None:
    writer.write(answer_head(b"application/json", b"Content-Length: %d" % len(OK_BODY)) + OK_BODY)
    await writer.drain()


async def garbage(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proceed: asyncio.Event
) -> None:
    writer.write(b"SSH-2.0-OpenSSH_9.6\r\nthis is not HTTP\r\n\r\n")
    await writer.drain()


async def hang_up(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proceed: asyncio.Event
) -> None:
    pass


async def reset_at_once(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proceed: asyncio.Event
) -> None:
    reset(writer)


def partly(data: bytes, *, with_reset: bool) -> Behaviour:
    """Send `data`; once the client has seen it (`proceed`), reset or close the connection."""

    async def behave(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proceed: asyncio.Event
    ) -> None:
        writer.write(data)
        await writer.drain()
        await asyncio.wait_for(proceed.wait(), HANG_GUARD_S)
        if with_reset:
            reset(writer)

    return behave


def bytewise(data: bytes) -> Behaviour:
    """Send `data` a byte at a time, in all longer than the proxy's read timeout."""

    async def behave(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proceed: asyncio.Event
    ) -> None:
        for i in range(len(data)):
            writer.write(data[i : i + 1])
            await writer.drain()
            await asyncio.sleep(DEADLINE_S * 2 / len(data))

    return behave


async def stream_until_gone(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proceed: asyncio.Event
) -> None:
    writer.write(SSE_ANSWER + chunked(SSE_BODY, 1 << 20)[:-5])
    await writer.drain()
    # The stream stays open until the proxy closes its end.
    await asyncio.wait_for(read_to_eof(reader), HANG_GUARD_S)


@dataclass
class RawUpstream:
    """An upstream on bare sockets: the first request gets `first`, later ones a plain answer.

    `whole` keeps each request it read whole; `open` counts its open connections.
    """

    first: Behaviour
    url: str = ""
    whole: list[bytes] = field(default_factory=list)
    open: int = 0
    heads: int = 0
    head_read: asyncio.Event = field(default_factory=asyncio.Event)
    proceed: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.heads += 1
            self.head_read.set()
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            request = head + await reader.readexactly(int(length[1]) if length else 0)
            self.whole.append(request)
            behave = self.first if self.heads == 1 else answer_ok
            await behave(reader, writer, self.proceed)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            await close(writer)
            self.open -= 1


@pytest.fixture
async def raw_upstream() -> AsyncIterator[Callable[[Behaviour], Awaitable[RawUpstream]]]:
    servers: list[asyncio.Server] = []

    async def start(first: Behaviour) -> RawUpstream:
        upstream = RawUpstream(first)
        server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        upstream.url = f"http://127.0.0.1:{port}"
        return upstream

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


@dataclass(frozen=True)
class Refused:
    """The proxy answers the error itself."""

    status: int
    code: str


@dataclass(frozen=True)
class Cut:
    """The answer starts (`part`), then the client's connection is cut: never a clean end."""

    part: bytes


@dataclass(frozen=True)
class Whole:
    body: bytes


CUT_JSON = JSON_ANSWER + JSON_BODY.encode()[:50]
CUT_SSE = SSE_ANSWER + chunked(SSE_BODY[:90], 1 << 20)[:-5]
FAULTS = [
    pytest.param(garbage, Refused(502, "upstream_bad_response"), id="answers-garbage"),
    pytest.param(hang_up, Refused(502, "upstream_unreachable"), id="hangs-up-at-once"),
    pytest.param(reset_at_once, Refused(502, "upstream_unreachable"), id="resets-at-once"),
    pytest.param(partly(CUT_JSON, with_reset=True), Cut(b'{"object"'), id="resets-mid-body"),
    pytest.param(partly(CUT_JSON, with_reset=False), Cut(b'{"object"'), id="closes-mid-body"),
    pytest.param(partly(CUT_SSE, with_reset=True), Cut(SSE_BODY[:90]), id="resets-mid-stream"),
    pytest.param(
        bytewise(JSON_ANSWER + JSON_BODY.encode()),
        Whole(JSON_BODY.encode()),
        id="answers-a-byte-at-a-time",
    ),
    pytest.param(
        bytewise(SSE_ANSWER + chunked(SSE_BODY, 7)), Whole(SSE_BODY), id="streams-a-byte-at-a-time"
    ),
]


@pytest.mark.parametrize(("first", "expected"), FAULTS)
async def test_upstream_fault_gets_its_answer_and_leaks_nothing(
    raw_upstream: Callable[[Behaviour], Awaitable[RawUpstream]],
    start_proxy: Callable[..., Awaitable[str]],
    client: aiohttp.ClientSession,
    first: Behaviour,
    expected: Refused | Cut | Whole,
) -> None:
    upstream = await raw_upstream(first)
    base = await start_proxy(upstream.url, upstream={"read_timeout_s": DEADLINE_S})
    baseline = open_fds()

    async with client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS) as resp:
        if isinstance(expected, Refused):
            assert resp.status == expected.status
            assert (await resp.json())["error"]["code"] == expected.code
        elif isinstance(expected, Cut):
            assert resp.status == 200
            part = resp.content.readexactly(len(expected.part))
            got = await asyncio.wait_for(part, HANG_GUARD_S)
            assert got == expected.part
            upstream.proceed.set()
            with pytest.raises(aiohttp.ClientPayloadError):
                await asyncio.wait_for(resp.read(), HANG_GUARD_S)
        else:
            assert resp.status == 200
            assert await resp.read() == expected.body

    async with client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS) as resp:
        assert (resp.status, await resp.read()) == (200, OK_BODY)
    assert [request.endswith(CLEAN) for request in upstream.whole] == [True, True]
    assert await eventually(lambda: upstream.open == 0)
    assert await fds_after(baseline) <= baseline


async def test_client_leaving_mid_upload_aborts_the_upstream_request(
    raw_upstream: Callable[[Behaviour], Awaitable[RawUpstream]],
    start_proxy: Callable[..., Awaitable[str]],
    client: aiohttp.ClientSession,
) -> None:
    # A pass-through body streams upstream as it arrives: the upstream has the head already.
    upstream = await raw_upstream(answer_ok)
    base = await start_proxy(upstream.url)
    baseline = open_fds()
    _, writer = await connect(base)
    try:
        writer.write(request_head("/v1/files", Content_Length=100_000) + b"x" * 1000)
        await writer.drain()
        await asyncio.wait_for(upstream.head_read.wait(), HANG_GUARD_S)
    finally:
        await close(writer)

    assert await eventually(lambda: upstream.open == 0)
    assert upstream.whole == []  # the upstream never took a part for the whole
    async with client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS) as resp:
        assert (resp.status, await resp.read()) == (200, OK_BODY)
    assert await eventually(lambda: upstream.open == 0)
    assert await fds_after(baseline) <= baseline


async def test_client_leaving_mid_stream_releases_the_upstream(
    raw_upstream: Callable[[Behaviour], Awaitable[RawUpstream]],
    start_proxy: Callable[..., Awaitable[str]],
    client: aiohttp.ClientSession,
) -> None:
    upstream = await raw_upstream(stream_until_gone)
    base = await start_proxy(upstream.url)
    baseline = open_fds()

    async with client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS) as resp:
        assert resp.status == 200
        first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), HANG_GUARD_S)
        assert SSE_BODY.startswith(first)
        resp.close()  # the client hangs up mid-stream

    # The upstream sees the proxy close its end, and nothing is left open.
    assert await eventually(lambda: upstream.open == 0)
    async with client.post(f"{base}/v1/responses", data=CLEAN, headers=JSON_HEADERS) as resp:
        assert (resp.status, await resp.read()) == (200, OK_BODY)
    assert await eventually(lambda: upstream.open == 0)
    assert await fds_after(baseline) <= baseline
