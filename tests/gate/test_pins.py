"""A pin written as a tool (Responses, Chat Completions, MCP) pins the schema inside it; one
that holds no JSON Schema keyword, or a tool of another name, is refused naming its key."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.gate.pins import accepts_everything, pin_schema
from proxy.gate.policy import Policy, PolicyError

WEATHER: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["city"],
    "properties": {"city": {"type": "string"}},
}

# The four shapes of one pin: each pins WEATHER.
SHAPES = [
    pytest.param(WEATHER, id="json-schema"),
    pytest.param(
        {"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True},
        id="responses-tool",
    ),
    pytest.param(
        {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
        id="chat-completions-tool",
    ),
    pytest.param(
        {"name": "get_weather", "description": "the weather", "inputSchema": WEATHER},
        id="mcp-tool",
    ),
]


@pytest.mark.parametrize("pin", SHAPES)
def test_every_shape_pins_the_schema_inside(pin: dict[str, Any]) -> None:
    assert pin_schema("get_weather", pin) == WEATHER
    pinned = Policy(tools={"get_weather": pin}).pinned["get_weather"]
    assert pinned.violations({"city": "Paris"}) == ()
    assert {v.reason for v in pinned.violations({"city": 5, "evil": True})} == {
        "type",
        "additionalProperties",
    }


@pytest.mark.parametrize(
    ("pin", "message"),
    [
        pytest.param(
            {"parameters": WEATHER},
            "tools.get_weather: no JSON Schema keyword at its top level (found: parameters); "
            "a pin is a JSON Schema, a Responses tool",
            id="tool-shaped-without-type",
        ),
        pytest.param(
            {"name": "get_weather", "parameters": WEATHER},
            "tools.get_weather: no JSON Schema keyword at its top level (found: name, parameters)",
            id="name-and-parameters",
        ),
        pytest.param(
            {"type": "function", "name": "get_wether", "parameters": WEATHER},
            "tools.get_weather: a Responses tool named 'get_wether': a pin's tool has the "
            "name of its key (get_weather)",
            id="responses-other-name",
        ),
        pytest.param(
            {"type": "function", "function": {"name": "x", "parameters": WEATHER}},
            "tools.get_weather: a Chat Completions tool named 'x'",
            id="chat-other-name",
        ),
        pytest.param(
            {"name": "x", "inputSchema": WEATHER},
            "tools.get_weather: an MCP tool named 'x'",
            id="mcp-other-name",
        ),
        pytest.param(
            {"type": "function", "name": "get_weather"},
            "tools.get_weather: a Responses tool without parameters",
            id="tool-without-parameters",
        ),
        pytest.param(
            {"type": "function", "name": "get_weather", "parameters": {"type": 12}},
            "tools.get_weather: not a valid JSON Schema",
            id="tool-with-a-bad-schema",
        ),
    ],
)
def test_a_pin_that_says_nothing_or_another_name_is_refused(
    pin: dict[str, Any], message: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        Policy(tools={"get_weather": pin})
    assert str(caught.value).startswith(message)


def test_every_bad_pin_is_named_at_once() -> None:
    with pytest.raises(PolicyError) as caught:
        Policy(tools={"a": {"parameters": {}}, "ok": WEATHER, "b": {"type": 12}})
    assert [p.split(":")[0] for p in caught.value.problems] == ["tools.a", "tools.b"]


@pytest.mark.parametrize(
    ("schema", "accepts"),
    [
        pytest.param({}, True, id="empty"),
        pytest.param(True, True, id="true"),
        pytest.param({"description": "anything", "$schema": "x"}, True, id="annotations-only"),
        pytest.param(False, False, id="false"),
        pytest.param({"type": "object"}, False, id="typed"),
        pytest.param({"not": {}}, False, id="not"),
        pytest.param({"$ref": "#/$defs/a", "$defs": {"a": {}}}, False, id="ref"),
    ],
)
def test_accepts_everything(schema: Any, accepts: bool) -> None:
    assert accepts_everything(schema) is accepts
