"""The official Open Responses compliance suite (tests/clients/compliance/, run with Bun) passes
17/17 against the strict upstream directly and through the proxy with its default config."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixture_types import ProxyFactory
from tests.servers import strict_upstream
from tests.servers.strict_upstream import StrictUpstream

SUITE = Path(__file__).resolve().parent.parent / "clients" / "compliance"
BUN = SUITE / "node_modules" / ".bin" / "bun"
INSTALL = "npm ci --prefix tests/clients/compliance"
TESTS = 17
# The suite takes well under a second here; the bound is for a hung server, not a measure.
SUITE_TIMEOUT_S = 90


@pytest.fixture
async def strict() -> AsyncIterator[StrictUpstream]:
    async with strict_upstream.serve() as upstream:
        yield upstream


async def run_suite(base: str) -> dict[str, Any]:
    """The suite's JSON report for the Open Responses server at `base`."""
    if not BUN.exists():
        pytest.fail(f"the compliance suite is not installed: run `{INSTALL}`")
    command = [str(BUN), "run", "bin/compliance-test.ts", "--base-url", base + "/v1"]
    process = await asyncio.create_subprocess_exec(
        *command,
        "--api-key",
        "sk-compliance",
        "--model",
        "strict",
        "--json",
        cwd=SUITE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), SUITE_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        pytest.fail(f"the compliance suite did not end within {SUITE_TIMEOUT_S} s")
    try:
        report: dict[str, Any] = json.loads(stdout)
    except ValueError:
        pytest.fail(f"the suite wrote no JSON report (exit {process.returncode}): {stderr!r}")
    return report


def failures(report: dict[str, Any]) -> dict[str, list[str]]:
    """Each test that did not pass, by id, with its errors."""
    return {
        result["id"]: result.get("errors") or [result["status"]]
        for result in report["results"]
        if result["status"] != "passed"
    }


async def test_the_suite_passes_against_the_strict_upstream(strict: StrictUpstream) -> None:
    report = await run_suite(strict.url)

    failed = failures(report)
    assert not failed, f"failing: {', '.join(failed)}: {failed}"
    assert report["summary"] == {"passed": TESTS, "failed": 0, "skipped": 0, "total": TESTS}


async def test_the_suite_passes_through_the_proxy(
    strict: StrictUpstream, start_proxy: ProxyFactory
) -> None:
    base = await start_proxy(strict.url)

    report = await run_suite(base)

    failed = failures(report)
    assert not failed, f"failing: {', '.join(failed)}: {failed}"
    assert report["summary"] == {"passed": TESTS, "failed": 0, "skipped": 0, "total": TESTS}
    # Through the proxy, not around it: the upstream saw the suite's traffic.
    assert strict.requests
    assert strict.frames
