"""`replay-proxy extproc`: where it listens, as a flag or `extproc.listen`, and what of the
config it does not use."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.running.cli import main
from proxy.running.config_file import parse_config
from proxy.running.extproc import ignored_sections
from proxy.settings import ConfigError, listen_problem


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        pytest.param("127.0.0.1:9002", None, id="host-port"),
        pytest.param("0.0.0.0:0", None, id="any-free-port"),
        pytest.param("[::1]:9002", None, id="ipv6"),
        pytest.param("localhost:9002", None, id="name"),
        pytest.param("unix:/run/replay-proxy.sock", None, id="unix"),
        pytest.param("unix:", "'unix:' names no socket path after unix:", id="unix-no-path"),
        pytest.param("9002", "'9002' is not HOST:PORT or unix:PATH", id="port-only"),
        pytest.param(":9002", "':9002' is not HOST:PORT or unix:PATH", id="no-host"),
        pytest.param(
            "127.0.0.1:65536",
            "'127.0.0.1:65536': the port must be 0 to 65535 (0 = any free one)",
            id="port-too-high",
        ),
        pytest.param(
            "::1:9002",
            "'::1:9002': an IPv6 address goes in brackets ([::1]:PORT)",
            id="ipv6-without-brackets",
        ),
    ],
)
def test_listen_problem(address: str, problem: str | None) -> None:
    assert listen_problem(address) == problem


def test_extproc_listen_in_the_config() -> None:
    assert parse_config({}).extproc.listen == "127.0.0.1:9002"
    assert parse_config({"extproc": {"listen": "unix:/tmp/x"}}).extproc.listen == "unix:/tmp/x"
    with pytest.raises(ConfigError, match=r"^extproc\.listen: '9002' is not HOST:PORT"):
        parse_config({"extproc": {"listen": "9002"}})
    with pytest.raises(ConfigError, match=r"^extproc\.lisen: unknown key; did you mean listen\?"):
        parse_config({"extproc": {"lisen": "127.0.0.1:1"}})


def test_a_bad_listen_flag_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["extproc", "--listen", "9002"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "replay-proxy: --listen: '9002' is not HOST:PORT or unix:PATH\n"
    )


def test_config_defaults_show_extproc_listen(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "defaults"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "extproc:" in lines
    assert any(line.startswith('  listen: "127.0.0.1:9002"') for line in lines)


@pytest.mark.parametrize(
    ("sections", "ignored"),
    [
        pytest.param({}, 0, id="nothing"),
        pytest.param({"ledger": {"backend": "memory"}, "limits": {}}, 0, id="what-applies"),
        pytest.param({"upstream": {"url": "http://127.0.0.1:8000/v1"}}, 1, id="upstream"),
    ],
)
def test_upstream_is_envoys_business(sections: dict[str, object], ignored: int) -> None:
    said = ignored_sections(parse_config(sections))
    assert len(said) == ignored
    assert all(line.startswith("upstream: is set, but behind Envoy") for line in said)


@pytest.mark.parametrize("missing", ["grpc", "envoy"])
def test_without_the_envoy_extra_extproc_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], missing: str
) -> None:
    loaded = ("proxy.extproc", "proxy.running.extproc", f"{missing}.")
    for name in [n for n in sys.modules if n.startswith(loaded)]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, missing, None)  # as if it were not installed
    assert main(["extproc", "--listen", "127.0.0.1:0"]) == 2
    assert capsys.readouterr().err == (
        f"replay-proxy: extproc needs grpcio and xds-protos (no module {missing}): "
        "pip install 'replay-proxy[envoy]'\n"
    )


def test_a_port_in_use_is_one_line_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"audit: {{path: {tmp_path / 'audit.jsonl'}}}\n", encoding="utf-8")
    with socket.socket() as taken:
        # Held as another processor holds it: with SO_REUSEPORT, which gRPC sets by default
        # and would then share the port silently.
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        listen = f"127.0.0.1:{port}"
        assert main(["extproc", "--config", str(config), "--listen", listen]) == 2
    assert capsys.readouterr().err == (
        f"replay-proxy: --listen: cannot listen on {listen}: Failed to bind to address {listen}\n"
    )


@pytest.mark.parametrize(
    ("flag", "section"),
    [
        pytest.param([], "log: {format: json}\n", id="config"),
        pytest.param(["--log-format", "json"], "", id="flag"),
    ],
)
def test_the_processor_logs_in_log_format(tmp_path: Path, flag: list[str], section: str) -> None:
    """The processor's log is `serve`'s: `log.format` (or `--log-format`) applies, every line
    one JSON object, up to its final `stopped`."""
    config = tmp_path / "config.yaml"
    config.write_text(f"audit: {{path: {tmp_path / 'audit.jsonl'}}}\n{section}", encoding="utf-8")
    command = [sys.executable, "-m", "proxy", "extproc", "--config", str(config)]
    command += ["--listen", "127.0.0.1:0", *flag]
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True) as process:
        assert process.stderr is not None
        first = process.stderr.readline()  # blocks until the processor listens (or exits)
        process.send_signal(signal.SIGTERM)
        rest = process.stderr.read()
        assert process.wait(timeout=30) == 0
    lines = [json.loads(line) for line in [first, *rest.splitlines()] if line.strip()]
    assert lines[0]["message"].startswith("ext_proc listening on 127.0.0.1:")
    assert lines[-1]["message"] == "stopped"
    assert {line["logger"] for line in lines} <= {"replay_proxy"}
