"""What the fuzz tests send: request bodies, their damage, codings and limits, as strategies."""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections.abc import Callable
from typing import Any

import brotli
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from proxy.admission import body

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


def read(raw: bytes, content_encoding: str, limit: int) -> tuple[bytes, dict[str, Any]]:
    """What the proxy does with a gated body; only ever raises BodyError."""
    decoded = body.decode(raw, body.codings(content_encoding), limit)
    return decoded, body.parse(decoded)
