"""Fuzzing the body reader and the gate from raw bytes, as a client could send them.

Two properties: reading a body raises nothing but `BodyError`, and what the proxy reads is what
a plain JSON parser (any upstream's) reads; and what the gate lets go upstream, read as the
upstream reads it, holds no `function_call_output` whose call fails the gate, judged by an
oracle written apart from the gate.

The suite runs a bounded, derandomized number of examples. A longer, random run:

    FUZZ_EXAMPLES=100000 pytest tests/admission/test_fuzz.py --timeout=0

(a failure prints a `@reproduce_failure` line that replays it).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import zlib
from collections.abc import Callable
from typing import Any

import brotli
import jsonschema
import referencing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy import body
from proxy.gate import Policy, inspect

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    # The suite's run is the same every time; a longer run explores afresh.
    derandomize="FUZZ_EXAMPLES" not in os.environ,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# What a request body is made of


ROLL = st.integers(0, 3)


def rarely(draw: st.DrawFn) -> bool:
    """True once in four: on the largest roll, as Hypothesis favours small ones."""
    return bool(draw(ROLL) == 3)


@st.composite
def mostly(draw: st.DrawFn, common: st.SearchStrategy[Any], rare: st.SearchStrategy[Any]) -> Any:
    """`common` three times in four: most pairs are well formed, and most of those pass."""
    return draw(rare) if rarely(draw) else draw(common)


CALL_IDS = mostly(
    st.sampled_from([f"c{i}" for i in range(1, 9)]), st.sampled_from(["c1", None, 1, "fc_1"])
)
LOOKUP = {
    "type": "object",
    "properties": {"q": {"type": "string", "pattern": "^a+$"}},
    "required": ["q"],
    "additionalProperties": False,
}
SCHEMAS = st.sampled_from(
    [
        LOOKUP,
        {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
        {"properties": {"rows": {"type": "array", "uniqueItems": True}}},
        {"$ref": "#/$defs/a", "$defs": {"a": {"type": "object", "minProperties": 1}}},
        {"$schema": "http://json-schema.org/draft-07/schema#", "enum": [{"q": "a"}]},
        {"not": {"required": ["q"]}},
        {"$ref": "#/$defs/missing"},
        {"type": 12},
        {},
        True,
        False,
    ]
)
ARGUMENTS = mostly(
    st.sampled_from(['{"q":"a"}', '{"q":"aaa"}']),
    mostly(
        st.sampled_from(['{"q":"b"}', '{"q":"a","x":1}', "{}", '{"q":"a","q":"a"}']),
        st.sampled_from(
            [
                '{"x1":1}',
                '{"x1":"one"}',
                '{"rows":[1,true]}',
                '{"rows":[1,1.0]}',
                '{"rows":[{"a":1},{"a":1}]}',
                '{"q":NaN}',
                '{"q":"\\ud800"}',
                '{"n":1e999}',
                '{"n":' + "9" * 30 + "}",
                "[]",
                "",
                "{",
            ]
        ),
    ),
)
NAMES = mostly(st.just("lookup"), st.sampled_from(["search", "missing"]))
TOOL = st.one_of(
    st.fixed_dictionaries({"type": st.just("function"), "name": NAMES, "parameters": SCHEMAS}),
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": NAMES, "parameters": SCHEMAS}),
        }
    ),
)
TOOLS = mostly(
    st.just([{"type": "function", "name": "lookup", "parameters": LOOKUP}]),
    st.lists(TOOL, max_size=3),
)
CALLS = st.fixed_dictionaries(
    {
        "type": mostly(st.just("function_call"), st.sampled_from(["acme:call", "message"])),
        "call_id": CALL_IDS,
        "name": NAMES,
        "arguments": ARGUMENTS,
        "status": mostly(st.just("completed"), st.sampled_from(["in_progress", "incomplete"])),
    },
    optional={"id": st.sampled_from(["fc_1", "fc_2"])},
)
OUTPUTS = mostly(
    st.fixed_dictionaries(
        {"type": st.just("function_call_output"), "call_id": CALL_IDS, "output": st.just("ok")}
    ),
    st.one_of(
        st.fixed_dictionaries(
            {
                "type": st.just("function_call_output"),
                "call_id": CALL_IDS,
                "tool_call_id": CALL_IDS,
            }
        ),
        # The spec's default `type`: a lenient upstream reads it as a function_call_output.
        st.fixed_dictionaries({"call_id": CALL_IDS, "output": st.just("ok")}),
    ),
)
OTHERS = st.sampled_from(
    [
        {"role": "user", "content": "hi"},
        {"role": "tool", "content": "x", "tool_call_id": "c1"},
        {"role": "assistant", "tool_calls": []},
        {"type": "item_reference", "id": "fc_1"},
        {"id": "c2"},
        {"type": "reasoning", "id": "c3"},
    ]
)


@st.composite
def input_items(draw: st.DrawFn) -> list[Any]:
    """Segments: mostly a call answered by its output (under a call_id of its own, mostly),
    else a call, an output or another item or two, or a call given twice and answered."""
    found: list[Any] = []
    for segment in range(draw(st.integers(0, 5))):
        if rarely(draw):
            found += draw(st.lists(CALLS | OUTPUTS | OTHERS, min_size=1, max_size=2))
            continue
        call, output = draw(CALLS), draw(OUTPUTS)
        if not rarely(draw):
            call["call_id"] = f"pair{segment}"
        twice = [call] if rarely(draw) else []
        found += [*twice, call, output | {"call_id": call["call_id"]}]
    return found


BODIES = st.fixed_dictionaries({"model": st.just("m"), "tools": TOOLS, "input": input_items()})

# Byte-level damage: what a careless or hostile client adds to a body.
TOKENS = st.sampled_from(
    [
        b'"',
        b":",
        b",",
        b"{",
        b"}",
        b"[",
        b"]",
        b"\\",
        b"\\u0000",
        b"\\ud800",
        b"\\udc00",
        b"\\u003a",
        b',"input":[]',
        b',"model":"n"',
        b"NaN",
        b"-Infinity",
        b"1e999",
        b"9" * 25,
        b"\xff",
        b"\xc0\xaf",
        b"\xed\xa0\x80",
        b"\xef\xbb\xbf",
        b"\x00",
        b" ",
    ]
)
# Members inserted before a key: mostly a second value for a key the object already has.
MEMBERS = st.sampled_from(
    [
        b'"status":"in_progress",',
        b'"status":"completed",',
        b'"call_id":"c2",',
        b'"arguments":"{}",',
        b'"name":"search",',
        b'"type":"function_call_output",',
        b'"role":"tool",',
        b'"input":[],',
        b'"tools":[],',
    ]
)
EDITS = st.lists(
    st.one_of(
        st.tuples(
            st.integers(0, 1 << 16), st.sampled_from(["insert", "replace", "delete"]), TOKENS
        ),
        st.tuples(st.integers(0, 1 << 16), st.just("member"), MEMBERS),
    ),
    max_size=4,
)
KEY = re.compile(rb'"[^"\\]*"\s*:')


def damaged(data: bytes, edits: list[tuple[int, str, bytes]]) -> bytes:
    for position, kind, token in edits:
        at = position % (len(data) + 1)
        if kind == "member":
            keys = [m.start() for m in KEY.finditer(data)]
            at = keys[position % len(keys)] if keys else at
        if kind in ("insert", "member"):
            data = data[:at] + token + data[at:]
        elif kind == "replace":
            data = data[:at] + token + data[at + len(token) :]
        else:
            data = data[:at] + data[at + len(token) :]
    return data


def serialised(value: Any, style: int) -> bytes:
    if style == 0:
        return json.dumps(value).encode()
    if style == 1:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    return json.dumps(value, indent="\t", separators=(" ,", " : ")).encode()


ENCODERS: dict[str, Callable[[bytes], bytes]] = {
    "identity": lambda data: data,
    "gzip": gzip.compress,
    "x-gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
}
CODINGS = mostly(
    st.lists(st.sampled_from(list(ENCODERS)), max_size=2),
    st.lists(st.sampled_from([*ENCODERS, "compress", "zstd"]), max_size=3),
)
LIMITS = st.sampled_from([64, 4096, 1 << 20])


@st.composite
def wire(draw: st.DrawFn, *, hostile: bool) -> tuple[bytes, str]:
    """A body as sent, and its content codings.

    Mostly a request. `hostile`: often damaged, sometimes not JSON at all, coded or mis-coded
    any way; else damaged now and then, and mostly sent as it is.
    """
    if hostile and rarely(draw):
        data = draw(st.binary(max_size=512))
    else:
        data = serialised(draw(BODIES), draw(st.integers(0, 2)))
        data = damaged(data, draw(EDITS)) if (not rarely(draw)) == hostile else data
    applied = draw(CODINGS) if hostile or rarely(draw) else []
    for coding in applied:
        data = ENCODERS[coding](data) if coding in ENCODERS else data
    data = damaged(data, draw(EDITS)) if hostile and rarely(draw) else data
    spelled = ", ".join(c.upper() if draw(st.booleans()) else c for c in applied)
    return data, spelled


# The body reader


def same(proxy_reads: Any, upstream_reads: Any) -> bool:
    """Equal JSON values, a number equal to the double nearest it aside (orjson's reading of
    an integer past 64 bits)."""
    if isinstance(proxy_reads, float) and isinstance(upstream_reads, int):
        return not isinstance(upstream_reads, bool) and proxy_reads == float(upstream_reads)
    if type(proxy_reads) is not type(upstream_reads):
        return False
    if isinstance(proxy_reads, dict):
        return proxy_reads.keys() == upstream_reads.keys() and all(
            same(proxy_reads[k], upstream_reads[k]) for k in proxy_reads
        )
    if isinstance(proxy_reads, list):
        return len(proxy_reads) == len(upstream_reads) and all(
            same(a, b) for a, b in zip(proxy_reads, upstream_reads, strict=True)
        )
    return bool(proxy_reads == upstream_reads)


def read(raw: bytes, content_encoding: str, limit: int) -> tuple[bytes, dict[str, Any]]:
    """What the proxy does with a gated body; only ever raises BodyError."""
    decoded = body.decode(raw, body.codings(content_encoding), limit)
    return decoded, body.parse(decoded)


@FUZZ
@given(sent=wire(hostile=True), limit=LIMITS)
def test_the_body_reader_refuses_only_with_a_body_error(
    sent: tuple[bytes, str], limit: int
) -> None:
    raw, content_encoding = sent
    refused: body.BodyError | None = None
    try:
        decoded, parsed = read(raw, content_encoding, limit)
    except body.BodyError as exc:
        refused = exc
    if refused is not None:
        assert (refused.status, bool(refused.code)) in {(400, True), (413, True), (415, True)}
        return
    if body.codings(content_encoding):
        assert len(decoded) <= limit  # a bomb stops at the limit
    assert isinstance(parsed.get("input", []), str | list)
    # The upstream reads the same document, whatever its parser: no NaN, no duplicate key
    # that a parser keeping the first and one keeping the last would read two ways.
    assert same(parsed, json.loads(decoded))
    assert same(parsed, json.loads(decoded, object_pairs_hook=first_wins))


def first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return dict(reversed(pairs))


# The gate, judged by what reaches the upstream


def is_output(item: Any) -> bool:
    # As a lenient upstream reads it: `type` defaults to function_call_output in its schema.
    if not isinstance(item, dict):
        return False
    item_type = item.get("type")
    return item_type == "function_call_output" or (
        item_type is None and "call_id" in item and "output" in item
    )


def is_reference(item: Any) -> bool:
    # The spec: `{"type": "item_reference", "id": …}`, or a bare `{"id": …}`.
    if not isinstance(item, dict):
        return False
    return item.get("type") == "item_reference" or (
        "type" not in item and "role" not in item and "id" in item
    )


def arguments_value(arguments: str) -> tuple[bool, Any]:
    """(True, value) for exactly one strict JSON value, else (False, None)."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({k for k, _ in pairs}) != len(pairs):
            raise ValueError("duplicate key")
        return dict(pairs)

    def finite(text: str) -> float:
        value = float(text)
        if math.isinf(value):
            raise ValueError("not a double")
        return value

    def refuse(name: str) -> None:
        raise ValueError(name)

    try:
        value = json.loads(
            arguments, object_pairs_hook=unique, parse_constant=refuse, parse_float=finite
        )
        json.dumps(value).encode("utf-8")
        _ = json.dumps(value, ensure_ascii=False).encode("utf-8")  # a lone surrogate fails here
    except (ValueError, UnicodeEncodeError, RecursionError):
        return False, None
    return True, value


def schemas_named(tools: Any, name: str) -> list[Any]:
    found = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            continue
        spec = tool["function"] if isinstance(tool.get("function"), dict) else tool
        if spec.get("name") == name:
            found.append({} if spec.get("parameters") is None else spec["parameters"])
    return found


def valid(schema: Any, instance: Any) -> bool:
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
        return bool(cls(schema, registry=referencing.Registry()).is_valid(instance))
    except Exception:
        return False


def passes(input_items: list[Any], index: int, tools: Any) -> bool:
    """The oracle: the output at `index` answers exactly one preceding, completed
    `function_call` whose arguments are strict JSON valid for every schema of its tool."""
    call_id = input_items[index].get("call_id")
    if not isinstance(call_id, str):
        return False
    if sum(1 for item in input_items if is_output(item) and item.get("call_id") == call_id) != 1:
        return False
    candidates = [
        item
        for item in input_items[:index]
        if isinstance(item, dict)
        and not is_output(item)
        and not is_reference(item)
        and item.get("call_id") == call_id
    ]
    if len(candidates) != 1:
        return False
    [call] = candidates
    if call.get("type") != "function_call" or call.get("status") != "completed":
        return False
    name, arguments = call.get("name"), call.get("arguments")
    if not isinstance(name, str) or not isinstance(arguments, str):
        return False
    parsed, instance = arguments_value(arguments)
    schemas = schemas_named(tools, name)
    return parsed and bool(schemas) and all(valid(schema, instance) for schema in schemas)


def is_envelope(item: Any) -> bool:
    return isinstance(item, dict) and (
        item.get("role") == "tool" or "tool_calls" in item or "tool_call_id" in item
    )


@FUZZ
# Mostly strip: a wrongly passed pair then goes upstream beside the rightly stripped ones,
# where under block it would go nowhere with them.
@given(sent=wire(hostile=False), action=mostly(st.just("strip"), st.just("block")))
def test_nothing_that_fails_the_gate_reaches_the_upstream(
    sent: tuple[bytes, str], action: str
) -> None:
    raw, content_encoding = sent
    try:
        decoded, parsed = read(raw, content_encoding, 1 << 20)
    except body.BodyError:
        return
    verdict = inspect(parsed, Policy(action=action))  # type: ignore[arg-type]
    if verdict.outcome == "block":
        assert verdict.findings
        return
    if verdict.outcome == "strip":
        assert verdict.input is not None
        forwarded = body.stripped(parsed, verdict.input)
    else:
        forwarded = decoded
    upstream = json.loads(forwarded)  # the upstream's reading, not the proxy's
    input_items = upstream.get("input")
    if not isinstance(input_items, list):
        return
    for index, item in enumerate(input_items):
        assert not is_envelope(item), item
        if is_output(item):
            assert passes(input_items, index, upstream.get("tools")), (index, input_items)
