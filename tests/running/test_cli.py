"""The command line as a user meets it: every mistake is one line naming the flag or the key,
exit 2, no traceback; `--version`, `config check`, `config defaults`; a stop that ends."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.config import Config
from proxy.running.config_file import CONFIG_SCHEMA, MEANINGS, load_config
from tests.running.test_serve import start
from tests.servers.recording import Received, RecordingUpstream

REPO = Path(__file__).resolve().parents[2]


def replay_proxy(*argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield int(held.getsockname()[1])


# (argv after `replay-proxy`, the config file's text or None, stderr's one line); in all three
# `{dir}` is the test's directory and `{busy}` a port in use, `{config}` the config file;
# `{any}` in the line stands for any text (a list that grows with the code).
MISTAKES = [
    pytest.param(
        ["serve", "--port", "70000"],
        None,
        "replay-proxy: --port: '70000' is not a port (0 to 65535; 0 = any free one)",
        id="port-too-high",
    ),
    pytest.param(
        ["serve", "--port", "http"],
        None,
        "replay-proxy: --port: 'http' is not a port (0 to 65535; 0 = any free one)",
        id="port-not-a-number",
    ),
    pytest.param(
        ["serve", "--log-level", "loud"],
        None,
        "replay-proxy: --log-level: 'loud' is not a log level "
        "(debug, info, warning, error, critical)",
        id="log-level",
    ),
    pytest.param(
        ["serve", "--host", "[::1]"],
        None,
        "replay-proxy: --host: '[::1]' is not an IP address or a host name "
        "(an IPv6 address goes without brackets: ::1)",
        id="host-bracketed",
    ),
    pytest.param(
        ["serve", "--host", "bad host"],
        None,
        "replay-proxy: --host: 'bad host' is not an IP address or a host name "
        "(an IPv6 address goes without brackets: ::1)",
        id="host-space",
    ),
    pytest.param(
        ["serve", "--workers", "0"],
        None,
        "replay-proxy: --workers: '0' is not a number of processes (1 or more)",
        id="workers-0",
    ),
    pytest.param(
        ["serve", "--config", "{config}"],
        "gate: [\n",
        "replay-proxy: {config}: not valid YAML at line 2, column 1: while parsing a flow node: "
        "expected the node content, but found '<stream end>'",
        id="yaml-syntax",
    ),
    pytest.param(
        ["serve", "--config", "{config}"],
        "gate:\n  action: block\n  action: log\n",
        "replay-proxy: {config}: not valid YAML at line 3, column 3: duplicate key 'action'",
        id="yaml-duplicate-key",
    ),
    pytest.param(
        ["serve", "--config", "{config}"],
        "gate:\n  actons: {}\n",
        "replay-proxy: {config}:2:3: gate.actons: unknown key; did you mean actions?",
        id="did-you-mean-key",
    ),
    pytest.param(
        ["serve", "--config", "{config}"],
        "lisen: {port: 1}\n",
        "replay-proxy: {config}:1:1: lisen: unknown key; did you mean listen?",
        id="did-you-mean-section",
    ),
    pytest.param(
        ["serve", "--config", "{config}"],
        "gate: {actions: {orphn: log}}\n",
        "replay-proxy: {config}:1:18: gate.actions.orphn: unknown reason; did you mean orphan?",
        id="did-you-mean-reason",
    ),
    pytest.param(
        ["serve", "--config", "{config}"],
        "gate: {action: blok}\n",
        "replay-proxy: {config}:1:8: gate.action: 'blok' is not one of [{any}]; "
        "did you mean block?",
        id="did-you-mean-value",
    ),
    pytest.param(
        ["serve", "--config", "{config}"],
        "gate: {zzzz: 1}\n",
        "replay-proxy: {config}:1:8: gate.zzzz: unknown key",
        id="nothing-close",
    ),
    pytest.param(
        ["serve", "--config", "{config}", "--port", "0"],
        "audit: {path: '{dir}/missing/audit.jsonl'}\n",
        "replay-proxy: audit.path: cannot append to '{dir}/missing/audit.jsonl': "
        "No such file or directory",
        id="audit-path-no-directory",
    ),
    pytest.param(
        ["serve", "--config", "{config}", "--port", "0"],
        "audit: {path: '{dir}'}\n",
        "replay-proxy: audit.path: cannot append to '{dir}': Is a directory",
        id="audit-path-a-directory",
    ),
    pytest.param(
        ["serve", "--config", "{config}"],
        "upstream: {ca_file: '{config}'}\n",
        "replay-proxy: {config}:1:12: upstream.ca_file: '{config}' holds no CA certificate: ",
        id="ca-file-not-pem",
    ),
    pytest.param(
        ["serve", "--port", "{busy}"],
        None,
        "replay-proxy: --port: cannot listen on 127.0.0.1:{busy}: Address already in use",
        id="port-in-use-flag",
    ),
    pytest.param(
        ["serve", "--config", "{config}"],
        "listen: {port: {busy}}\naudit: {path: '{dir}/audit.jsonl'}\n",
        "replay-proxy: listen.port: cannot listen on 127.0.0.1:{busy}: Address already in use",
        id="port-in-use-key",
    ),
    pytest.param(
        ["serve", "--config", "{config}", "--port", "0"],
        # TEST-NET-1: an address no interface here has.
        "listen: {host: 192.0.2.1}\naudit: {path: '{dir}/audit.jsonl'}\n",
        "replay-proxy: listen.host: cannot listen on 192.0.2.1:0: Cannot assign requested address",
        id="host-not-here",
    ),
    pytest.param(
        ["serve", "--upstream", "ftp://x"],
        None,
        "replay-proxy: --upstream: url: 'ftp://x' is not an http(s) URL with a host",
        id="upstream-flag",
    ),
    pytest.param(
        ["serve", "--config", "{config}"],
        "upstream: {api_key_env: REPLAY_PROXY_TEST_NEVER_SET}\n",
        "replay-proxy: upstream.api_key_env: the environment variable "
        "REPLAY_PROXY_TEST_NEVER_SET is not set",
        id="api-key-env-unset",
    ),
    pytest.param(
        ["config", "check", "{config}"],
        "ledger: {backend: redis, ttl: 5}\n",
        "replay-proxy: {config}:1:26: ledger.ttl: unknown key; did you mean ttl_s?",
        id="config-check",
    ),
    pytest.param(
        ["config", "check", "{dir}/nowhere.yaml"],
        None,
        "replay-proxy: {dir}/nowhere.yaml: cannot read: No such file or directory",
        id="config-check-no-file",
    ),
]


@pytest.mark.parametrize(("argv", "config", "line"), MISTAKES)
def test_a_mistake_is_one_line_and_exit_2(
    tmp_path: Path, busy_port: int, argv: list[str], config: str | None, line: str
) -> None:
    path = tmp_path / "proxy.yaml"

    def fill(text: str) -> str:
        return (
            text.replace("{dir}", str(tmp_path))
            .replace("{config}", str(path))
            .replace("{busy}", str(busy_port))
        )

    if config is not None:
        path.write_text(fill(config), encoding="utf-8")

    done = replay_proxy(*map(fill, argv))

    assert done.returncode == 2
    # One line, with nothing around it: no usage text, no traceback, no unclosed session.
    assert done.stderr.count("\n") == 1, done.stderr
    expected = re.escape(fill(line)).replace(re.escape("{any}"), ".*")
    assert re.match(expected, done.stderr), done.stderr


def test_version() -> None:
    done = replay_proxy("--version")
    assert (done.returncode, done.stdout) == (0, f"replay-proxy {version('replay-proxy')}\n")


def test_config_check_says_ok_without_serving(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    # A port in use would stop `serve`; `config check` does not bind it.
    path.write_text("listen: {port: 1}\ngate: {action: strip}\n", encoding="utf-8")
    done = replay_proxy("config", "check", str(path))
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{path}: ok\n", "")


def test_config_check_passes_the_example() -> None:
    done = replay_proxy("config", "check", "config.example.yaml")
    assert (done.returncode, done.stdout) == (0, "config.example.yaml: ok\n")


def schema_keys(schema: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for name, inner in schema["properties"].items():
        if "properties" in inner:
            yield from schema_keys(inner, f"{prefix}{name}.")
        else:
            yield prefix + name


def printed_keys(lines: list[str]) -> Iterator[str]:
    """The dotted keys of `config defaults`' YAML, commented-out ones included."""
    path: list[tuple[int, str]] = []
    for line in lines:
        found = re.match(r"( *)(?:# )?([a-z_]+):", line)
        if found is None:
            continue
        indent = len(found.group(1))
        path = [(i, n) for i, n in path if i < indent]
        path.append((indent, found.group(2)))
        if not line.rstrip().endswith(":"):
            yield ".".join(n for _, n in path)


def test_config_defaults_names_every_key_with_its_meaning(tmp_path: Path) -> None:
    done = replay_proxy("config", "defaults")
    assert done.returncode == 0
    every = sorted(schema_keys(CONFIG_SCHEMA))
    assert sorted(printed_keys(done.stdout.splitlines())) == every
    assert sorted(MEANINGS) == every
    for line in done.stdout.splitlines()[1:]:
        if not line.rstrip().endswith(":"):
            assert re.search(r" # \S", line), line  # every key has its meaning
    # What it prints is a config, and the one that holds the defaults.
    path = tmp_path / "defaults.yaml"
    path.write_text(done.stdout, encoding="utf-8")
    assert load_config(path) == Config()
    assert "  shutdown_grace_s: 30.0 " in done.stdout


async def test_sigterm_ends_within_the_grace_and_logs_stopped(
    recording_upstream: RecordingUpstream, tmp_path: Path
) -> None:
    """A request the upstream never answers is cut once `shutdown_grace_s` is over; the process
    logs its last line and exits 0 (the bound below only guards against a hang)."""
    answered = asyncio.Event()

    async def never(request: web.Request, received: Received) -> web.StreamResponse:
        answered.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    recording_upstream.handler = never
    path = tmp_path / "proxy.yaml"
    path.write_text(
        f"listen: {{shutdown_grace_s: 1}}\naudit: {{path: '{tmp_path / 'audit.jsonl'}'}}\n",
        encoding="utf-8",
    )
    proxy = await start("--config", str(path), "--upstream", recording_upstream.url)
    assert proxy.process.stderr is not None
    async with aiohttp.ClientSession() as session:
        request = asyncio.ensure_future(
            session.post(proxy.url + "/v1/responses", json={"input": "hi"})
        )
        await asyncio.wait_for(answered.wait(), timeout=30)
        proxy.terminate()
        code = await asyncio.wait_for(proxy.process.wait(), timeout=30)
        with pytest.raises(aiohttp.ClientError):
            await request
    rest = (await proxy.process.stderr.read()).decode().splitlines()
    assert code == 0
    assert "1 request(s) still in flight after 1 s: cut" in rest[-2]
    assert rest[-1].endswith(f"replay_proxy[{proxy.process.pid}]: stopped")
