"""The AI SDK's Open Responses provider (Node), unchanged, through the proxy to a real upstream."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.builders import audit_records
from tests.fixture_types import ProxyFactory
from tests.server.aisdk import run_script


async def tool_run(base: str, prompt: str) -> str:
    """`generateText` with one tool and two steps against `base`; the final text it prints."""
    status, out, err = await run_script("tool_run.mjs", "open-responses", base, prompt)
    assert status == 0, err
    return out


@pytest.mark.parametrize(
    "prompt",
    [
        pytest.param("what are the latest sales?", id="compact-arguments"),
        # The scripted model emits these arguments as written; the SDK parses them and replays
        # JSON.stringify of the value, so the replayed string is not the emitted one.
        pytest.param(
            'call get_latest_sales_report with { "region" : "apac" }', id="spaced-arguments"
        ),
    ],
)
async def test_a_two_step_tool_run_answers_the_same_through_the_proxy(
    scripted_upstream: str, start_proxy: ProxyFactory, tmp_path: Path, prompt: str
) -> None:
    """The provider replays its function_call without `status` (and without `id`): the proxy
    relayed that call as completed a moment before, so the default config lets it through."""
    direct = await tool_run(scripted_upstream + "/v1", prompt)
    proxied = await tool_run(await start_proxy(scripted_upstream) + "/v1", prompt)

    assert direct == "tool said: apac: 42 units\n"
    assert proxied == direct
    assert audit_records(tmp_path) == []
