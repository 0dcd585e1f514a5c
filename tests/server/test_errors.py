"""The error boundary: a failure nobody decided (a bug) is a logged 500 in the API's shape,
naming the request id, on HTTP and on a WebSocket frame, and the proxy carries on."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from proxy.admission.targets import TargetError
from proxy.state import audit
from proxy.state.audit import AuditLog
from proxy.state.stores import MemoryStore
from tests.builders import SALES_TOOL, USER, sales_call, sales_output
from tests.fixture_types import ProxyFactory
from tests.servers.recording import RecordingUpstream

CLEAN = {"model": "m", "tools": [SALES_TOOL], "input": [USER]}
FAILING = {
    "model": "m",
    "tools": [SALES_TOOL],
    "input": [USER, sales_call("call_1", "mars"), sales_output("call_1")],
}
FOLLOW_UP = {
    "model": "m",
    "tools": [SALES_TOOL],
    "previous_response_id": "resp_0",
    "input": [sales_output("call_1")],
}


class Bug(Exception):
    """What a bug of the proxy's raises: nothing any handler expects."""


def raise_bug(*args: Any, **kwargs: Any) -> Any:
    raise Bug("a bug")


def misread_target(*args: Any, **kwargs: Any) -> Any:
    # A bug that raises what a request target the proxy cannot read raises: still a bug (500),
    # not the client's target (400).
    raise TargetError("a bug")


def disk_full(*args: Any, **kwargs: Any) -> Any:
    raise OSError(28, "No space left on device")


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@dataclass(frozen=True)
class Fault:
    """A function of the proxy's own made to fail, and a request that reaches it."""

    owner: Any
    name: str
    replacement: Any
    method: str
    path: str
    body: Any
    exception: type[BaseException]
    gate: dict[str, Any]


FAULTS = [
    pytest.param(
        Fault(MemoryStore, "chain", raise_bug, "POST", "/v1/responses", FOLLOW_UP, Bug, {}),
        id="ledger-read",
    ),
    pytest.param(
        # Shadow mode: the body would be forwarded, but its record cannot be written.
        Fault(
            AuditLog,
            "write",
            disk_full,
            "POST",
            "/v1/responses",
            FAILING,
            OSError,
            {"action": "log"},
        ),
        id="audit-write",
    ),
    pytest.param(
        Fault(audit, "tenant_of", raise_bug, "GET", "/v1/models", None, Bug, {}),
        id="pass-through-tenant",
    ),
    pytest.param(
        Fault(
            MemoryStore,
            "chain",
            misread_target,
            "POST",
            "/v1/responses",
            FOLLOW_UP,
            TargetError,
            {},
        ),
        id="target-error-in-a-handler",
    ),
]


@pytest.mark.parametrize("fault", FAULTS)
async def test_an_unexpected_error_is_a_logged_500_in_the_apis_shape(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    session: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fault: Fault,
) -> None:
    base = await start_proxy(recording_upstream.url, gate=fault.gate)
    monkeypatch.setattr(fault.owner, fault.name, fault.replacement)
    with caplog.at_level(logging.WARNING):
        async with session.request(fault.method, base + fault.path, json=fault.body) as resp:
            status, content_type = resp.status, resp.content_type
            request_id = resp.headers["x-request-id"]
            error = json.loads(await resp.read())["error"]
    monkeypatch.undo()

    assert (status, content_type) == (500, "application/json")
    assert (error["type"], error["code"], error["param"]) == (
        "server_error",
        "internal_error",
        None,
    )
    assert request_id in error["message"]
    assert recording_upstream.received == []
    [logged] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert logged.name == "replay_proxy"
    assert logged.getMessage().startswith(request_id + " ")
    assert logged.exc_info is not None
    assert logged.exc_info[0] is fault.exception
    assert fault.replacement.__name__ in (logged.exc_text or "")
    # The proxy carries on: the same request, the bug gone, goes through.
    async with session.request(fault.method, base + fault.path, json=fault.body) as resp:
        assert resp.status in (200, 400)
    assert len(recording_upstream.received) == (0 if fault.body is FOLLOW_UP else 1)


async def test_an_unexpected_error_mid_answer_cuts_the_connection(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    session: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The answer had begun (the upstream's response was being relayed and recorded): no 500
    can follow it, and the client must not take what it got for the whole answer."""
    base = await start_proxy(recording_upstream.url)
    monkeypatch.setattr(MemoryStore, "put", raise_bug)
    with caplog.at_level(logging.WARNING), pytest.raises(aiohttp.ClientError):
        async with session.post(base + "/v1/responses", json=CLEAN) as resp:
            await resp.read()
    monkeypatch.undo()

    assert len(recording_upstream.received) == 1
    [logged] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert (logged.name, logged.exc_info and logged.exc_info[0]) == ("replay_proxy", Bug)
    request_id = logged.getMessage().split()[0]
    [cut] = [r for r in caplog.records if "connection cut" in r.getMessage()]
    assert cut.getMessage().startswith(request_id + " ")
    async with session.post(base + "/v1/responses", json=CLEAN) as resp:
        assert resp.status == 200


async def test_a_frame_hitting_an_unexpected_error_is_answered_and_the_connection_carries_on(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    session: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    base = await start_proxy(recording_upstream.url)
    monkeypatch.setattr(MemoryStore, "chain", raise_bug)
    async with session.ws_connect(base + "/v1/responses") as ws:
        with caplog.at_level(logging.WARNING):
            await ws.send_str(json.dumps({"type": "response.create", **FOLLOW_UP}))
            event = json.loads(await ws.receive_str(timeout=30))
        monkeypatch.undo()
        await ws.send_str(json.dumps({"type": "response.create", **CLEAN}))
        completed = json.loads(await ws.receive_str(timeout=30))

    assert (event["type"], event["status"]) == ("error", 500)
    error = event["error"]
    assert (error["type"], error["code"]) == ("server_error", "internal_error")
    [logged] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    request_id = logged.getMessage().split()[0]
    assert request_id in error["message"]
    assert logged.exc_info is not None
    assert logged.exc_info[0] is Bug
    assert completed["type"] == "response.completed"
    assert [json.loads(frame)["input"] for frame in recording_upstream.frames] == [CLEAN["input"]]
