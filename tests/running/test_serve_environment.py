"""`replay-proxy serve` takes the upstream URL and the listen address from REPLAY_PROXY_*
variables (what a container sets): flags win over them, they win over the file."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from proxy.running.cli import VARIABLES
from tests.builders import CLEAN, JSON_HEADERS
from tests.running.test_serve import REPO, start
from tests.servers.recording import RecordingUpstream


def environment(**variables: str) -> dict[str, str]:
    """This environment without any REPLAY_PROXY_* variable of its own, and `variables`."""
    found = {k: v for k, v in os.environ.items() if k not in VARIABLES.values()}
    return found | variables


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port this test holds listening: nothing else can serve on it."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield int(held.getsockname()[1])


@pytest.fixture
def refused() -> Iterator[str]:
    """A loopback URL whose port is bound and not listening: a connection to it is refused."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{held.getsockname()[1]}"


def config_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "proxy.yaml"
    path.write_text(text)
    return str(path)


async def forwarded(url: str) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/responses", data=CLEAN, headers=JSON_HEADERS) as response,
    ):
        await response.read()
        return response.status


async def test_the_environment_wins_over_the_file(
    tmp_path: Path, recording_upstream: RecordingUpstream, taken: int, refused: str
) -> None:
    # The file's own values could not serve: an address this host does not have, a port that
    # is taken, an upstream that refuses.
    config = config_file(
        tmp_path, f"listen: {{host: 192.0.2.1, port: {taken}}}\nupstream: {{url: '{refused}'}}\n"
    )
    proxy = await start(
        "--config",
        config,
        port=None,
        env=environment(
            REPLAY_PROXY_UPSTREAM_URL=recording_upstream.url,
            REPLAY_PROXY_LISTEN_HOST="127.0.0.1",
            REPLAY_PROXY_LISTEN_PORT="0",
        ),
    )
    try:
        assert proxy.url.startswith("http://127.0.0.1:")
        assert proxy.url != f"http://127.0.0.1:{taken}"
        assert await forwarded(proxy.url) == 200
    finally:
        assert await proxy.stop() == 0
    assert [r.body for r in recording_upstream.received] == [CLEAN]


async def test_flags_win_over_the_environment(
    recording_upstream: RecordingUpstream, taken: int, refused: str
) -> None:
    proxy = await start(
        "--upstream",
        recording_upstream.url,
        "--host",
        "127.0.0.1",
        env=environment(
            REPLAY_PROXY_UPSTREAM_URL=refused,
            REPLAY_PROXY_LISTEN_HOST="192.0.2.1",
            REPLAY_PROXY_LISTEN_PORT=str(taken),
        ),
    )
    try:
        assert proxy.url != f"http://127.0.0.1:{taken}"
        assert await forwarded(proxy.url) == 200
    finally:
        assert await proxy.stop() == 0
    assert [r.body for r in recording_upstream.received] == [CLEAN]


async def test_an_empty_variable_is_not_set(recording_upstream: RecordingUpstream) -> None:
    proxy = await start(
        "--upstream",
        recording_upstream.url,
        env=environment(REPLAY_PROXY_UPSTREAM_URL="", REPLAY_PROXY_LISTEN_HOST=""),
    )
    try:
        assert proxy.url.startswith("http://127.0.0.1:")  # the file's (here the default) host
        assert await forwarded(proxy.url) == 200
    finally:
        assert await proxy.stop() == 0


def serve(tmp_path: Path, config: str, **variables: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--config", config_file(tmp_path, config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=environment(**variables),
    )


@pytest.mark.parametrize(
    ("config", "variables", "message"),
    [
        pytest.param(
            "",
            {"REPLAY_PROXY_LISTEN_PORT": "99999"},
            "REPLAY_PROXY_LISTEN_PORT: '99999' is not a port (0 to 65535; 0 = any free one)",
            id="port",
        ),
        pytest.param(
            "",
            {"REPLAY_PROXY_LISTEN_HOST": "[::1]"},
            "REPLAY_PROXY_LISTEN_HOST: '[::1]' is not an IP address or a host name",
            id="host",
        ),
        pytest.param(
            "",
            {"REPLAY_PROXY_UPSTREAM_URL": "ftp://x"},
            "REPLAY_PROXY_UPSTREAM_URL: ",
            id="url",
        ),
        pytest.param(
            "upstreams: {a: {url: 'http://127.0.0.1:1'}}\nroutes: [{upstream: a}]\n",
            {"REPLAY_PROXY_UPSTREAM_URL": "http://127.0.0.1:2"},
            "REPLAY_PROXY_UPSTREAM_URL: the config names its upstreams (upstreams:)",
            id="url-with-upstreams",
        ),
    ],
)
def test_a_bad_variable_stops_the_start_naming_it(
    tmp_path: Path, config: str, variables: dict[str, str], message: str
) -> None:
    done = serve(tmp_path, config, **variables)
    assert done.returncode == 2
    assert done.stderr.startswith(f"replay-proxy: {message}"), done.stderr


def test_a_taken_port_from_the_environment_is_named(tmp_path: Path, taken: int) -> None:
    done = serve(
        tmp_path,
        "listen: {host: 127.0.0.1}\n",
        REPLAY_PROXY_LISTEN_PORT=str(taken),
    )
    assert done.returncode == 2
    assert f"replay-proxy: REPLAY_PROXY_LISTEN_PORT: cannot listen on 127.0.0.1:{taken}" in (
        done.stderr
    )
