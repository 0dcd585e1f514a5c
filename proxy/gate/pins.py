"""A pinned tool: the shapes a pin may be written in, unwrapped to the JSON Schema it pins."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The keywords that constrain an instance, in any draft the gate reads (jsonschema's
# VALIDATORS of Draft 4 to 2020-12): a schema with none of them accepts every instance.
ASSERTING = frozenset(
    {
        *("$dynamicRef", "$recursiveRef", "$ref", "additionalItems", "additionalProperties"),
        *("allOf", "anyOf", "const", "contains", "dependencies", "dependentRequired"),
        *("dependentSchemas", "enum", "exclusiveMaximum", "exclusiveMinimum", "format", "if"),
        *("items", "maxItems", "maxLength", "maxProperties", "maximum", "minItems", "minLength"),
        *("minProperties", "minimum", "multipleOf", "not", "oneOf", "pattern"),
        *("patternProperties", "prefixItems", "properties", "propertyNames", "required", "type"),
        *("unevaluatedItems", "unevaluatedProperties", "uniqueItems"),
    }
)

# Keywords that name, describe or hold subschemas without constraining by themselves.
_ANNOTATING = frozenset(
    {
        *("$schema", "$id", "id", "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$defs"),
        *("definitions", "$comment", "$vocabulary", "title", "description", "default"),
        *("examples", "deprecated", "readOnly", "writeOnly", "contentMediaType"),
        *("contentEncoding", "contentSchema", "then", "else"),
    }
)

KEYWORDS = ASSERTING | _ANNOTATING

_SHAPES = (
    "a JSON Schema, a Responses tool {type: function, name, parameters}, a Chat Completions "
    "tool {type: function, function: {name, parameters}} or an MCP tool {name, inputSchema}"
)


def pin_schema(name: str, pin: Any) -> Any:
    """The JSON Schema that the pin `tools.<name>` holds: the pin itself, or the schema of
    the tool it is written as. Raises ValueError naming `tools.<name>` for a tool named
    otherwise than its key, a tool without its schema, or a mapping with no JSON Schema
    keyword at its top level (which would accept every call)."""
    key = f"tools.{name}"
    if not isinstance(pin, Mapping):
        return pin  # a boolean schema, or a value the schema check names
    if pin.get("type") == "function" and isinstance(pin.get("function"), Mapping):
        tool, field, shape = pin["function"], "parameters", "a Chat Completions tool"
    elif pin.get("type") == "function":
        tool, field, shape = pin, "parameters", "a Responses tool"
    elif "inputSchema" in pin:
        tool, field, shape = pin, "inputSchema", "an MCP tool"
    else:
        if pin and not KEYWORDS.intersection(pin):
            found = ", ".join(sorted(map(str, pin)))
            raise ValueError(
                f"{key}: no JSON Schema keyword at its top level (found: {found}); a pin is "
                f"{_SHAPES}"
            )
        return pin
    inner = tool.get("name")
    if inner is not None and inner != name:
        raise ValueError(
            f"{key}: {shape} named {inner!r}: a pin's tool has the name of its key ({name})"
        )
    if field not in tool:
        raise ValueError(f"{key}: {shape} without {field}: its {field} are what is pinned")
    return tool[field]


def accepts_everything(schema: Any) -> bool:
    """Whether the schema accepts every instance: `true`, or a mapping with no keyword that
    constrains one (`{}`, `{description: ...}`)."""
    if isinstance(schema, Mapping):
        return not ASSERTING.intersection(schema)
    return schema is True
