"""The hash a set of tools is stored under is the stdlib's sorted JSON's, however it is found."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from proxy.gate import items
from proxy.state import recording
from proxy.state.recording import offered_tools, tools_key


def _stdlib(tools: Any) -> str:
    canonical = json.dumps(tools, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


ROWS: list[tuple[str, tuple[tuple[str, Any], ...]]] = [
    ("one tool", (("lookup", {"type": "object"}),)),
    ("keys out of order", (("f", {"required": ["a"], "properties": {"b": {}, "a": {}}}),)),
    ("non-ASCII text", (("météo", {"description": "température, 東京"}),)),
    ("floats", (("f", {"minimum": 0.1, "maximum": 1e16, "multipleOf": -0.0}),)),
    ("an integer beyond 64 bits", (("f", {"maximum": 2**70}),)),
    ("no parameters", (("f", None), ("g", {}))),
]


@pytest.mark.parametrize(("tools"), [row[1] for row in ROWS], ids=[row[0] for row in ROWS])
def test_tools_key_is_the_stdlib_hash(tools: tuple[tuple[str, Any], ...]) -> None:
    assert tools_key(tools) == _stdlib(tools)
    assert tools_key(tools) == _stdlib(tools)  # found again, the same


def test_different_tools_have_different_keys() -> None:
    assert tools_key((("f", {"maximum": 1}),)) != tools_key((("f", {"maximum": 1.0}),))


# A request's `tools` as clients send them: read whole, or found again by their JSON.
REQUEST_TOOLS: list[tuple[str, Any]] = [
    ("none", None),
    ("not a list", {"type": "function"}),
    ("no function", [{"type": "web_search"}]),
    (
        "functions of both APIs",
        [
            {"type": "function", "name": "lookup", "parameters": {"type": "object"}},
            {"type": "function", "function": {"name": "sales", "parameters": {"maximum": 1.5}}},
            {"type": "custom", "name": "grammar"},
        ],
    ),
    (
        "a namespace",
        [{"type": "namespace", "name": "crm", "tools": [{"type": "function", "name": "find"}]}],
    ),
    (
        "an integer beyond 64 bits",
        [{"type": "function", "name": "f", "parameters": {"maximum": 2**70}}],
    ),
]


@pytest.mark.parametrize(
    ("tools"), [row[1] for row in REQUEST_TOOLS], ids=[row[0] for row in REQUEST_TOOLS]
)
def test_offered_tools_are_the_schemas_and_their_key(tools: Any) -> None:
    schemas = tuple(items.tool_schemas(tools))
    expected = (schemas, tools_key(schemas) if schemas else None)
    assert offered_tools(tools) == expected
    assert offered_tools(tools) == expected  # found again by its JSON, the same
    if schemas:
        assert expected[1] == _stdlib(schemas)


def test_tools_past_the_bound_are_read_again_not_remembered() -> None:
    described = {"type": "object", "description": "x" * (80 * 1024)}
    tools = [{"type": "function", "name": "large", "parameters": described}]
    schemas = (("large", described),)
    remembered = (recording._offered_of.cache_info(), recording._tools_key_of.cache_info())
    assert offered_tools(tools) == (schemas, _stdlib(schemas))
    assert tools_key(schemas) == _stdlib(schemas)
    assert (recording._offered_of.cache_info(), recording._tools_key_of.cache_info()) == (
        remembered
    )
