"""The config's `log` and `tracing` sections: their values, their mistakes, their defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.config import Config
from proxy.running.config_file import iter_defaults, load_config, parse_config
from proxy.settings import ConfigError, Log, TracingSettings

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param({}, Config(), id="defaults"),
        pytest.param({"log": {"format": "json"}}, Config(log=Log("json")), id="json"),
        pytest.param(
            {"tracing": {"enabled": True, "endpoint": "http://127.0.0.1:4318/v1/traces"}},
            Config(tracing=TracingSettings(True, "http://127.0.0.1:4318/v1/traces")),
            id="tracing-on",
        ),
        pytest.param(
            {"tracing": {"service_name": "edge"}},
            Config(tracing=TracingSettings(service_name="edge")),
            id="service-name",
        ),
    ],
)
def test_sections(data: dict[str, Any], expected: Config) -> None:
    assert parse_config(data) == expected


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(
            {"log": {"format": "jsno"}},
            "log.format: 'jsno' is not one of ['text', 'json']; did you mean json?",
            id="format-misspelt",
        ),
        pytest.param(
            {"log": {"fromat": "json"}},
            "log.fromat: unknown key; did you mean format?",
            id="key-misspelt",
        ),
        pytest.param(
            {"tracing": {"enabled": "yes"}},
            "tracing.enabled: 'yes' is not of type 'boolean'",
            id="enabled-not-boolean",
        ),
        pytest.param(
            {"tracing": {"endpoint": "collector:4318"}},
            "tracing.endpoint: 'collector:4318' is not an http(s) URL with a host",
            id="endpoint-not-a-url",
        ),
        pytest.param(
            {"tracing": {"endpont": "http://c"}},
            "tracing.endpont: unknown key; did you mean endpoint?",
            id="endpoint-misspelt",
        ),
        pytest.param(
            {"tracing": {"service_name": ""}},
            "tracing.service_name: '' should be non-empty",
            id="empty-service-name",
        ),
    ],
)
def test_mistakes_name_the_key(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(data)
    assert str(raised.value) == message


def test_defaults_list_both_sections() -> None:
    lines = list(iter_defaults())
    for key in ("log:", "  format:", "tracing:", "  enabled:", "  # endpoint:", "  service_name:"):
        assert any(line.startswith(key) for line in lines), key


def test_example_config_shows_their_defaults() -> None:
    config = load_config(ROOT / "config.example.yaml")
    assert config.log == Config().log
    assert config.tracing == Config().tracing
