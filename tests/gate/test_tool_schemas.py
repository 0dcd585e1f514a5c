"""Tool schemas: where they come from, what they mean, and that remote refs are never fetched."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from proxy.gate.policy import Policy
from proxy.gate.reasons import Outcome
from proxy.gate.verdict import Verdict, inspect
from tests.builders import APAC, DRAFT_07, GLOBAL, call, only, output, request, tool
from tests.builders import SALES_SCHEMA as SALES

# Schemas: where they come from and what they mean.
REFS = {
    "type": "object",
    "$defs": {"region": {"type": "string", "enum": ["apac", "emea", "amer"]}},
    "properties": {"region": {"$ref": "#/$defs/region"}},
    "required": ["region"],
}
DRAFT_07_REF_SIBLINGS = {
    "$schema": DRAFT_07,
    "definitions": {"any_object": {"type": "object"}},
    # Draft-07 ignores keywords beside `$ref`; Draft 2020-12 would apply `required`.
    "$ref": "#/definitions/any_object",
    "required": ["region"],
}
DRAFT_07_TUPLE = {
    "$schema": DRAFT_07,
    "type": "object",
    "properties": {
        "pair": {"type": "array", "items": [{"type": "string"}], "additionalItems": False}
    },
}
CHAT_SHAPE_TOOL = {"type": "function", "function": {"name": "lookup", "parameters": REFS}}

SCHEMAS = [
    pytest.param([tool(REFS)], {}, APAC, [], id="ref-ok"),
    pytest.param([tool(REFS)], {}, GLOBAL, [("/region", "enum")], id="ref-enum"),
    pytest.param(
        [tool(REFS)], {}, '{"region":7}', [("/region", "enum"), ("/region", "type")], id="ref-type"
    ),
    pytest.param([tool(DRAFT_07_REF_SIBLINGS)], {}, "{}", [], id="draft-07-ref-siblings-ignored"),
    pytest.param(
        [tool(DRAFT_07_REF_SIBLINGS | {"$schema": "https://json-schema.org/draft/2020-12/schema"})],
        {},
        "{}",
        [("/region", "required")],
        id="draft-2020-12-ref-siblings-apply",
    ),
    pytest.param([tool(DRAFT_07_TUPLE)], {}, '{"pair":["a"]}', [], id="draft-07-items-array-ok"),
    pytest.param(
        [tool(DRAFT_07_TUPLE)],
        {},
        '{"pair":["a","b"]}',
        [("/pair", "additionalItems")],
        id="draft-07-additional-items",
    ),
    pytest.param(
        [tool({"type": "object", "properties": {"a/b": {"const": 1}, "m~n": {"const": 1}}})],
        {},
        '{"a/b":2,"m~n":2}',
        [("/a~1b", "const"), ("/m~0n", "const")],
        id="pointer-escapes",
    ),
    pytest.param(
        [tool({"type": "object", "properties": {"list": {"items": {"type": "integer"}}}})],
        {},
        '{"list":[1,"x",3]}',
        [("/list/1", "type")],
        id="pointer-into-array",
    ),
    pytest.param([tool(SALES)], {"get_latest_sales_report": {}}, GLOBAL, [], id="pinned-looser"),
    pytest.param(
        [tool({})],
        {"get_latest_sales_report": SALES},
        GLOBAL,
        [("/region", "enum")],
        id="pinned-stricter",
    ),
    pytest.param(
        [], {"get_latest_sales_report": SALES}, APAC, [], id="pinned-without-request-tools"
    ),
    pytest.param(
        [tool(SALES), tool({"type": "object", "maxProperties": 0})],
        {},
        APAC,
        [("", "maxProperties")],
        id="same-name-twice-both-apply",
    ),
    pytest.param(
        [{"type": "function", "name": "get_latest_sales_report"}],
        {},
        '[1, "anything"]',
        [],
        id="no-parameters-any-json",
    ),
    pytest.param(
        [{"type": "function", "name": "get_latest_sales_report", "parameters": None}],
        {},
        "null",
        [],
        id="null-parameters-any-json",
    ),
    pytest.param([tool({"type": 12})], {}, APAC, [("", "invalid_schema")], id="invalid-schema"),
    pytest.param([tool({"$schema": 5})], {}, APAC, [("", "invalid_schema")], id="schema-not-str"),
    pytest.param([tool({"$schema": []})], {}, APAC, [("", "invalid_schema")], id="schema-list"),
    pytest.param([tool(12)], {}, APAC, [("", "invalid_schema")], id="schema-a-number"),
    pytest.param(
        [tool({"$ref": "#/$defs/missing"})], {}, APAC, [("", "schema_unusable")], id="dangling-ref"
    ),
    pytest.param(
        [tool({"$ref": "urn:example:nowhere"})], {}, APAC, [("", "schema_unusable")], id="urn-ref"
    ),
    pytest.param(
        # ECMA-262 named group syntax, which Python's `re` cannot compile: a valid pattern.
        [tool({"properties": {"region": {"pattern": "^(?<x>a)$"}}})],
        {},
        APAC,
        [("/region", "pattern")],
        id="ecma-only-pattern-valid",
    ),
    pytest.param(
        # Python's named group syntax, which ECMA-262 does not have.
        [tool({"properties": {"region": {"pattern": "^(?P<x>a)$"}}})],
        {},
        APAC,
        [("", "invalid_schema")],
        id="python-only-pattern-invalid",
    ),
]


@pytest.mark.parametrize(("tools", "pinned", "arguments", "fail"), SCHEMAS)
def test_schema(
    tools: list[Any], pinned: dict[str, Any], arguments: str, fail: list[tuple[str, str]]
) -> None:
    verdict = inspect(request(call("c", arguments), output("c"), tools=tools), Policy(tools=pinned))
    if not fail:
        assert verdict == Verdict(Outcome.FORWARD)
        return
    found = only(verdict)
    assert found["reason"] == "arguments_schema"
    assert sorted((v["path"], v["reason"]) for v in found["fail"]) == sorted(fail)


def test_chat_completions_tool_shape_is_read() -> None:
    body = request(call("c", GLOBAL, name="lookup"), output("c"), tools=[CHAT_SHAPE_TOOL])
    assert only(inspect(body, Policy()))["fail"] == [
        {"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}
    ]


@pytest.fixture
def schema_server() -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server that serves a permissive schema and records every request."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            data = b"{}"
            self.send_response(200)
            self.send_header("content-type", "application/schema+json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_remote_ref_is_never_fetched(schema_server: tuple[str, list[str]]) -> None:
    base, seen = schema_server
    schema = {"type": "object", "properties": {"region": {"$ref": f"{base}/region.json"}}}
    body = request(call("c"), output("c"), tools=[tool(schema)])
    assert only(inspect(body, Policy()))["fail"] == [{"path": "", "reason": "schema_unusable"}]
    assert seen == []
