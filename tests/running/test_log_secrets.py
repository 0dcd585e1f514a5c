"""No key and no argument value reaches the log: a real `replay-proxy serve` at DEBUG, in JSON,
sent secrets every way a request can carry them; every line it wrote is searched for them."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from tests.builders import HANG_GUARD_S, JSON_HEADERS, USER
from tests.servers.recording import Received, RecordingUpstream

REPO = Path(__file__).resolve().parents[2]
CLIENT_KEY = "sk-client-SECRET-7f3a"
WRONG_KEY = "sk-wrong-SECRET-91c2"
UPSTREAM_KEY = "sk-upstream-SECRET-44d0"
NOTE_TOOL = {
    "type": "function",
    "name": "take_note",
    "parameters": {
        "type": "object",
        "properties": {"note": {"type": "string", "maxLength": 40}},
        "required": ["note"],
        "additionalProperties": False,
    },
}


def note_body(call_id: str, note: str) -> dict[str, Any]:
    call = {
        "type": "function_call",
        "call_id": call_id,
        "name": "take_note",
        "status": "completed",
        "arguments": json.dumps({"note": note}),
    }
    output = {"type": "function_call_output", "call_id": call_id, "output": f"noted {note}"}
    return {"model": "m", "tools": [NOTE_TOOL], "input": [USER, call, output]}


# Each secret, and how the request carried it.
ARGUMENT_CLEAN = "arg-clean-SECRET-01"
ARGUMENT_FAILING = "arg-failing-SECRET-02" + "x" * 40  # over maxLength: blocked
QUERY = "query-SECRET-03"
BODY = "body-SECRET-04"
FRAME = "frame-SECRET-05"
HEADER = "header-SECRET-06"
DROPPED = "dropped-SECRET-07"  # in the query of a request whose upstream connection drops
GARBAGE = "garbage-SECRET-08"  # in the query of a request the upstream answers with garbage
SECRETS = [
    CLIENT_KEY,
    WRONG_KEY,
    UPSTREAM_KEY,
    ARGUMENT_CLEAN,
    ARGUMENT_FAILING[:21],
    QUERY,
    BODY,
    FRAME,
    HEADER,
    DROPPED,
    GARBAGE,
]


async def failing_upstream(request: web.Request, received: Received) -> web.StreamResponse:
    """Answers as the recording upstream does, except on the paths that fail the hop."""
    assert request.transport is not None
    if request.path == "/v1/dropped":
        request.transport.close()  # no answer at all
    elif request.path == "/v1/garbage":
        request.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n")
        request.transport.close()
    return web.json_response({"object": "response", "id": "resp_1", "output": []})


async def test_no_secret_in_any_log_line(
    tmp_path: Path, recording_upstream: RecordingUpstream
) -> None:
    recording_upstream.handler = failing_upstream
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "upstream": {"url": recording_upstream.url, "api_key_env": "UPSTREAM_KEY"},
                "clients": [
                    {"name": "alice", "key_sha256": hashlib.sha256(CLIENT_KEY.encode()).hexdigest()}
                ],
                "audit": {"path": str(tmp_path / "audit.jsonl")},
                "log": {"format": "json"},
            }
        )
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "serve",
        "--config",
        str(config),
        "--port",
        "0",
        "--log-level",
        "debug",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
        env=os.environ | {"UPSTREAM_KEY": UPSTREAM_KEY},
    )
    assert process.stderr is not None
    try:
        head = b""
        while not (found := re.search(r"listening on (http://\S+),", head.decode())):
            line = await asyncio.wait_for(process.stderr.readline(), HANG_GUARD_S)
            assert line, head
            head += line
        base = found.group(1)
        ids = await send_secrets(base)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        rest = await asyncio.wait_for(process.stderr.read(), HANG_GUARD_S * 3)
        await asyncio.wait_for(process.wait(), HANG_GUARD_S)
    written = (head + rest).decode()

    # The upstream did get the secrets it was meant to: they are not lost, only kept out.
    sent = [r.headers.get("Authorization") for r in recording_upstream.received]
    assert f"Bearer {UPSTREAM_KEY}" in sent
    assert any(ARGUMENT_CLEAN.encode() in r.body for r in recording_upstream.received)
    assert recording_upstream.frames
    assert FRAME in recording_upstream.frames[0]

    lines = [json.loads(line) for line in written.splitlines()]  # every line is JSON
    for secret in SECRETS:
        assert secret not in written, (secret, [line for line in lines if secret in str(line)])
    access = {line["request_id"]: line for line in lines if line["logger"] == "replay_proxy.access"}
    assert set(ids) <= set(access), (ids, access)
    assert [access[i]["status"] for i in ids] == [200, 400, 200, 400, 401, 502, 502, 101]
    failed = [line for line in lines if line["level"] == "WARNING"]
    assert {line["request_id"] for line in failed} == set(ids[5:7])  # the hop's failures
    assert lines[-1]["message"] == "stopped"


async def send_secrets(base: str) -> list[str]:
    """Requests carrying each secret; the `x-request-id` of each, in order."""
    client_key = {"Authorization": f"Bearer {CLIENT_KEY}", "x-custom-token": HEADER}
    ids = []
    async with aiohttp.ClientSession() as session:
        for target, data, headers in [
            ("/v1/responses", json.dumps(note_body("c1", ARGUMENT_CLEAN)), client_key),
            ("/v1/responses", json.dumps(note_body("c2", ARGUMENT_FAILING)), client_key),
            (f"/v1/models?api_key={QUERY}", None, client_key),
            ("/v1/responses", '{"input": "' + BODY + '", "input": 1}', client_key),
            ("/v1/responses", json.dumps(note_body("c3", ARGUMENT_CLEAN)), {"api-key": WRONG_KEY}),
            (f"/v1/dropped?key={DROPPED}", None, client_key),
            (f"/v1/garbage?key={GARBAGE}", None, client_key),
        ]:
            method = "GET" if data is None else "POST"
            async with session.request(
                method, base + target, data=data, headers=JSON_HEADERS | headers
            ) as response:
                await response.read()
                ids.append(response.headers["x-request-id"])
        async with session.ws_connect(f"{base}/v1/responses", headers=client_key) as ws:
            ids.append(ws._response.headers["x-request-id"])
            await ws.send_json({"type": "response.create", **note_body("c4", FRAME)})
            assert (await ws.receive_json())["type"] == "response.completed"
    return ids
