"""The MCP door's records and bodies offline: `audit report` sums up the records of MCP
requests, and `check` reads them back and judges a logged JSON-RPC body itself."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

from tests.fixture_types import ProxyFactory
from tests.mcp.test_mcp_door import proxied, session_at
from tests.running.test_check import check, script, write
from tests.servers.mcp_tools import Ran

LISTED = {
    "name": "get_report",
    "inputSchema": {
        "type": "object",
        "properties": {"region": {"enum": ["us", "eu"]}},
        "required": ["region"],
        "additionalProperties": False,
    },
}


def tools_call(ident: int, name: str, arguments: object) -> dict[str, object]:
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": params}


def test_check_judges_a_logged_tools_call_by_the_tools_list_before_it(tmp_path: Path) -> None:
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 1, "result": {"tools": [LISTED]}},
        tools_call(2, "get_report", {"region": "eu"}),
        tools_call(3, "get_report", {"region": "mars"}),
        tools_call(4, "get_report", "eu"),
        tools_call(5, "unlisted", {}),
        {"jsonrpc": "2.0", "id": 6, "method": "ping"},
    ]
    name = write(tmp_path / "mcp.jsonl", "".join(json.dumps(v) + "\n" for v in lines))
    run = check(tmp_path, "--json", name)
    assert run.code == 1, run.err
    found = [(v["line"], v["kind"], v["where"], v["finding"]["reason"]) for v in run.verdicts]
    assert found == [
        (4, "mcp_message", "params", "arguments_schema"),
        (5, "mcp_message", "params", "arguments_type"),
        (6, "mcp_message", "params", "unknown_tool"),
    ]
    assert run.verdicts[0]["finding"]["fail"] == [
        {"path": "/region", "reason": "enum", "expected": ["us", "eu"]}
    ]


def test_check_reads_a_logged_batch_with_an_error_as_mcp_messages(tmp_path: Path) -> None:
    # A JSON-RPC error is a message too: a batch that holds one (as a server's answers do) is
    # read message by message, never as Responses items (each an `item_reference` by its id).
    error = {"jsonrpc": "2.0", "id": 9, "error": {"code": -32601, "message": "no such method"}}
    batch = [
        {"jsonrpc": "2.0", "id": 1, "result": {"tools": [LISTED]}},
        tools_call(2, "get_report", {"region": "mars"}),
        error,
    ]
    name = write(tmp_path / "batch.json", json.dumps(batch))
    run = check(tmp_path, "--json", name)
    assert run.code == 1, run.err
    found = [(v["element"], v["kind"], v["finding"]["reason"]) for v in run.verdicts]
    assert found == [(1, "mcp_message", "arguments_schema")]
    alone = write(tmp_path / "error.json", json.dumps(error))
    run = check(tmp_path, "--json", alone)
    assert (run.code, run.verdicts) == (0, []), run.err


def test_check_judges_a_tools_call_by_a_pinned_schema(tmp_path: Path) -> None:
    config = tmp_path / "proxy.yaml"
    pinned = {"type": "object", "properties": {"region": {"type": "string"}}}
    config.write_text(
        json.dumps(
            {
                "upstream": {"url": "http://127.0.0.1:9"},
                "tools": {"get_report": pinned},
            }
        )
    )
    name = write(tmp_path / "call.json", tools_call(1, "get_report", {"region": 7}))
    run = check(tmp_path, "--json", "--config", str(config), name)
    assert run.code == 1, run.err
    [verdict] = run.verdicts
    assert verdict["finding"]["reason"] == "arguments_schema"


async def test_audit_report_and_check_read_the_records_of_mcp_requests(
    reports: tuple[str, Ran], start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    url, ran = reports
    async with session_at(await proxied(start_proxy, url)) as session:
        await session.list_tools()
        await session.call_tool("get_report", {"region": "mars"})
        await session.call_tool("get_report", {"region": "eu"})
    assert len(ran.calls) == 1
    audit = tmp_path / "audit.jsonl"
    [record] = [json.loads(line) for line in audit.read_text().splitlines()]
    assert (record["transport"], record["server"]) == ("mcp", "reports")
    done = await asyncio.to_thread(
        subprocess.run,
        [script(), "audit", "report", str(audit)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "arguments_schema" in out
    assert "get_report" in out
    run = check(tmp_path, "--json", audit.name)
    assert run.code == 1, run.err
    [verdict] = run.verdicts
    assert verdict["kind"] == "audit_record"
    assert verdict["finding"]["reason"] == "arguments_schema"
    assert verdict["finding"]["name"] == "get_report"
