"""The `admin:` section of the config: where the admin endpoints listen, each mistake named."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.running.config_file import parse_config
from proxy.settings import AdminListen, ConfigError


@pytest.mark.parametrize(
    ("data", "listen"),
    [
        pytest.param({}, None, id="unset"),
        pytest.param({"admin": {}}, None, id="empty"),
        pytest.param(
            {"admin": {"listen": {"port": 8788}}}, AdminListen(8788, "127.0.0.1"), id="port"
        ),
        pytest.param(
            {"admin": {"listen": {"host": "10.0.0.5", "port": 0}}},
            AdminListen(0, "10.0.0.5"),
            id="host-and-any-port",
        ),
    ],
)
def test_admin_listen_is_read(data: dict[str, Any], listen: AdminListen | None) -> None:
    assert parse_config(data).admin.listen == listen


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(
            {"admin": {"listen": {"prot": 1}}},
            # Both mistakes, in one run.
            "admin.listen.prot: unknown key; did you mean port?\n"
            "admin.listen: 'port' is a required property",
            id="misspelt",
        ),
        pytest.param(
            {"admin": {"lisen": {}}},
            "admin.lisen: unknown key; did you mean listen?",
            id="misspelt-section",
        ),
        pytest.param(
            {"admin": {"listen": {"host": "::1"}}},
            "admin.listen: 'port' is a required property",
            id="no-port",
        ),
        pytest.param(
            {"admin": {"listen": {"port": 70000}}},
            "admin.listen.port: 70000 is greater than the maximum of 65535",
            id="port-range",
        ),
        pytest.param(
            {"admin": {"listen": {"port": 1, "host": ""}}},
            "admin.listen.host: '' should be non-empty",
            id="empty-host",
        ),
    ],
)
def test_admin_mistakes_name_the_key(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(data)
    assert str(raised.value) == message
