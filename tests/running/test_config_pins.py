"""Pins in the config, through the real proxy: a pin written as a tool blocks a bad call as
its bare schema does, a pin that says nothing is refused naming its key (top level and per
route), and one that accepts every call is warned about."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from proxy.running.config_file import parse_config
from proxy.running.config_review import iter_warnings
from proxy.settings import ConfigError
from tests.builders import USER, call
from tests.fixture_types import ProxyFactory
from tests.gate.test_pins import SHAPES, WEATHER
from tests.servers.recording import RecordingUpstream


def weather_replay(arguments: dict[str, Any]) -> dict[str, Any]:
    """A replayed get_weather call whose request declares a schema that takes anything: only
    the pin can stop it."""
    loose = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    return {
        "model": "m",
        "tools": [loose],
        "input": [
            USER,
            call("call_1", json.dumps(arguments), name="get_weather"),
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ],
    }


@pytest.mark.parametrize("pin", SHAPES)
async def test_a_pin_in_any_shape_blocks_what_its_schema_refuses(
    start_proxy: ProxyFactory, recording_upstream: RecordingUpstream, pin: dict[str, Any]
) -> None:
    base = await start_proxy(recording_upstream.url, tools={"get_weather": pin})
    async with aiohttp.ClientSession() as session:
        bad = weather_replay({"city": 5, "evil": True})
        async with session.post(base + "/v1/responses", json=bad) as response:
            assert response.status == 400
            [finding] = (await response.json())["error"]["findings"]
        good = weather_replay({"city": "Paris"})
        async with session.post(base + "/v1/responses", json=good) as response:
            assert response.status == 200
    assert finding["reason"] == "arguments_schema"
    assert {f["path"] for f in finding["fail"]} == {"/city", "/evil"}
    # Only the good call went upstream.
    assert [r.json()["input"][1]["arguments"] for r in recording_upstream.received] == [
        '{"city": "Paris"}'
    ]


ROUTED: dict[str, Any] = {
    "upstreams": {"a": {"url": "http://127.0.0.1:1"}},
    "routes": [{"upstream": "a"}],
}


@pytest.mark.parametrize(
    ("data", "problems"),
    [
        pytest.param(
            {"tools": {"get_weather": {"parameters": WEATHER}}},
            ["tools.get_weather: no JSON Schema keyword at its top level (found: parameters)"],
            id="top-level",
        ),
        pytest.param(
            {
                **ROUTED,
                "routes": [
                    {"upstream": "a", "gate": {"tools": {"get_weather": {"parameters": WEATHER}}}}
                ],
            },
            ["routes[0].gate.tools.get_weather: no JSON Schema keyword at its top level"],
            id="per-route",
        ),
        pytest.param(
            {
                **ROUTED,
                "tools": {"t": {"inputSchema": WEATHER, "name": "u"}},
                "routes": [{"upstream": "a", "gate": {"action": "log"}}],
            },
            # Named once, not again for the route that inherits it.
            ["tools.t: an MCP tool named 'u'"],
            id="inherited-once",
        ),
    ],
)
def test_a_pin_that_says_nothing_is_refused_naming_its_key(
    data: dict[str, Any], problems: list[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert len(caught.value.problems) == len(problems)
    for said, expected in zip(caught.value.problems, problems, strict=True):
        assert said.startswith(expected)


def test_a_pin_that_accepts_every_call_is_warned_about_where_it_is() -> None:
    config = parse_config(
        {
            **ROUTED,
            "tools": {"open": {}, "closed": WEATHER},
            "routes": [{"upstream": "a", "gate": {"tools": {"any": True}}}],
        }
    )
    assert [w.partition(":")[0] for w in iter_warnings(config)] == [
        "tools.open",
        "routes[0].gate.tools.any",
    ]
