"""TLS on the listener (`listen.tls`): the official SDK over https, mutual TLS, and every
mistake in the keys named at load."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
import trustme

from proxy.running.config_file import parse_config
from proxy.settings import ConfigError
from tests.running.test_serve import start
from tests.servers.recording import RecordingUpstream


def tls_files(directory: Path) -> trustme.CA:
    """A CA (ca.pem), the proxy's certificate for 127.0.0.1 (server.*), a client's (client.*)."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    for name, identity in (("server", "127.0.0.1"), ("client", "agent@replay-proxy.test")):
        issued = ca.issue_cert(identity)
        (directory / f"{name}.pem").write_bytes(b"".join(p.bytes() for p in issued.cert_chain_pems))
        issued.private_key_pem.write_to_path(str(directory / f"{name}.key"))
    return ca


def write_config(directory: Path, *, mutual: bool) -> str:
    tls = f"cert_file: '{directory / 'server.pem'}', key_file: '{directory / 'server.key'}'"
    if mutual:
        tls += f", client_ca_file: '{directory / 'ca.pem'}'"
    path = directory / "proxy.yaml"
    path.write_text(
        f"listen: {{tls: {{{tls}}}}}\naudit: {{path: '{directory / 'audit.jsonl'}'}}\n",
        encoding="utf-8",
    )
    return str(path)


def client_context(directory: Path, *, with_certificate: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(directory / "ca.pem"))
    if with_certificate:
        context.load_cert_chain(str(directory / "client.pem"), str(directory / "client.key"))
    return context


async def ask(url: str, context: ssl.SSLContext) -> str:
    """One `responses.create` through the official SDK, verifying the proxy with `context`."""
    async with (
        httpx2.AsyncClient(verify=context) as http,
        openai.AsyncOpenAI(
            base_url=url + "/v1", api_key="sk-test", max_retries=0, http_client=http
        ) as client,
    ):
        response = await client.responses.create(model="m", input="hi")
    return response.id


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mutual-tls"])
async def test_the_sdk_talks_to_the_proxy_over_https(
    recording_upstream: RecordingUpstream, tmp_path: Path, mutual: bool
) -> None:
    tls_files(tmp_path)
    proxy = await start(
        "--config", write_config(tmp_path, mutual=mutual), "--upstream", recording_upstream.url
    )
    try:
        assert proxy.url.startswith("https://127.0.0.1:")
        context = client_context(tmp_path, with_certificate=mutual)
        assert await ask(proxy.url, context) == "resp_1"
    finally:
        assert await proxy.stop() == 0
    assert [(r.method, r.target, r.json()["input"]) for r in recording_upstream.received] == [
        ("POST", "/v1/responses", "hi")
    ]


async def test_mutual_tls_refuses_a_client_without_a_certificate(
    recording_upstream: RecordingUpstream, tmp_path: Path
) -> None:
    tls_files(tmp_path)
    proxy = await start(
        "--config", write_config(tmp_path, mutual=True), "--upstream", recording_upstream.url
    )
    try:
        with pytest.raises(openai.APIConnectionError):
            await ask(proxy.url, client_context(tmp_path, with_certificate=False))
        # A client that the CA did not issue a certificate to is refused too.
        stranger = trustme.CA().issue_cert("stranger.test")
        context = client_context(tmp_path, with_certificate=False)
        stranger.configure_cert(context)
        with pytest.raises(openai.APIConnectionError):
            await ask(proxy.url, context)
    finally:
        assert await proxy.stop() == 0
    assert recording_upstream.received == []


# (listen.tls as given, with {dir} the files' directory; the error's start)
TLS_MISTAKES = [
    pytest.param(
        {"cert_file": "{dir}/server.pem"},
        "listen.tls: 'key_file' is a required property",
        id="no-key",
    ),
    pytest.param(
        {"cert_file": "{dir}/nowhere.pem", "key_file": "{dir}/server.key"},
        "listen.tls.cert_file: '{dir}/nowhere.pem' is not a readable file",
        id="cert-missing",
    ),
    pytest.param(
        {"cert_file": "{dir}/server.pem", "key_file": "{dir}"},
        "listen.tls.key_file: '{dir}' is not a readable file",
        id="key-a-directory",
    ),
    pytest.param(
        {"cert_file": "{dir}/server.pem", "key_file": "{dir}/client.key"},
        "listen.tls.cert_file: '{dir}/server.pem' with key_file '{dir}/client.key' is not a "
        "certificate and its key",
        id="key-of-another-certificate",
    ),
    pytest.param(
        {"cert_file": "{dir}/ca.pem", "key_file": "{dir}/ca.pem"},
        "listen.tls.cert_file: '{dir}/ca.pem' with key_file '{dir}/ca.pem' is not a certificate",
        id="no-key-in-the-file",
    ),
    pytest.param(
        {
            "cert_file": "{dir}/server.pem",
            "key_file": "{dir}/server.key",
            "client_ca_file": "{dir}/server.key",
        },
        "listen.tls.client_ca_file: '{dir}/server.key' holds no CA certificate",
        id="client-ca-not-a-certificate",
    ),
    pytest.param(
        {"cert_file": "{dir}/server.pem", "key_file": "{dir}/server.key", "client_ca": "x"},
        "listen.tls.client_ca: unknown key; did you mean client_ca_file?",
        id="misspelt",
    ),
]


@pytest.mark.parametrize(("tls", "message"), TLS_MISTAKES)
def test_a_tls_mistake_names_the_key(tmp_path: Path, tls: dict[str, Any], message: str) -> None:
    tls_files(tmp_path)
    filled = {key: value.replace("{dir}", str(tmp_path)) for key, value in tls.items()}
    with pytest.raises(ConfigError) as caught:
        parse_config({"listen": {"tls": filled}})
    assert str(caught.value).startswith(message.replace("{dir}", str(tmp_path)))


def test_tls_is_off_by_default_and_loads_when_given(tmp_path: Path) -> None:
    tls_files(tmp_path)
    assert parse_config({}).listen.tls is None
    tls = {"cert_file": str(tmp_path / "server.pem"), "key_file": str(tmp_path / "server.key")}
    listen = parse_config({"listen": {"tls": tls}}).listen
    assert listen.tls is not None
    assert (listen.tls.cert_file, listen.tls.client_ca_file, listen.scheme) == (
        tls["cert_file"],
        None,
        "https",
    )
