"""`admin.listen` as `serve` runs it: the admin endpoints on their own port, without a key, and
readiness saying so while a SIGTERM drains the requests in flight."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp

from proxy.running.workers import free_port
from tests.running.test_serve import REPO, Proxy, start
from tests.servers.recording import RecordingUpstream, held_stream

KEY = "rp-ops-0123456789"


async def stderr_until(proxy: Proxy, text: str) -> str:
    assert proxy.process.stderr is not None
    while True:
        line = (await asyncio.wait_for(proxy.process.stderr.readline(), timeout=30)).decode()
        if not line:
            raise AssertionError(f"the proxy exited before saying {text!r}")
        if text in line:
            return line


async def test_admin_endpoints_move_to_their_own_listener_which_drains_last(
    recording_upstream: RecordingUpstream, tmp_path: Path
) -> None:
    admin_port = free_port("127.0.0.1")
    path = tmp_path / "proxy.yaml"
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    path.write_text(
        f"upstream: {{url: '{recording_upstream.url}'}}\n"
        f"audit: {{path: '{tmp_path / 'audit.jsonl'}'}}\n"
        f"admin: {{listen: {{port: {admin_port}}}}}\n"
        f"clients: [{{name: ops, key_sha256: '{digest}'}}]\n"
    )
    release = asyncio.Event()

    recording_upstream.handler = held_stream(release, b"data: [DONE]\n\n")
    proxy = await start("--config", str(path))
    admin = f"http://127.0.0.1:{admin_port}"
    key = {"Authorization": f"Bearer {KEY}"}
    try:  # from here on, a failure still stops the proxy
        said = await stderr_until(proxy, "admin endpoints on ")
        assert said.rstrip().endswith(f"admin endpoints on {admin}/-/")
        async with aiohttp.ClientSession() as session:
            # The data listener serves no admin endpoint, with a key or without.
            async with session.get(proxy.url + "/-/healthy", headers=key) as response:
                assert response.status == 404
                error = (await response.json())["error"]
                assert error["code"] == "not_found"
                assert "admin.listen" in error["message"]
            # The admin listener asks no key, and serves nothing else.
            for endpoint in ("/-/healthy", "/-/ready", "/-/metrics"):
                async with session.get(admin + endpoint) as response:
                    assert response.status == 200, endpoint
            async with session.post(admin + "/v1/responses", json={"input": "hi"}) as response:
                assert response.status == 404
                assert "serves only /-/" in (await response.json())["error"]["message"]
            assert recording_upstream.received == []

            async with session.post(
                proxy.url + "/v1/responses", json={"input": "hi", "stream": True}, headers=key
            ) as streaming:
                assert await streaming.content.readline() == b"data: one\n"
                proxy.terminate()
                await stderr_until(proxy, "stopping: no new connections")

                async with session.get(admin + "/-/ready") as response:
                    assert response.status == 503
                    body = await response.json()
                assert body["status"] == "not_ready"
                [draining] = [c for c in body["checks"] if c["name"] == "draining"]
                assert draining == {
                    "name": "draining",
                    "ok": False,
                    "detail": "stopping: requests in flight are finishing",
                    "required": True,
                }
                async with session.get(admin + "/-/healthy") as response:
                    assert response.status == 200  # live: it still serves what is in flight

                release.set()
                rest = await asyncio.wait_for(streaming.content.read(), timeout=30)
            assert rest == b"\ndata: [DONE]\n\n"
    finally:
        release.set()
        code = await proxy.stop()
    assert code == 0
    assert [r.target for r in recording_upstream.received] == ["/v1/responses"]


def test_an_admin_port_in_use_stops_the_start_naming_the_key(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = tmp_path / "proxy.yaml"
        path.write_text(
            f"audit: {{path: '{tmp_path / 'audit.jsonl'}'}}\nadmin: {{listen: {{port: {port}}}}}\n"
        )
        done = subprocess.run(
            [sys.executable, "-m", "proxy", "serve", "--port", "0", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
    assert done.returncode == 2
    said = f"admin.listen.port: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert f"replay-proxy: {said}\n" in done.stderr
    assert "Traceback" not in done.stderr


async def test_without_an_admin_listener_an_open_connection_sees_the_drain(
    recording_upstream: RecordingUpstream,
) -> None:
    release = asyncio.Event()

    recording_upstream.handler = held_stream(release)
    proxy = await start("--upstream", recording_upstream.url)
    try:
        async with (
            aiohttp.ClientSession() as probes,
            aiohttp.ClientSession() as session,
        ):
            async with probes.get(proxy.url + "/-/ready") as response:
                assert response.status == 200  # its connection stays open, kept alive
            async with session.post(
                proxy.url + "/v1/responses", json={"input": "hi", "stream": True}
            ) as streaming:
                assert await streaming.content.readline() == b"data: one\n"
                proxy.terminate()
                await stderr_until(proxy, "stopping: no new connections")
                async with probes.get(proxy.url + "/-/ready") as response:
                    assert response.status == 503
                    assert (await response.json())["status"] == "not_ready"
                release.set()
                await asyncio.wait_for(streaming.content.read(), timeout=30)
    finally:
        release.set()
        code = await proxy.stop()
    assert code == 0
