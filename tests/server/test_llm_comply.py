"""llm-comply: every check that passes against fastresponses directly passes through us."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from typing import Any

from tests.fixture_types import ProxyFactory


async def comply(base_url: str) -> dict[str, str]:
    """Run llm-comply against an Open Responses base URL; check id -> passed|failed|skipped."""
    exe = shutil.which("llm-comply")
    command = [exe] if exe else [sys.executable, "-m", "llm_comply.cli"]
    process = await asyncio.create_subprocess_exec(
        *command,
        "-u",
        base_url + "/v1",
        "-k",
        "test",
        "-m",
        "gpt-5-scripted",
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=90)
    assert stdout, stderr.decode()
    report: dict[str, Any] = json.loads(stdout)
    return {result["id"]: result["status"] for result in report["results"]}


async def test_every_check_that_passes_direct_passes_through_the_proxy(
    scripted_upstream: str, start_proxy: ProxyFactory
) -> None:
    direct = await comply(scripted_upstream)
    proxied = await comply(await start_proxy(scripted_upstream))

    passed_direct = {check for check, status in direct.items() if status == "passed"}
    assert passed_direct, direct
    assert {"basic-response", "tool-calling", "streaming-response"} <= passed_direct
    assert {check: proxied.get(check) for check in passed_direct} == dict.fromkeys(
        passed_direct, "passed"
    )
