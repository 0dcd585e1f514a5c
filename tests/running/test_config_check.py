"""`replay-proxy config check`: every mistake of a file in one run, each with its key and its
line and column; warnings for what loads but misleads; `--connect` reaching what the config
names (upstreams over TCP and TLS, a Redis ledger, the audit file)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from proxy.running.config_file import parse_config
from proxy.running.config_review import describe
from proxy.running.workers import free_port
from tests.running.test_serve import REPO, start
from tests.running.test_tls import tls_files, write_config
from tests.servers.redis_server import RedisServer


def config_check(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "config", "check", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )


FIVE_MISTAKES = """\
listen:
  port: 99999
gate:
  actons: {}
upstream:
  uri: http://127.0.0.1:8000
tools:
  get_weather:
    parameters: {type: object}
audit:
  paht: audit.jsonl
"""


def test_every_mistake_is_named_in_one_run_with_its_place(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(FIVE_MISTAKES)
    done = config_check(str(path))
    assert done.returncode == 2
    assert done.stdout == ""
    assert [line.split(": ")[1:3] for line in done.stderr.splitlines()] == [
        [f"{path}:2:3", "listen.port"],
        [f"{path}:4:3", "gate.actons"],
        [f"{path}:6:3", "upstream.uri"],
        [f"{path}:8:3", "tools.get_weather"],
        [f"{path}:11:3", "audit.paht"],
    ]
    assert all(line.startswith("replay-proxy: ") for line in done.stderr.splitlines())


def test_a_url_ending_in_v1_is_warned_about_naming_the_doubled_path(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text("upstream: {url: 'http://127.0.0.1:8000/v1/'}\n")
    done = config_check(str(path))
    assert (done.returncode, done.stdout) == (0, f"{path}: ok\n")
    assert done.stderr == (
        f"replay-proxy: {path}: warning: upstream.url: http://127.0.0.1:8000/v1/ ends in /v1, "
        "which every client path carries already: a request to /v1/responses goes to "
        "/v1/v1/responses; give the URL without /v1 (http://127.0.0.1:8000)\n"
    )


def test_connect_names_each_thing_it_cannot_reach(tmp_path: Path) -> None:
    closed = free_port("127.0.0.1")  # nothing listens on it
    path = tmp_path / "proxy.yaml"
    path.write_text(
        f"upstreams: {{a: {{url: 'http://127.0.0.1:{closed}'}}}}\n"
        "routes: [{upstream: a}]\n"
        f"mcp: {{servers: {{tools: {{url: 'http://127.0.0.1:{closed}/mcp'}}}}}}\n"
        f"ledger: {{backend: redis, url: 'redis://127.0.0.1:{closed}/0'}}\n"
        f"audit: {{path: '{tmp_path}/missing/audit.jsonl'}}\n"
    )
    assert config_check(str(path)).returncode == 0  # without --connect nothing is reached
    done = config_check("--connect", str(path))
    assert (done.returncode, done.stdout) == (1, "")
    lines = done.stderr.splitlines()
    assert [line.split(": ")[2] for line in lines] == [
        "upstreams.a.url",
        "mcp.servers.tools.url",
        "ledger.url",
        "audit.path",
    ]
    assert f"cannot connect to 127.0.0.1:{closed}: Connection refused" in lines[0]
    assert f"cannot connect to 127.0.0.1:{closed}: Connection refused" in lines[1]
    assert "Redis does not answer PING" in lines[2]
    assert lines[3].endswith(
        f"cannot append to '{tmp_path}/missing/audit.jsonl': No such file or directory"
    )
    assert not (tmp_path / "missing").exists()


def test_connect_passes_when_everything_answers(tmp_path: Path, redis_server: RedisServer) -> None:
    with socket.socket() as upstream:
        upstream.bind(("127.0.0.1", 0))
        upstream.listen()
        path = tmp_path / "proxy.yaml"
        path.write_text(
            f"upstream: {{url: 'http://127.0.0.1:{upstream.getsockname()[1]}'}}\n"
            f"ledger: {{backend: redis, url: '{redis_server.url}'}}\n"
            f"audit: {{path: '{tmp_path}/audit.jsonl'}}\n"
        )
        done = config_check("--connect", str(path))
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{path}: ok\n", "")
    assert not (tmp_path / "audit.jsonl").exists()  # checked, not made


async def test_connect_checks_an_https_upstream_by_its_tls_handshake(tmp_path: Path) -> None:
    tls_files(tmp_path)
    server = await start("--config", write_config(tmp_path, mutual=False))  # speaks TLS
    try:
        path = tmp_path / "check.yaml"
        url = server.url.replace("http://", "https://")
        path.write_text(f"upstream: {{url: '{url}', ca_file: '{tmp_path / 'ca.pem'}'}}\n")
        trusted = config_check("--connect", str(path))
        path.write_text(f"upstream: {{url: '{url}'}}\n")  # the system's CAs do not know it
        untrusted = config_check("--connect", str(path))
    finally:
        assert await server.stop() == 0
    assert (trusted.returncode, trusted.stderr) == (0, "")
    assert untrusted.returncode == 1
    host_port = url.removeprefix("https://")
    assert untrusted.stderr == (
        f"replay-proxy: {path}: upstream.url: no TLS with {host_port}: CERTIFICATE_VERIFY_FAILED\n"
    )


def test_the_start_line_names_the_mcp_servers() -> None:
    config = parse_config(
        {
            "upstream": {"url": "http://127.0.0.1:8000"},
            "mcp": {"servers": {"tools": {"url": "http://127.0.0.1:9000/mcp"}}},
        }
    )
    said = describe(config, 1).split("; ")
    assert said[:2] == [
        "upstreams default=http://127.0.0.1:8000",
        "MCP servers tools=http://127.0.0.1:9000/mcp",
    ]
    assert not any(p.startswith("MCP") for p in describe(parse_config({}), 1).split("; "))
