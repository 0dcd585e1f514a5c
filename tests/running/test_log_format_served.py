"""`serve --log-format json` as a real process: every line JSON, the supervisor's and each
worker's, and the config's `log.format` when no flag is given."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.builders import HANG_GUARD_S
from tests.running.test_serve import redis_config
from tests.servers.recording import RecordingUpstream
from tests.servers.redis_server import RedisServer

REPO = Path(__file__).resolve().parents[2]


async def serve_and_stop(*args: str, listeners: int) -> tuple[list[str], list[str]]:
    """Start `serve` with `args`, send one request once `listeners` processes listen, stop it:
    (every stderr line, the request ids of the answers)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "serve",
        "--port",
        "0",
        *args,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    assert process.stderr is not None
    lines: list[str] = []
    urls: list[str] = []
    try:
        while len(urls) < listeners:
            raw = await asyncio.wait_for(process.stderr.readline(), HANG_GUARD_S)
            assert raw, lines
            lines.append(raw.decode())
            found = re.search(r"listening on (http://[^\s,\"]+)", lines[-1])
            if found:
                urls.append(found.group(1))
        async with aiohttp.ClientSession() as session, session.get(urls[0] + "/v1/models") as r:
            assert r.status == 200
            request_id = r.headers["x-request-id"]
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        rest = await asyncio.wait_for(process.stderr.read(), HANG_GUARD_S * 3)
        await asyncio.wait_for(process.wait(), HANG_GUARD_S)
    return lines + rest.decode().splitlines(keepends=True), [request_id]


async def test_workers_and_their_supervisor_all_log_json(
    recording_upstream: RecordingUpstream, tmp_path: Path, redis_server: RedisServer
) -> None:
    lines, [request_id] = await serve_and_stop(
        *["--config", redis_config(tmp_path, redis_server), "--upstream", recording_upstream.url],
        *["--workers", "2", "--log-format", "json"],
        listeners=2,
    )
    parsed: list[dict[str, Any]] = [json.loads(line) for line in lines]  # every line
    supervisor = {line["pid"] for line in parsed if line["message"].startswith("supervising")}
    workers = {line["pid"] for line in parsed if line["message"].startswith("listening on")}
    assert len(supervisor) == 1
    assert len(workers) == 2
    assert supervisor.isdisjoint(workers)
    [access] = [line for line in parsed if line.get("request_id") == request_id]
    assert access["logger"] == "replay_proxy.access"
    assert access["pid"] in workers


@pytest.mark.parametrize(
    ("config", "flag", "json_lines"),
    [
        pytest.param("log:\n  format: json\n", [], True, id="config-json"),
        pytest.param("log:\n  format: json\n", ["--log-format", "text"], False, id="flag-wins"),
        pytest.param("", [], False, id="default-text"),
    ],
)
async def test_log_format_from_the_config_or_the_flag(
    tmp_path: Path,
    recording_upstream: RecordingUpstream,
    config: str,
    flag: list[str],
    json_lines: bool,
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config + f"audit:\n  path: {tmp_path / 'audit.jsonl'}\n")
    lines, [request_id] = await serve_and_stop(
        "--config", str(path), "--upstream", recording_upstream.url, *flag, listeners=1
    )
    assert lines
    if json_lines:
        assert [json.loads(line)["message"] for line in lines][-1] == "stopped"
    else:
        assert all(not line.startswith("{") for line in lines)
        assert lines[-1].endswith(": stopped\n")
        [access] = [line for line in lines if request_id in line]
        assert " INFO replay_proxy.access[" in access
