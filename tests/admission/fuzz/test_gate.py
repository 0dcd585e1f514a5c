"""Fuzzing the gate from raw bytes: what it lets go upstream, read as the upstream reads it,
holds no `function_call_output` whose call fails the gate, judged by an oracle written apart
from the gate.

A longer, random run: `FUZZ_EXAMPLES=100000 pytest tests/admission/fuzz --timeout=0`.
"""

from __future__ import annotations

import json
import math
from typing import Any

import jsonschema
import referencing
from hypothesis import given
from hypothesis import strategies as st

from proxy.admission import body
from proxy.gate.policy import Policy
from proxy.gate.verdict import inspect
from tests.admission.fuzz.bodies import FUZZ, mostly, read, wire


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
@given(
    sent=wire(hostile=False),
    action=mostly(st.just("strip"), st.sampled_from(["block", "rewrite"])),
)
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
    if verdict.outcome in ("strip", "rewrite"):
        assert verdict.input is not None
        forwarded = body.with_input(parsed, verdict.input)
    else:
        forwarded = decoded
    upstream = json.loads(forwarded)  # the upstream's reading, not the proxy's
    input_items = upstream.get("input")
    if not isinstance(input_items, list):
        return
    for index, item in enumerate(input_items):
        assert not is_envelope(item), item
        if is_output(item) and not passes(input_items, index, upstream.get("tools")):
            # Only a rewritten output may stand beside a failing call: it carries no result.
            assert action == "rewrite", (index, input_items)
            assert json.loads(item["output"])["execute"] is False, item
