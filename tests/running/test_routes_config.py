"""`upstreams:` and `routes:`: the issue's config shape loads as written, the single `upstream:`
form is one upstream `default` and one route, and every mistake names its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.config import DEFAULT_UPSTREAM, Config, Route
from proxy.gate.policy import Policy
from proxy.running.config_file import parse_config
from proxy.settings import ConfigError, UpstreamSettings

# The shape the issue gives, word for word (a contract: tests outside the suite use these names).
TWO_PROVIDERS: dict[str, Any] = {
    "upstreams": {
        "openai": {
            "url": "https://api.openai.example",
            "vendor": "openai",
            "api_key_env": "OPENAI_API_KEY",
        },
        "acme": {"url": "http://127.0.0.1:9000", "vendor": "acme"},
    },
    "routes": [
        {"path_prefix": "/acme", "upstream": "acme"},
        {"model": "acme/*", "upstream": "acme", "strip_model_prefix": True},
        {
            "header": {"name": "x-replay-upstream", "value": "acme"},
            "upstream": "acme",
            "materialize": True,
        },
        {"upstream": "openai"},
    ],
    "ledger": {"whole_items": True},
}


def test_the_two_provider_shape_loads_as_written() -> None:
    config = parse_config(TWO_PROVIDERS)
    assert dict(config.upstream_named) == {
        "openai": UpstreamSettings(
            url="https://api.openai.example", vendor="openai", api_key_env="OPENAI_API_KEY"
        ),
        "acme": UpstreamSettings(url="http://127.0.0.1:9000", vendor="acme"),
    }
    acme, openai = Policy(vendor="acme"), Policy(vendor="openai")
    assert config.routing == (
        Route("acme", path_prefix="/acme", gate=acme),
        Route("acme", model="acme/*", strip_model_prefix=True, gate=acme),
        Route("acme", header=("x-replay-upstream", "acme"), materialize=True, gate=acme),
        Route("openai", gate=openai),
    )


def test_each_upstream_takes_its_own_key_from_the_environment() -> None:
    config = parse_config(TWO_PROVIDERS).with_secrets({"OPENAI_API_KEY": "sk-openai"})
    assert config.upstream_named["openai"].api_key == "sk-openai"
    assert config.upstream_named["acme"].api_key is None


def test_the_single_upstream_form_is_one_upstream_default_and_one_route() -> None:
    config = parse_config({"upstream": {"url": "http://127.0.0.1:8000"}, "gate": {"action": "log"}})
    assert dict(config.upstream_named) == {DEFAULT_UPSTREAM: config.upstream}
    [route] = config.routing
    # No vendor: the gate judges no item by its slug, exactly as before routes existed.
    assert route == Route(DEFAULT_UPSTREAM, gate=Policy(action="log"))
    assert route.gate is config.gate
    assert Config().routing == (Route(DEFAULT_UPSTREAM),)


def test_a_route_gate_overrides_the_top_level_gate_for_that_route_only() -> None:
    sales = {"type": "object", "properties": {"region": {"enum": ["apac"]}}}
    config = parse_config(
        {
            "upstreams": {"a": {"url": "http://127.0.0.1:1"}, "b": {"url": "http://127.0.0.1:2"}},
            "routes": [
                {
                    "path_prefix": "/b",
                    "upstream": "b",
                    "gate": {
                        "action": "strip",
                        "actions": {"status": "log"},
                        "tools": {"s": sales},
                    },
                },
                {"upstream": "a"},
            ],
            "gate": {"actions": {"orphan": "log"}, "allow_missing_status": True},
            "tools": {"t": True},
        }
    )
    b, a = config.routing
    assert b.gate == Policy(
        action="strip",
        actions={"orphan": "log", "status": "log"},
        allow_missing_status=True,
        tools={"t": True, "s": sales},
    )
    assert a.gate is config.gate


def _two(**route: Any) -> dict[str, Any]:
    return {
        "upstreams": {"a": {"url": "http://127.0.0.1:1"}},
        "routes": [{"upstream": "a", **route}],
    }


# (config, the start of the error)
MISTAKES = [
    pytest.param(
        {**_two(), "upstream": {"url": "http://127.0.0.1:1"}},
        "upstreams: give either upstream: (one provider) or upstreams:",
        id="both-forms",
    ),
    pytest.param(
        {"upstreams": {"a": {"url": "http://127.0.0.1:1"}}},
        "routes: upstreams: needs",
        id="no-routes",
    ),
    pytest.param({"routes": [{"upstream": "a"}]}, "upstreams: routes: needs", id="no-upstreams"),
    pytest.param({**_two(), "upstreams": {}}, "upstreams: {} should be non-empty", id="empty"),
    pytest.param({**_two(), "routes": []}, "routes: [] should be non-empty", id="no-route"),
    pytest.param(
        {**_two(), "upstreams": {"a": {"vendor": "a"}}},
        "upstreams.a: 'url' is a required property",
        id="upstream-url",
    ),
    pytest.param(
        {**_two(), "upstreams": {"a": {"url": "http://x", "vendr": "a"}}},
        "upstreams.a.vendr: unknown key; did you mean vendor?",
        id="upstream-misspelt",
    ),
    pytest.param(
        {**_two(), "upstreams": {"a": {"url": "ftp://x"}}},
        "upstreams.a.url: 'ftp://x' is not an http(s) URL",
        id="upstream-bad-url",
    ),
    pytest.param(
        {**_two(), "upstreams": {"a": {"url": "http://x", "vendor": "acme:x"}}},
        "upstreams.a.vendor: 'acme:x' is not a vendor slug",
        id="vendor-colon",
    ),
    pytest.param(
        {**_two(), "upstreams": {"a b": {"url": "http://x"}}},
        "upstreams.a b: not a name for an upstream",
        id="upstream-name",
    ),
    pytest.param(
        _two(upstream="b"), "routes[0].upstream: 'b' is not one of upstreams: a", id="unknown"
    ),
    pytest.param(
        {**_two(), "routes": [{"path_prefix": "/a"}]},
        "routes[0]: 'upstream' is a required property",
        id="route-upstream",
    ),
    pytest.param(_two(modl="x"), "routes[0].modl: unknown key; did you mean model?", id="misspelt"),
    pytest.param(_two(path_prefix="acme"), "routes[0].path_prefix: 'acme' does not", id="rel"),
    pytest.param(
        _two(path_prefix="/acme/"), "routes[0].path_prefix: '/acme/' is not a path", id="slash"
    ),
    pytest.param(
        _two(path_prefix="/a/../b"), "routes[0].path_prefix: '/a/../b' is not a path", id="dots"
    ),
    pytest.param(
        _two(path_prefix="/a%2Fb"), "routes[0].path_prefix: '/a%2Fb' is not a path", id="escape"
    ),
    pytest.param(_two(path_prefix="/-/x"), "routes[0].path_prefix: '/-/x' is under /-/", id="own"),
    pytest.param(_two(model=""), "routes[0].model: '' should be non-empty", id="model-empty"),
    pytest.param(
        _two(strip_model_prefix=True),
        "routes[0].strip_model_prefix: only a route that matches a model",
        id="strip-without-model",
    ),
    pytest.param(
        _two(strip_model_prefix="yes"),
        "routes[0].strip_model_prefix: 'yes' is not of type 'boolean'",
        id="strip-not-bool",
    ),
    pytest.param(
        _two(header={"name": "x-up"}),
        "routes[0].header: 'value' is a required property",
        id="header-value",
    ),
    pytest.param(
        _two(header={"name": "x up", "value": "a"}),
        "routes[0].header.name: 'x up' does not match",
        id="header-name",
    ),
    pytest.param(
        _two(header="x-up: a"), "routes[0].header: 'x-up: a' is not of type 'object'", id="header"
    ),
    pytest.param(
        _two(materialize=True),
        "routes[0].materialize: inlining a recorded conversation needs the whole items: set "
        "ledger.whole_items: true",
        id="materialize-without-whole-items",
    ),
    pytest.param(
        _two(materialize=1), "routes[0].materialize: 1 is not of type 'boolean'", id="materialize"
    ),
    pytest.param(
        _two(gate={"actons": {}}), "routes[0].gate.actons: unknown key", id="route-gate-key"
    ),
    pytest.param(
        _two(gate={"action": "allow"}), "routes[0].gate.action: 'allow' is not one of", id="action"
    ),
    pytest.param(
        _two(gate={"actions": {"orphan": "rewrite"}}),
        "routes[0].gate.actions.orphan: rewrite is not an action for orphan",
        id="route-gate-rewrite",
    ),
    pytest.param(
        _two(gate={"tools": {"t": {"type": 12}}}),
        "routes[0].gate.tools.t: not a valid JSON Schema",
        id="route-gate-tool",
    ),
    pytest.param(
        {**_two(), "ledger": {"whole_items": "yes"}},
        "ledger.whole_items: 'yes' is not of type 'boolean'",
        id="whole-items",
    ),
]


@pytest.mark.parametrize(("data", "message"), MISTAKES)
def test_mistake_names_the_key(data: Any, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert str(caught.value).startswith(message), str(caught.value)


def test_the_upstream_flag_does_not_silently_override_named_upstreams() -> None:
    with pytest.raises(ConfigError, match=r"^--upstream: the config names its upstreams"):
        parse_config(_two()).with_overrides(upstream="http://127.0.0.1:5")


def test_an_upstream_key_missing_from_the_environment_names_its_upstream() -> None:
    data = {**_two(), "upstreams": {"a": {"url": "http://x", "api_key_env": "A_KEY"}}}
    with pytest.raises(ConfigError, match=r"^upstreams\.a\.api_key_env: the environment variable"):
        parse_config(data).with_secrets({})


def test_the_example_configs_two_provider_form_loads_when_uncommented() -> None:
    text = (Path(__file__).resolve().parents[2] / "config.example.yaml").read_text("utf-8")
    block = text[text.index("# upstreams:") :].split("\n\n")[0]
    lines = (line.removeprefix("# ") for line in block.splitlines())
    uncommented = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    data = yaml.safe_load(uncommented) | {"ledger": {"whole_items": True}}
    config = parse_config(data)
    assert list(config.upstream_named) == ["openai", "acme"]
    assert [route.upstream for route in config.routing] == ["acme", "acme", "acme", "openai"]
    assert config.routing[3].gate.action == "strip"
