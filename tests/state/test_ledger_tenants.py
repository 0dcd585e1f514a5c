"""The memory ledger bounds each tenant as well as the whole: one tenant's traffic never evicts
another tenant's few responses."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.settings import LedgerSettings
from proxy.state.recording import RecordedResponse
from proxy.state.stores import MemoryStore
from tests.builders import SALES_TOOL, sales_output
from tests.fixture_types import ProxyFactory
from tests.servers.recording import RecordingUpstream
from tests.state.test_ledger_encoding import EchoingUpstream


async def held(store: MemoryStore, tenant: str, count: int) -> list[str]:
    """Which of `tenant`'s responses resp_0 … resp_<count-1> the store still holds."""
    return [n for i in range(count) if await store.chain(tenant, (n := f"resp_{i}"), 1)]


async def test_a_tenant_past_its_share_loses_its_own_oldest() -> None:
    store = MemoryStore(max_responses=10, ttl_s=60, max_per_tenant=2)
    await store.put("b", RecordedResponse("resp_b", None, ()))
    for i in range(20):  # ten times its share
        await store.put("a", RecordedResponse(f"resp_{i}", None, ()))

    assert await held(store, "a", 20) == ["resp_18", "resp_19"]
    assert await store.chain("b", "resp_b", 1)
    assert len(store) == 3


async def test_a_full_store_takes_from_the_tenant_holding_the_most() -> None:
    store = MemoryStore(max_responses=6, ttl_s=60, max_per_tenant=3)
    for tenant, count in (("a", 3), ("b", 2), ("c", 1)):
        for i in range(count):
            await store.put(tenant, RecordedResponse(f"resp_{i}", None, ()))
    await store.put("d", RecordedResponse("resp_0", None, ()))  # full: `a` holds the most

    assert len(store) == 6
    assert await held(store, "a", 3) == ["resp_1", "resp_2"]
    assert await held(store, "b", 2) == ["resp_0", "resp_1"]
    assert await held(store, "c", 1) == ["resp_0"]
    assert await held(store, "d", 1) == ["resp_0"]


async def test_a_response_recorded_again_counts_once() -> None:
    store = MemoryStore(max_responses=10, ttl_s=60, max_per_tenant=2)
    for _ in range(5):
        await store.put("a", RecordedResponse("resp_0", None, ()))
    await store.put("a", RecordedResponse("resp_1", None, ()))

    assert await held(store, "a", 2) == ["resp_0", "resp_1"]


@pytest.mark.parametrize(
    ("given", "per_tenant"),
    [
        pytest.param({}, 5000, id="default-a-fifth"),
        pytest.param({"max_responses": 4}, 1, id="at-least-one"),
        pytest.param({"max_responses_per_tenant": 7}, 7, id="set"),
    ],
)
def test_the_share_of_a_tenant(given: dict[str, int], per_tenant: int) -> None:
    assert LedgerSettings(**given).per_tenant == per_tenant  # type: ignore[arg-type]


async def test_one_tenants_traffic_leaves_anothers_follow_up_usable(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory
) -> None:
    """Through the proxy, `ledger.max_responses: 5` (one response a tenant by default):
    tenant A at ten times its share, then tenant B's follow-up of its one response pairs."""
    echoing = EchoingUpstream(recording_upstream)
    echoing.ids = ["resp_b", *(f"resp_a{i}" for i in range(10)), "resp_b2"]
    base = await start_proxy(recording_upstream.url, ledger={"max_responses": 5})
    a, b = {"Authorization": "Bearer sk-tenant-a"}, {"Authorization": "Bearer sk-tenant-b"}
    first = {"model": "m", "tools": [SALES_TOOL], "input": "hi"}
    async with aiohttp.ClientSession() as session:
        async with session.post(base + "/v1/responses", json=first, headers=b) as answer:
            assert answer.status == 200
        for _ in range(10):
            async with session.post(base + "/v1/responses", json=first, headers=a) as answer:
                assert answer.status == 200
        follow_up = {**first, "previous_response_id": "resp_b", "input": [sales_output("c1")]}
        async with session.post(base + "/v1/responses", json=follow_up, headers=b) as answer:
            assert answer.status == 200, await answer.text()

    assert recording_upstream.received[-1].json() == follow_up


@given(
    st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 7)), min_size=1, max_size=40),
    st.integers(1, 4),
    st.integers(1, 8),
)
@settings(max_examples=300, deadline=None)
def test_every_tenant_is_counted_as_it_holds(
    puts: list[tuple[str, int]], per_tenant: int, most: int
) -> None:
    """Whatever the order of puts (a response put again, a tenant at its share, a full store),
    the count the store keeps of each tenant (which a full store evicts by) is what the tenant
    holds, both bounds hold, and the response just put is held."""
    store = MemoryStore(max_responses=most, ttl_s=60, max_per_tenant=per_tenant)

    async def put_all() -> None:
        for tenant, number in puts:
            await store.put(tenant, RecordedResponse(f"resp_{number}", None, ()))
            assert await store.chain(tenant, f"resp_{number}", 1)
            holding = {t: len(ids) for t in "abc" if (ids := await held(store, t, 8))}
            assert store._holdings._count == holding
            assert len(store) == sum(holding.values()) <= most
            assert max(holding.values()) <= per_tenant

    asyncio.run(put_all())
