"""The quick acceptor passes only what jsonschema finds nothing wrong with."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.gate import acceptor, portable
from proxy.gate.acceptor import Steps
from proxy.gate.patterns import Patterns
from proxy.gate.portable import CALL_SCHEMA, OUTPUT_SCHEMA, item_schemas
from tests.gate.test_portable import PORTABLE

SCHEMAS = item_schemas()
MANY = 10**9
TEXT = {"type": "input_text", "text": "x"}


def agrees(schema: str, item: Any) -> bool:
    """The acceptor's answer on `item`, checked against jsonschema's: never a pass it fails."""
    quick = SCHEMAS.quick_call if schema == CALL_SCHEMA else SCHEMAS.quick_output
    assert quick is not None
    compiled = SCHEMAS.call if schema == CALL_SCHEMA else SCHEMAS.output
    passed = quick(item, Steps(MANY))
    if passed:
        assert compiled.violations(item) == (), item
    return passed


def test_the_spec_schemas_have_acceptors() -> None:
    assert SCHEMAS.quick_call is not None
    assert SCHEMAS.quick_output is not None


@pytest.mark.parametrize(("input_items", "tools", "reason", "item_type", "fail"), [*PORTABLE])
def test_agrees_on_the_tables_items(
    input_items: list[Any], tools: Any, reason: str | None, item_type: Any, fail: Any
) -> None:
    call, output = input_items
    call_passed = agrees(CALL_SCHEMA, call)
    output_passed = agrees(OUTPUT_SCHEMA, portable.read_output(output))
    if reason is None:
        # A pair the gate passes is passed quickly: jsonschema is not asked for it.
        assert call_passed
        assert output_passed


SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3)
NAMES = st.sampled_from(["lookup", "a b", "", "x" * 64, "x" * 65, "é", "a\n"]) | SCALARS
IDS = st.sampled_from(["c", "", "c" * 64, "c" * 65]) | SCALARS
STATUSES = st.sampled_from(["completed", "in_progress", "incomplete", "done"]) | SCALARS
PARTS = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "input_image", "input_file", "input_video", "x"])},
    optional={
        "text": st.text(max_size=2) | SCALARS,
        "image_url": SCALARS,
        "detail": st.sampled_from(["low", "high", "auto", "x"]) | SCALARS,
        "file_data": SCALARS,
        "filename": SCALARS,
        "video_url": SCALARS,
    },
)
CALLS = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["function_call", "x"]) | SCALARS,
        "call_id": IDS,
        "name": NAMES,
        "arguments": st.just("{}") | SCALARS,
        "id": IDS,
        "status": STATUSES,
    },
)
OUTPUTS = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["function_call_output", "x"]) | SCALARS,
        "call_id": IDS,
        "output": st.text(max_size=3) | st.lists(PARTS | SCALARS, max_size=3) | SCALARS,
        "id": IDS,
        "status": STATUSES,
    },
)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(call=CALLS, output=OUTPUTS)
def test_never_passes_what_jsonschema_fails(call: dict[str, Any], output: dict[str, Any]) -> None:
    agrees(CALL_SCHEMA, call)
    agrees(OUTPUT_SCHEMA, output)


def test_the_steps_bound_the_elements_checked() -> None:
    output = {"type": "function_call_output", "call_id": "c", "output": [TEXT] * 10}
    quick = SCHEMAS.quick_output
    assert quick is not None
    assert quick(output, Steps(10))
    steps = Steps(9)
    assert not quick(output, steps)
    # Spent: nothing more is passed in this request, however small.
    assert not quick(output | {"output": [TEXT]}, steps)


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param({"not": {"type": "string"}}, id="not"),
        pytest.param({"type": "integer"}, id="integer"),
        pytest.param({"type": ["string", "null"]}, id="type-list"),
        pytest.param({"enum": [1, True]}, id="enum-not-strings"),
        pytest.param({"$ref": "https://example.test/s"}, id="ref-elsewhere"),
        pytest.param({"$ref": "#/components/schemas/Nowhere"}, id="ref-to-nothing"),
        pytest.param({"properties": {"a": {"minimum": 1}}}, id="nested-unknown"),
        pytest.param({"oneOf": []}, id="empty-oneof"),
        pytest.param({"$ref": "#/components/schemas/Loop"}, id="ref-cycle"),
        pytest.param({"items": {"$ref": "#/components/schemas/Tree"}}, id="ref-cycle-deeper"),
    ],
)
def test_a_schema_it_cannot_evaluate_is_refused(schema: dict[str, Any]) -> None:
    definitions = {
        "Loop": {"$ref": "#/components/schemas/Loop"},
        "Tree": {"items": {"$ref": "#/components/schemas/Tree"}},
    }
    with pytest.raises(acceptor.Unsupported):
        acceptor.build(schema, definitions, Patterns())


@pytest.mark.parametrize(
    ("schema", "value", "passed"),
    [
        pytest.param({"oneOf": [{"type": "string"}, {"maxLength": 3}]}, "ab", False, id="two"),
        pytest.param({"oneOf": [{"type": "string"}, {"maxLength": 3}]}, "abcd", True, id="one"),
        pytest.param({"anyOf": [{"type": "null"}, {"type": "string"}]}, None, True, id="any"),
        pytest.param({"allOf": [{"type": "string"}, {"minLength": 2}]}, "a", False, id="all"),
        pytest.param({"pattern": "^a$"}, "a\n", False, id="ecma-dollar"),
        pytest.param({"enum": ["a"]}, "a", True, id="enum"),
        pytest.param({"required": ["a"], "type": "object"}, {"b": 1}, False, id="required"),
        pytest.param({"$ref": "#/components/schemas/A"}, {"a": None}, True, id="ref"),
    ],
)
def test_keywords(schema: dict[str, Any], value: Any, passed: bool) -> None:
    definitions = {"A": {"type": "object", "properties": {"a": {"type": "null"}}}}
    assert acceptor.build(schema, definitions, Patterns())(value, Steps(MANY)) is passed


@pytest.mark.parametrize(("input_items", "tools", "reason", "item_type", "fail"), [*PORTABLE])
def test_jsonschema_alone_gives_the_same_verdicts(
    input_items: list[Any], tools: Any, reason: str | None, item_type: Any, fail: Any
) -> None:
    # As the gate runs when a shipped schema used a keyword the acceptor does not evaluate.
    alone = dataclasses.replace(SCHEMAS, quick_call=None, quick_output=None)
    call, output = input_items
    assert alone.check_pair(call, output) == SCHEMAS.check_pair(call, output)
