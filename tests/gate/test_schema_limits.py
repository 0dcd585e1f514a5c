"""Schemas are bounded before any work is done on them, and compiled without holding others."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from proxy.gate.policy import Policy
from proxy.gate.reasons import Outcome
from proxy.gate.schemas import SchemaLimits
from proxy.gate.verdict import Verdict, inspect
from tests.builders import JSON_HEADERS, SALES_TOOL, sales_call, sales_output
from tests.fixture_types import ProxyFactory
from tests.servers.recording import RecordingUpstream


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {}
    for _ in range(depth - 1):
        schema = {"if": schema}  # a subschema with no effect of its own
    return schema


def replay(parameters: Any, arguments: str = '{"q": "a"}') -> dict[str, Any]:
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "lookup",
        "status": "completed",
        "arguments": arguments,
    }
    return {
        "model": "m",
        "tools": [{"type": "function", "name": "lookup", "parameters": parameters}],
        "input": [call, {"type": "function_call_output", "call_id": "call_1", "output": "x"}],
    }


HUGE_PROPERTIES = {
    "type": "object",
    "properties": {f"p{i}": {"type": "string"} for i in range(200_000)},
}
HUGE_PATTERN = {"properties": {"q": {"pattern": "a" * 3_500_000}}}

# (schema, limits, the limit it is over)
OVER = [
    pytest.param(HUGE_PROPERTIES, SchemaLimits(), "max_bytes", id="200k-properties"),
    pytest.param(HUGE_PATTERN, SchemaLimits(), "max_pattern_length", id="3.5MB-pattern"),
    pytest.param(
        {"patternProperties": {"a" * 1001: {}}},
        SchemaLimits(),
        "max_pattern_length",
        id="long-pattern-properties-name",
    ),
    pytest.param({"description": "x" * 300_000}, SchemaLimits(), "max_bytes", id="long-string"),
    pytest.param({"enum": list(range(300_000))}, SchemaLimits(), "max_bytes", id="long-enum"),
    pytest.param({"const": 10**4000}, SchemaLimits(max_bytes=1000), "max_bytes", id="big-int"),
    pytest.param(nested(65), SchemaLimits(), "max_depth", id="65-deep"),
    pytest.param(
        {"anyOf": [{"type": "string"}] * 5_000}, SchemaLimits(), "max_subschemas", id="5001-objects"
    ),
    pytest.param(
        {"anyOf": [{}] * 10}, SchemaLimits(max_subschemas=10), "max_subschemas", id="custom-limit"
    ),
    pytest.param(
        {"properties": {"q": {"pattern": "^a+$"}}},
        SchemaLimits(max_pattern_length=3),
        "max_pattern_length",
        id="custom-pattern-length",
    ),
]


@pytest.mark.parametrize(("schema", "limits", "limit"), OVER)
def test_request_schema_over_a_limit_fails_its_calls(
    schema: Any, limits: SchemaLimits, limit: str
) -> None:
    verdict = inspect(replay(schema), Policy(schema_limits=limits))
    [finding] = verdict.findings
    [violation] = finding.fail
    assert (finding.reason, violation.path, violation.reason) == (
        "arguments_schema",
        "",
        "invalid_schema",
    )
    assert violation.message is not None
    assert violation.message.startswith(f"schema over schema_limits.{limit}:")
    assert f"schema_limits.{limit}" in finding.describe()


WITHIN = [
    pytest.param(nested(64), SchemaLimits(), id="64-deep"),
    pytest.param({"anyOf": [{}] * 9}, SchemaLimits(max_subschemas=10), id="10-objects"),
    pytest.param(
        {"properties": {"q": {"pattern": "^a$"}}}, SchemaLimits(max_pattern_length=3), id="pattern"
    ),
]


@pytest.mark.parametrize(("schema", "limits"), WITHIN)
def test_schema_at_a_limit_is_used(schema: Any, limits: SchemaLimits) -> None:
    assert inspect(replay(schema), Policy(schema_limits=limits)) == Verdict(Outcome.FORWARD)


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({"max_depth": 0}, id="zero"),
        pytest.param({"max_bytes": True}, id="bool"),
        pytest.param({"max_subschemas": 1.5}, id="float"),
    ],
)
def test_limits_must_be_positive_integers(settings: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"^schema_limits\.max_\w+: .* is not a positive integer"):
        SchemaLimits(**settings)


# Over HTTP: a schema refused, or compiled in a worker thread, while another client is served.


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


CLEAN = {
    "model": "m",
    "tools": [SALES_TOOL],
    "input": [sales_call("c1"), sales_output("c1")],
}
# Thousands of subschemas, within the limits: checking it takes a while (bench/schemas.py).
LARGE = {"anyOf": [{"type": "object", "minProperties": i} for i in range(4_000)]}


@pytest.mark.parametrize(
    ("parameters", "arguments", "status", "expected"),
    [
        pytest.param(HUGE_PROPERTIES, '{"q": "a"}', 400, "schema_limits.max_bytes", id="props"),
        pytest.param(HUGE_PATTERN, '{"q": "a"}', 400, "schema_limits.max_pattern_length", id="re"),
        pytest.param(LARGE, "[]", 400, "arguments_schema at / (anyOf)", id="large-failing"),
        pytest.param(LARGE, '{"q": "a"}', 200, None, id="large-passing"),
    ],
)
async def test_another_client_is_served_meanwhile(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    parameters: Any,
    arguments: str,
    status: int,
    expected: str | None,
) -> None:
    # A budget no loaded machine spends: the verdict is the schema's, never a timeout's.
    base = await start_proxy(recording_upstream.url, gate={"validation_timeout_s": 120})
    heavy = json.dumps(replay(parameters, arguments)).encode()
    clean = json.dumps(CLEAN).encode()

    async def post(data: bytes) -> tuple[int, Any]:
        sent = io.BytesIO(data)  # a body of megabytes, streamed
        async with client.post(f"{base}/v1/responses", data=sent, headers=JSON_HEADERS) as resp:
            return resp.status, await resp.json()

    (heavy_status, heavy_answer), (clean_status, _) = await asyncio.gather(post(heavy), post(clean))

    assert clean_status == 200
    assert heavy_status == status
    if expected is not None:
        assert heavy_answer["error"]["code"] == "replay_rejected"
        assert expected in heavy_answer["error"]["message"]
        assert [r.body for r in recording_upstream.received] == [clean]
    else:
        assert sorted(r.body for r in recording_upstream.received) == sorted([heavy, clean])
