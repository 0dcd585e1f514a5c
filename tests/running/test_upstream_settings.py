"""The `upstream:` settings of the hop: every key, a ConfigError naming the key for every
mistake, what is taken from the environment (the key, the forward proxy), and the session
they make."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trustme

from proxy.config import proxy_for
from proxy.running.config_file import parse_config
from proxy.server.upstream import Upstream as Hop
from proxy.settings import ConfigError, UpstreamSettings


def pem_files(directory: Path) -> None:
    """A CA's certificate (ca.pem), and a certificate it issued with its key (client.*)."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    issued = ca.issue_cert("replay-proxy.test")
    issued.cert_chain_pems[0].write_to_path(str(directory / "client.pem"))
    issued.private_key_pem.write_to_path(str(directory / "client.key"))


def test_every_upstream_key(tmp_path: Path) -> None:
    pem_files(tmp_path)
    config = parse_config(
        {
            "upstream": {
                "url": "https://api.example.test",
                "max_connections": 8,
                "keepalive_s": 4.5,
                "ca_file": str(tmp_path / "ca.pem"),
                "client_cert": str(tmp_path / "client.pem"),
                "client_key": str(tmp_path / "client.key"),
                "trust_env": False,
            }
        }
    )
    assert config.upstream == UpstreamSettings(
        url="https://api.example.test",
        max_connections=8,
        keepalive_s=4.5,
        ca_file=str(tmp_path / "ca.pem"),
        client_cert=str(tmp_path / "client.pem"),
        client_key=str(tmp_path / "client.key"),
        trust_env=False,
    )


def test_the_defaults() -> None:
    upstream = parse_config({}).upstream
    assert (upstream.max_connections, upstream.keepalive_s, upstream.trust_env) == (4096, 4, True)
    assert (upstream.ca_file, upstream.client_cert, upstream.client_key) == (None, None, None)


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        pytest.param({"max_connections": 0}, "upstream.max_connections", id="no-connections"),
        pytest.param({"max_connections": 1.5}, "upstream.max_connections", id="fractional"),
        pytest.param({"keepalive_s": 0}, "upstream.keepalive_s", id="keepalive-zero"),
        pytest.param({"trust_env": "yes"}, "upstream.trust_env", id="trust-env-string"),
        pytest.param({"ca_file": "/nonexistent/ca.pem"}, "upstream.ca_file", id="ca-missing"),
        pytest.param({"client_cert": "client.pem"}, "upstream.client_key", id="cert-without-key"),
        pytest.param({"client_key": "client.key"}, "upstream.client_cert", id="key-without-cert"),
        pytest.param({"ca_file": "not-pem"}, "upstream.ca_file", id="ca-not-pem"),
        pytest.param(
            {"client_cert": "not-pem", "client_key": "client.key"},
            "upstream.client_cert",
            id="cert-not-pem",
        ),
        pytest.param(
            {"client_cert": "client.pem", "client_key": "ca.pem"},
            "upstream.client_cert",
            id="key-not-the-certificate's",
        ),
        pytest.param({"max_connection": 4}, "upstream.max_connection: unknown key", id="typo"),
    ],
)
def test_a_bad_upstream_setting_names_its_key(
    tmp_path: Path, section: dict[str, Any], expected: str
) -> None:
    pem_files(tmp_path)
    (tmp_path / "not-pem").write_text("-", encoding="utf-8")
    section = {
        k: str(tmp_path / v) if isinstance(v, str) and not v.startswith("/") else v
        for k, v in section.items()
    }
    with pytest.raises(ConfigError) as raised:
        parse_config({"upstream": section})
    assert str(raised.value).startswith(expected), str(raised.value)


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("sk-abc\r\nX-Injected: 1", id="crlf"),
        pytest.param("sk-abc\n", id="trailing-lf"),
        pytest.param("sk-\rabc", id="cr"),
        pytest.param("sk-\x00abc", id="nul"),
        pytest.param("sk-\x7fabc", id="del"),
    ],
)
def test_an_api_key_that_would_break_its_header_is_refused_at_load(key: str) -> None:
    config = parse_config({"upstream": {"api_key_env": "KEY"}})
    with pytest.raises(ConfigError) as raised:
        config.with_secrets({"KEY": key})
    message = str(raised.value)
    assert message.startswith("upstream.api_key_env: ")
    assert "KEY" in message
    assert key not in message  # the secret is never echoed


def test_a_plain_api_key_is_taken() -> None:
    config = parse_config({"upstream": {"api_key_env": "KEY"}}).with_secrets({"KEY": "sk-\tok"})
    assert config.upstream.api_key == "sk-\tok"


P = "http://fwd.test:3128"


@pytest.mark.parametrize(
    ("url", "environ", "expected"),
    [
        pytest.param("https://api.test", {}, None, id="nothing-set"),
        pytest.param("https://api.test", {"HTTPS_PROXY": P}, P, id="https-proxy"),
        pytest.param("https://api.test", {"https_proxy": P, "HTTPS_PROXY": "x:1"}, P, id="lower"),
        pytest.param("https://api.test", {"HTTP_PROXY": P}, None, id="http-proxy-not-for-https"),
        pytest.param("http://api.test", {"HTTP_PROXY": P}, P, id="http-proxy"),
        pytest.param("http://api.test", {"ALL_PROXY": P}, P, id="all-proxy"),
        pytest.param("https://api.test", {"HTTPS_PROXY": "fwd.test:3128"}, P, id="bare-host"),
        pytest.param("https://api.test", {"HTTPS_PROXY": P, "NO_PROXY": "*"}, None, id="no-*"),
        pytest.param(
            "https://api.test", {"HTTPS_PROXY": P, "NO_PROXY": "a.test, api.test"}, None, id="no"
        ),
        pytest.param(
            "https://eu.api.test", {"HTTPS_PROXY": P, "no_proxy": ".api.test"}, None, id="domain"
        ),
        pytest.param(
            "https://eu.api.test", {"HTTPS_PROXY": P, "NO_PROXY": "api.test"}, None, id="suffix"
        ),
        pytest.param(
            "https://badapi.test", {"HTTPS_PROXY": P, "NO_PROXY": "api.test"}, P, id="not-suffix"
        ),
        pytest.param(
            "https://api.test", {"HTTPS_PROXY": P, "NO_PROXY": "api.test:8443"}, P, id="other-port"
        ),
        pytest.param(
            "https://api.test:8443",
            {"HTTPS_PROXY": P, "NO_PROXY": "api.test:8443"},
            None,
            id="same-port",
        ),
        pytest.param(
            "http://127.0.0.1:8000", {"HTTP_PROXY": P, "NO_PROXY": "127.0.0.1"}, None, id="ip"
        ),
        pytest.param("http://[::1]:80", {"HTTP_PROXY": P, "NO_PROXY": "[::1]:80"}, None, id="v6"),
    ],
)
def test_the_proxy_the_environment_names(
    url: str, environ: dict[str, str], expected: str | None
) -> None:
    assert proxy_for(url, environ) == expected


def test_a_proxy_that_is_not_http_is_a_config_error() -> None:
    config = parse_config({"upstream": {"url": "https://api.test"}})
    with pytest.raises(ConfigError, match=r"^upstream\.trust_env: "):
        config.with_secrets({"HTTPS_PROXY": "socks5://fwd.test:1080"})


@pytest.mark.parametrize(
    ("trust_env", "expected"),
    [pytest.param(True, P, id="trusted"), pytest.param(False, None, id="not-trusted")],
)
def test_trust_env_decides_whether_the_proxy_is_taken(
    trust_env: bool, expected: str | None
) -> None:
    config = parse_config({"upstream": {"url": "https://api.test", "trust_env": trust_env}})
    assert config.with_secrets({"HTTPS_PROXY": P}).upstream.proxy == expected


async def test_the_session_is_made_to_the_settings() -> None:
    hop = Hop(UpstreamSettings(url="http://127.0.0.1:9", max_connections=3, keepalive_s=2))
    await hop.start()
    try:
        assert hop.session.connector is not None
        assert hop.session.connector.limit == 3
        assert hop.session.auto_decompress is False
        assert hop.session.trust_env is False
    finally:
        await hop.close()
