"""Shared builders for the tests: tools, items, request bodies, bounds, audit records."""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import brotli
from yarl import URL

from proxy.gate.phrases import CHAT_BODY
from proxy.gate.verdict import Verdict

# Generous bounds that only stop a hang; nothing asserts how long anything took.
HANG_GUARD_S = 10
# The read deadlines of the proxies under test, and the validation budget: short, so that the
# tests that wait for one wait little.
DEADLINE_S = 0.5
BUDGET_S = 0.1
MiB = 1 << 20
POLL_S = 0.02


# Tools and items of the sales examples


SALES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["region"],
    "properties": {"region": {"type": "string", "enum": ["apac", "emea", "amer"]}},
}
# The original articles' lookup_order tool.
LOOKUP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^[A-Z]-\\d{4}$"},
        "include_lines": {"type": "boolean"},
    },
    "required": ["order_id", "include_lines"],
    "additionalProperties": False,
}
SALES_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_latest_sales_report",
    "description": "The latest sales report for a region.",
    "parameters": SALES_SCHEMA,
}


# The articles' two tools, without descriptions, and a web search the model ran.
ARTICLE_TOOLS = [
    {"type": "function", "name": "get_latest_sales_report", "parameters": SALES_SCHEMA},
    {"type": "function", "name": "lookup_order", "parameters": LOOKUP_SCHEMA},
]
WEB_SEARCH = {
    "type": "openai:web_search_call",
    "id": "ws_001",
    "status": "completed",
    "action": {"type": "search", "query": "apac sales report"},
}


def article_output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "sales report for apac"}


def sales_call(call_id: str, region: str = "apac", **extra: Any) -> dict[str, Any]:
    item = {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": "get_latest_sales_report",
        "status": "completed",
        "arguments": json.dumps({"region": region}),
    }
    return item | extra


def sales_output(call_id: str, output: str = "sales report") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


# Bodies


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


ENCODE: dict[str, Callable[[bytes], bytes]] = {
    "identity": lambda data: data,
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
}
# The sentence of the region enum violation, as every finding carries it.
REGION_MESSAGE = "region failed schema: expected one of apac, emea, amer"
FINDING = {
    "index": 2,
    "call_id": "call_1",
    "paired_index": 1,
    "name": "get_latest_sales_report",
    "reason": "arguments_schema",
    "pass": [],
    "fail": [{"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}],
    "message": REGION_MESSAGE,
}
UPSTREAM_ANSWER = {"object": "response", "id": "resp_1", "output": []}


# The review's amplification: one call whose array argument has 6,000 elements, each failing
# an enum of some 900 bytes (a 19 KB request that made a 12.5 MB answer).
WIDE_ENUM = [f"value_{n:03d}_padding" for n in range(45)]
PICK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"values": {"type": "array", "items": {"enum": WIDE_ENUM}}},
}
PICK_TOOL = {"type": "function", "name": "pick", "parameters": PICK_SCHEMA}


def pick_call(call_id: str, elements: int = 6000) -> dict[str, Any]:
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": "pick",
        "status": "completed",
        "arguments": json.dumps({"values": [0] * elements, "note": "fine"}),
    }


# A Chat Completions conversation, posted where a Responses body belongs, and its finding.
CHAT_MESSAGES = [
    {"role": "user", "content": "sales?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
    {"role": "tool", "tool_call_id": "c1", "content": "unverified"},
]
MESSAGES_FINDING = {
    "index": None,
    "call_id": None,
    "paired_index": None,
    "name": None,
    "reason": "envelope",
    "param": "messages",
    "message": CHAT_BODY,
}


def request_body(*items: Any, **fields: Any) -> dict[str, Any]:
    # Keys deliberately not in sorted order: a re-serialising proxy would show.
    return {"tools": [SALES_TOOL], "input": [USER, *items], "model": "gpt-test"} | fields


def clean_body(**fields: Any) -> dict[str, Any]:
    return request_body(sales_call("call_1"), sales_output("call_1"), **fields)


def failing_body(**fields: Any) -> dict[str, Any]:
    return request_body(sales_call("call_1", "mars"), sales_output("call_1"), **fields)


def odd_bytes(body: Any) -> bytes:
    """The body as some client might write it: tabs, spaces before commas, a CRLF at the end."""
    return json.dumps(body, indent="\t", separators=(" ,", " :  ")).encode() + b"\r\n"


def raw_deflate(data: bytes) -> bytes:
    """`data` as a raw DEFLATE stream, without zlib's header."""
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


def compact(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


AMPLIFYING = compact(
    {
        "model": "m",
        "tools": [PICK_TOOL],
        "input": [USER, pick_call("call_1"), sales_output("call_1")],
    }
)


def at(base: str, target: str) -> URL:
    """The URL of a raw target, sent exactly as written (no normalisation by the client)."""
    return URL(base + target, encoded=True)


def authority(url: str) -> str:
    return URL(url).raw_authority


async def stream_of(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


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


# Hostile bodies


EVIL = "a" * 40 + "!"


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


def fails(reason: str, *at: tuple[Any, ...]) -> tuple[str, list[dict[str, Any]] | None]:
    """The expected finding: its reason, and for arguments_schema its (path, reason) list, or
    (path, reason, expected) where the violation names what was expected."""
    if reason != "arguments_schema":
        return reason, None
    return reason, [
        {"path": path, "reason": why} | ({"expected": rest[0]} if rest else {})
        for path, why, *rest in at
    ]


# Items and requests for the gate's tables


APAC = '{"region":"apac"}'
GLOBAL = '{"region":"global"}'
DRAFT_07 = "http://json-schema.org/draft-07/schema#"


def call(
    call_id: str, arguments: Any = APAC, name: Any = "get_latest_sales_report", **extra: Any
) -> dict[str, Any]:
    item = {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "status": "completed",
        "arguments": arguments,
    }
    return item | extra


def without(item: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in keys}


def output(call_id: Any) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "sales report"}


def typeless(item: dict[str, Any]) -> dict[str, Any]:
    return without(item, "type")


def message(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def ref(item_id: str) -> dict[str, Any]:
    return {"type": "item_reference", "id": item_id}


def tool(parameters: Any, name: str = "get_latest_sales_report") -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": parameters}


# The gate's tables' tool: the sales report, without a description.
TOOLS = [tool(SALES_SCHEMA)]


def request(*input_items: Any, tools: Any = TOOLS, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "input": list(input_items), "tools": tools} | extra


def only(verdict: Verdict) -> dict[str, Any]:
    [finding] = verdict.findings
    return finding.as_dict()


# Audit records


# An audit record: DESIGN.md's fields, and `prev`, which chains it to the record before.
AUDIT_FIELDS = {
    "ts",
    "event",
    "request_id",
    "action",
    "transport",
    "upstream",
    "path",
    "model",
    "previous_response_id",
    "tenant",
    "body_sha256",
    "findings",
    "prev",
}


def audit_records(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "audit.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def audit_record(
    ts: str | None = "2026-11-29T09:04:59.897Z",
    *findings: dict[str, Any],
    action: str = "block",
    **fields: Any,
) -> dict[str, Any]:
    """An audit record as the proxy writes it (its `prev` left at 64 zeros); FINDING by default."""
    entry = {
        "ts": ts,
        "event": "replay_rejected",
        "request_id": "req_1",
        "action": action,
        "transport": "http",
        "path": "/v1/responses",
        "model": "m",
        "previous_response_id": None,
        "tenant": "t_0123456789abcdef",
        "body_sha256": "0" * 64,
        "findings": list(findings) or [FINDING],
        "prev": "0" * 64,
    }
    return entry | fields


def orphan_finding(call_id: str = "call_9") -> dict[str, Any]:
    return {"index": 1, "call_id": call_id, "paired_index": None, "name": None, "reason": "orphan"}
