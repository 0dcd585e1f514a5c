"""`replay-proxy check --ledger`: a follow-up's outputs pair with the calls a real Redis ledger
recorded, as in the proxy; without the ledger, the finding says what check could not see."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from proxy.state.ledger import Ledger
from proxy.state.recording import Context
from proxy.state.stores import RedisStore
from tests.builders import SALES_SCHEMA, SALES_TOOL, article_output, sales_call
from tests.running.test_check import check
from tests.servers.redis_server import RedisServer

TENANT = "t_0123456789abcdef"


def record(url: str, tenant: str, *output: dict[str, Any]) -> None:
    """What the proxy records when it relays `resp_1` (with `output`) to `tenant`."""

    async def put() -> None:
        store = RedisStore(url, ttl_s=60, timeout_s=5)
        try:
            ledger = Ledger(store, max_chain=8, fail_open=False)
            context = Context.of([], ((SALES_TOOL["name"], SALES_SCHEMA),), False)
            answer = {"id": "resp_1", "object": "response", "output": list(output)}
            await ledger.record(tenant, answer | {"previous_response_id": None}, context)
        finally:
            await store.close()

    asyncio.run(put())


def follow_up(call_id: str) -> dict[str, Any]:
    return {
        "model": "m",
        "previous_response_id": "resp_1",
        "input": [article_output(call_id)],
        "tools": [SALES_TOOL],
    }


# (what resp_1 emitted, --tenant, the finding of the follow-up's output or None)
CASES = [
    pytest.param(sales_call("call_1", "apac"), TENANT, None, id="paired-and-clean"),
    pytest.param(
        sales_call("call_1", "global"),
        TENANT,
        "arguments_schema [block]: region failed schema: expected one of apac, emea, amer",
        id="paired-and-failing",
    ),
    pytest.param(
        sales_call("call_1", "apac"),
        "-",
        "orphan [block]: no function_call with call_id call_1 precedes this output",
        id="another-tenant-sees-nothing",
    ),
]


@pytest.mark.parametrize(("emitted", "tenant", "finding"), CASES)
def test_a_follow_up_pairs_through_the_ledger(
    tmp_path: Path, redis_server: RedisServer, emitted: Any, tenant: str, finding: str | None
) -> None:
    record(redis_server.url, TENANT, emitted)
    (tmp_path / "f.json").write_text(json.dumps(follow_up("call_1")), encoding="utf-8")
    run = check(tmp_path, "--ledger", redis_server.url, "--tenant", tenant, "f.json")
    if finding is None:
        assert (run.code, run.lines[:-1]) == (0, [])
        return
    [line] = [line for line in run.lines if line.startswith("f.json: ")]
    assert line.startswith("f.json: input[0] call_1 ")
    assert finding in line
    # With the ledger read, the finding does not send the reader to the ledger.
    assert "--ledger" not in line
    assert run.code == 1


def test_without_the_ledger_the_orphan_says_what_check_cannot_see(tmp_path: Path) -> None:
    (tmp_path / "f.json").write_text(json.dumps(follow_up("call_1")), encoding="utf-8")
    run = check(tmp_path, "f.json")
    assert run.lines[0] == (
        "f.json: input[0] call_1 -: orphan [block]: no function_call with call_id call_1 "
        "precedes this output: not inline, not behind an item_reference, not in the "
        "previous_response_id chain the proxy recorded; the paired item may be only in the "
        "ledger (previous_response_id resp_1), which check cannot see: pass --ledger "
        "redis://... (and --tenant)"
    )
    assert run.code == 1


def test_an_unreachable_ledger_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "f.json").write_text(json.dumps(follow_up("call_1")), encoding="utf-8")
    # Port 1 on loopback: nothing listens there, the connection is refused at once.
    run = check(tmp_path, "--ledger", "redis://127.0.0.1:1/0", "f.json")
    assert run.code == 2
    assert run.err.startswith("replay-proxy: --ledger: cannot read redis://127.0.0.1:1/0: redis:")
    assert run.out == ""


def test_a_ledger_that_is_not_a_redis_url_is_refused(tmp_path: Path) -> None:
    run = check(tmp_path, "--ledger", "http://127.0.0.1:6379", "f.json")
    assert run.code == 2
    assert run.err == (
        "replay-proxy: --ledger: 'http://127.0.0.1:6379' is not a Redis URL "
        "(redis://host:port/db, rediss:// or unix://)\n"
    )
