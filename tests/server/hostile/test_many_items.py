"""Ten thousand items: gated, forwarded whole, each reference resolved once."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence

import aiohttp
import pytest

from proxy.gate.items import Item
from proxy.gate.policy import Policy
from proxy.gate.reasons import Outcome
from proxy.gate.verdict import Verdict, inspect
from tests.builders import JSON_HEADERS, SALES_TOOL, USER, MiB, sales_call, sales_output
from tests.fixture_types import ProxyFactory
from tests.servers.recording import RecordingUpstream

NOTE = {"type": "function", "name": "note", "parameters": {"type": "object"}}


def many_items(pairs: int, *, last_arguments: str = "{}") -> list[Item]:
    """A user message, `pairs` calls of `note` each with its output, and a user message.

    Items kept short: the body stays under a MiB (see the test after next).
    """
    found: list[Item] = [USER]
    for i in range(pairs):
        arguments = last_arguments if i == pairs - 1 else "{}"
        call = {
            "type": "function_call",
            "call_id": f"c{i}",
            "name": "note",
            "status": "completed",
            "arguments": arguments,
        }
        found += [call, {"type": "function_call_output", "call_id": f"c{i}", "output": ""}]
    return [*found, {"role": "user", "content": "Thanks."}]


@pytest.mark.parametrize(
    ("action", "last_arguments", "status", "forwarded_items"),
    [
        pytest.param("block", "{}", 200, 10_000, id="clean"),
        pytest.param("block", "{", 400, None, id="last-call-fails-blocked"),
        pytest.param("strip", "{", 200, 9_998, id="last-call-fails-stripped"),
    ],
)
async def test_ten_thousand_items_are_gated(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    action: str,
    last_arguments: str,
    status: int,
    forwarded_items: int | None,
) -> None:
    base = await start_proxy(recording_upstream.url, gate={"action": action})
    items = many_items(4_999, last_arguments=last_arguments)
    sent = json.dumps({"model": "m", "tools": [NOTE], "input": items}).encode()
    assert len(items) == 10_000

    async with client.post(f"{base}/v1/responses", data=sent, headers=JSON_HEADERS) as resp:
        assert resp.status == status
        answer = await resp.json()

    if forwarded_items is None:
        [finding] = answer["error"]["findings"]
        assert (finding["index"], finding["paired_index"]) == (9_998, 9_997)
        assert finding["reason"] == "arguments_parse"
        assert recording_upstream.received == []
        return
    [got] = recording_upstream.received
    assert len(got.json()["input"]) == forwarded_items
    if action == "block":
        assert got.body == sent


async def test_a_clean_body_over_a_mebibyte_is_forwarded(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
) -> None:
    base = await start_proxy(recording_upstream.url)
    sent = json.dumps({"model": "m", "input": [USER], "pad": "x" * (2 * MiB)}).encode()
    async with client.post(
        f"{base}/v1/responses", data=io.BytesIO(sent), headers=JSON_HEADERS
    ) as resp:
        assert resp.status == 200
    assert [r.body for r in recording_upstream.received] == [sent]


class CountingLedger:
    """A Recorded double over fixed upstream calls that counts its look-ups."""

    trust_unpaired = False

    def __init__(self, calls: Sequence[Item]) -> None:
        self.by_id = {call["id"]: call for call in calls}
        self.lookups = 0

    def calls(self, call_id: str) -> tuple[Item, ...]:
        return ()

    def item(self, item_id: str) -> Item | None:
        self.lookups += 1
        return self.by_id.get(item_id)

    def emitted_statuses(self, call: Item) -> tuple[str, ...]:
        return ()

    def mcp_lists(self) -> tuple[Item, ...]:
        return ()


def test_ten_thousand_item_references_are_each_resolved_once() -> None:
    calls = [sales_call(f"call_{i}") for i in range(5_000)]
    references = [{"type": "item_reference", "id": call["id"]} for call in calls]
    outputs = [sales_output(call["call_id"]) for call in calls]
    ledger = CountingLedger(calls)

    verdict = inspect({"tools": [SALES_TOOL], "input": [*references, *outputs]}, Policy(), ledger)

    assert verdict == Verdict(Outcome.FORWARD)
    # Resolving every reference again for every output would be 12.5 million look-ups.
    assert ledger.lookups == 5_000


@pytest.mark.parametrize("action", ["block", "strip"])
def test_ten_thousand_items_sharing_one_call_id(action: str) -> None:
    same = [sales_call("call_1") for _ in range(5_000)] + [sales_output("call_1")] * 5_000
    verdict = inspect({"tools": [SALES_TOOL], "input": same}, Policy(action=action))  # type: ignore[arg-type]
    assert [f.reason for f in verdict.findings] == ["duplicate_call_id"] * 5_000
    assert verdict.outcome == action
    assert verdict.input == ([] if action == "strip" else None)
