"""Hostile bodies: answered, never forwarded, and the proxy serves the next request."""

from __future__ import annotations

import json
import sys
from typing import Any

import aiohttp
import jsonschema
import pytest

from proxy.gate import strictjson
from proxy.gate.policy import Policy
from proxy.gate.reasons import Outcome
from proxy.gate.verdict import Verdict, inspect
from proxy.running.config_file import parse_config
from proxy.settings import ConfigError
from tests.builders import BOMB, BOMB_HEADERS, EVIL, JSON_HEADERS, fails, replay
from tests.fixture_types import ProxyFactory
from tests.server.checks import served_clean
from tests.servers.recording import RecordingUpstream

DEEP = 100_000
DIGITS = b"1" * 100_000
RECURSIVE = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}


HOSTILE = [
    pytest.param(
        JSON_HEADERS,
        b'{"input":' + b"[" * DEEP + b"]" * DEEP + b"}",
        400,
        "invalid_json",
        None,
        id="arrays-nested-100k-deep",
    ),
    pytest.param(
        JSON_HEADERS,
        b'{"a":' * DEEP + b"1" + b"}" * DEEP,
        400,
        "invalid_json",
        None,
        id="objects-nested-100k-deep",
    ),
    pytest.param(BOMB_HEADERS, BOMB, 413, "body_too_large", None, id="gzip-bomb-of-10-gib"),
    pytest.param(
        JSON_HEADERS,
        b'{"input":[],"temperature":' + DIGITS + b"}",
        400,
        "invalid_json",
        None,
        id="integer-of-100k-digits",
    ),
    pytest.param(
        JSON_HEADERS,
        b'{"input":[{"role":"user","content":"hi","n":-' + DIGITS + b"}]}",
        400,
        "invalid_json",
        None,
        id="negative-integer-of-100k-digits-in-an-item",
    ),
    pytest.param(
        JSON_HEADERS, b'{"input":"\xc0\xaf"}', 400, "invalid_json", None, id="utf-8-overlong"
    ),
    pytest.param(
        JSON_HEADERS,
        b'{"input":"\xed\xa0\x80"}',
        400,
        "invalid_json",
        None,
        id="utf-8-encoded-surrogate",
    ),
    pytest.param(
        JSON_HEADERS,
        b'{"input":"\xf4\x90\x80\x80"}',
        400,
        "invalid_json",
        None,
        id="utf-8-beyond-u10ffff",
    ),
    pytest.param(
        JSON_HEADERS, b'{"input":"ab\xe2\x82"}', 400, "invalid_json", None, id="utf-8-truncated"
    ),
    pytest.param(
        JSON_HEADERS, b'{"\xff":1,"input":[]}', 400, "invalid_json", None, id="utf-8-bad-in-key"
    ),
    pytest.param(
        JSON_HEADERS,
        b'{"\\ud800":1,"input":[]}',
        400,
        "invalid_json",
        None,
        id="lone-surrogate-in-a-key",
    ),
    pytest.param(
        JSON_HEADERS,
        b'{"input":[{"role":"user","content":"\\udfff"}]}',
        400,
        "invalid_json",
        None,
        id="lone-surrogate-in-a-value",
    ),
    pytest.param(
        JSON_HEADERS,
        b'{"input":"\\udc00\\ud800"}',
        400,
        "invalid_json",
        None,
        id="surrogates-swapped",
    ),
    # Inside `arguments`: the body is fine, the replayed call is not.
    pytest.param(
        JSON_HEADERS,
        replay("[" * DEEP + "]" * DEEP, {}),
        400,
        "replay_rejected",
        fails("arguments_parse"),
        id="arguments-nested-100k-deep",
    ),
    pytest.param(
        JSON_HEADERS,
        replay('{"n":' + DIGITS.decode() + "}", {}),
        400,
        "replay_rejected",
        fails("arguments_parse"),
        id="arguments-with-an-integer-of-100k-digits",
    ),
    pytest.param(
        JSON_HEADERS,
        replay('{"\\ud800":1}', {}),
        400,
        "replay_rejected",
        fails("arguments_parse"),
        id="arguments-with-a-lone-surrogate-key",
    ),
    pytest.param(
        JSON_HEADERS,
        replay('{"q":"\\udc00"}', {}),
        400,
        "replay_rejected",
        fails("arguments_parse"),
        id="arguments-with-a-lone-surrogate-value",
    ),
    pytest.param(
        JSON_HEADERS,
        replay("{}", RECURSIVE),
        400,
        "replay_rejected",
        fails("arguments_schema", ("", "schema_unusable")),
        id="tool-schema-with-a-recursive-ref",
    ),
    # Exponential for the standard library's matcher, which no timeout stops.
    pytest.param(
        JSON_HEADERS,
        replay(json.dumps({"q": EVIL}), {"properties": {"q": {"pattern": "^(a+)+$"}}}),
        400,
        "replay_rejected",
        fails("arguments_schema", ("/q", "pattern", "^(a+)+$")),
        id="pattern-nested-quantifier",
    ),
    # Exponential for every backtracking matcher: it runs out of the validation budget.
    pytest.param(
        JSON_HEADERS,
        replay(json.dumps({"q": EVIL}), {"properties": {"q": {"pattern": "^(a|a)*$"}}}),
        400,
        "replay_rejected",
        fails("arguments_schema", ("/q", "pattern_timeout")),
        id="pattern-overlapping-alternatives",
    ),
    pytest.param(
        JSON_HEADERS,
        replay(json.dumps({EVIL: 1}), {"patternProperties": {"^(a|a)*$": {"type": "string"}}}),
        400,
        "replay_rejected",
        fails("arguments_schema", (f"/{EVIL}", "pattern_timeout")),
        id="pattern-properties-overlapping-alternatives",
    ),
    pytest.param(
        JSON_HEADERS,
        replay(
            json.dumps({EVIL: 1}),
            {"additionalProperties": False, "patternProperties": {"^(a|a)*$": {}}},
        ),
        400,
        "replay_rejected",
        fails("arguments_schema", ("", "pattern_timeout")),
        id="additional-properties-beside-overlapping-alternatives",
    ),
    pytest.param(
        JSON_HEADERS,
        replay("{}", {"unevaluatedProperties": False, "patternProperties": {"^(a|a)*$": {}}}),
        400,
        "replay_rejected",
        fails("arguments_schema", ("", "invalid_schema")),
        id="unevaluated-properties-beside-pattern-properties",
    ),
]


@pytest.mark.parametrize(("headers", "data", "status", "code", "finding"), HOSTILE)
async def test_hostile_body_is_answered_and_never_forwarded(
    recording_upstream: RecordingUpstream,
    tight_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    headers: dict[str, str],
    data: bytes,
    status: int,
    code: str,
    finding: tuple[str, list[dict[str, str]] | None] | None,
) -> None:
    base = await tight_proxy(recording_upstream.url)

    async with client.post(f"{base}/v1/responses", data=data, headers=headers) as resp:
        assert resp.status == status
        assert resp.content_type == "application/json"
        error = (await resp.json())["error"]

    assert error["code"] == code
    if finding is not None:
        [found] = error["findings"]
        assert (found["reason"], found.get("fail")) == finding
    assert recording_upstream.received == []
    await served_clean(client, base, recording_upstream)


def test_unique_items_over_twenty_thousand_objects() -> None:
    # jsonschema compares objects pairwise: for 20 000 of them, 200 million comparisons.
    rows = [{"i": i} for i in range(20_000)]
    parameters = {"properties": {"rows": {"uniqueItems": True}}}
    policy = Policy()
    unique = inspect(json.loads(replay(json.dumps({"rows": rows}), parameters)), policy)
    assert unique == Verdict(Outcome.FORWARD)
    repeated = json.dumps({"rows": [*rows, {"i": 7.0}]})  # 7.0 == 7 in JSON Schema
    [finding] = inspect(json.loads(replay(repeated, parameters)), policy).findings
    assert [v.as_dict() for v in finding.fail] == [
        {"path": "/rows", "reason": "uniqueItems", "expected": True}
    ]


@pytest.mark.parametrize(
    "rows",
    [
        pytest.param([1, True], id="true-is-not-1"),
        pytest.param([0, False], id="false-is-not-0"),
        pytest.param([1, 1.0], id="1-is-1.0"),
        pytest.param([[1], [True]], id="nested-bool"),
        pytest.param([{"a": [1]}, {"a": [1.0]}], id="nested-number"),
        pytest.param([{"a": 1, "b": 2}, {"b": 2, "a": 1}], id="key-order"),
        pytest.param(["1", 1], id="string-is-not-number"),
        pytest.param([None, None], id="nulls"),
        pytest.param([{}, []], id="empty-object-and-array"),
    ],
)
def test_unique_items_agrees_with_jsonschema(rows: list[Any]) -> None:
    parameters = {"properties": {"rows": {"uniqueItems": True}}}
    expected = jsonschema.Draft202012Validator(parameters).is_valid({"rows": rows})
    verdict = inspect(json.loads(replay(json.dumps({"rows": rows}), parameters)), Policy())
    assert (verdict.outcome == "forward") == expected


def test_integer_bound_holds_without_the_interpreters() -> None:
    # PYTHONINTMAXSTRDIGITS=0 lifts CPython's own bound: int() would then take quadratic time.
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        with pytest.raises(strictjson.StrictJSONError, match="Exceeds the limit"):
            strictjson.loads(DIGITS)
        assert strictjson.loads(b"9" * strictjson.MAX_DIGITS) == int("9" * strictjson.MAX_DIGITS)
    finally:
        sys.set_int_max_str_digits(previous)


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param(RECURSIVE, id="recursive-ref"),
        pytest.param({"$ref": "#"}, id="ref-to-itself"),
        pytest.param({"anyOf": [{"type": "string"}, {"$ref": "#"}]}, id="ref-cycle-in-anyof"),
        pytest.param(
            {"unevaluatedProperties": False, "patternProperties": {"^x": {}}},
            id="unevaluated-beside-pattern-properties",
        ),
    ],
)
def test_pinned_schema_no_call_could_finish_stops_the_start(schema: Any) -> None:
    with pytest.raises(ConfigError, match=r"^tools\.lookup: not a valid JSON Schema"):
        parse_config({"tools": {"lookup": schema}})


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param(RECURSIVE, id="recursive-ref"),
        pytest.param({"$ref": "#"}, id="ref-to-itself"),
        pytest.param({"anyOf": [{"type": "string"}, {"$ref": "#"}]}, id="ref-cycle-in-anyof"),
    ],
)
def test_request_schema_no_call_could_finish_is_found_before_validating(schema: Any) -> None:
    # A budget spent before validation starts: only a check that does not validate can answer.
    policy = Policy(validation_timeout_s=1e-9)
    [finding] = inspect(json.loads(replay("{}", schema)), policy).findings
    assert [v.as_dict() for v in finding.fail] == [{"path": "", "reason": "schema_unusable"}]


def test_pinned_schema_recursing_through_values_is_accepted() -> None:
    # Recursion that descends into the value ends with the value: a tree of any depth.
    tree = {"type": "object", "properties": {"children": {"items": {"$ref": "#"}}}}
    config = parse_config({"tools": {"lookup": tree}})
    arguments = json.dumps({"children": [{"children": [{"children": []}]}]})
    verdict = inspect(json.loads(replay(arguments, {})), config.gate)
    assert verdict == Verdict(Outcome.FORWARD)
