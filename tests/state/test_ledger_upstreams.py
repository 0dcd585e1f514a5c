"""The ledger records which upstream made each response and, with `whole_items`, the whole
conversation a route that materializes inlines; in memory and in Redis alike."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.state.encoding import decode, encode
from proxy.state.ledger import Ledger
from proxy.state.recording import Context, RecordedResponse
from proxy.state.stores import MemoryStore, RedisStore
from tests.builders import sales_call, sales_output
from tests.servers.redis_server import RedisServer

USER = {"type": "message", "role": "user", "content": "hi"}
SAID = {"type": "message", "role": "assistant", "id": "msg_1", "content": [{"text": "hello"}]}


@pytest.fixture(params=["memory", "redis"])
async def ledger(request: pytest.FixtureRequest) -> AsyncIterator[Ledger]:
    if request.param == "memory":
        yield Ledger(MemoryStore(max_responses=8, ttl_s=60), max_chain=3, fail_open=False)
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    store = RedisStore(server.url, ttl_s=60, timeout_s=5)
    yield Ledger(store, max_chain=3, fail_open=False)
    await store.close()


def response(response_id: str, *output: Any, previous: str | None = None) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "output": list(output)} | {
        "previous_response_id": previous
    }


def whole(*items: Any) -> Context:
    return Context(whole=items)


async def test_the_view_names_the_upstream_that_made_the_previous_response(
    ledger: Ledger,
) -> None:
    await ledger.record("t", response("resp_1", sales_call("c")), whole(USER), "openai")
    await ledger.record("t", response("resp_0"), Context())  # recorded before routes

    view = await ledger.view("t", {"previous_response_id": "resp_1"}, provenance=False)
    unknown = await ledger.view("t", {"previous_response_id": "resp_0"}, provenance=False)

    assert view is not None
    assert unknown is not None
    assert (view.origin, unknown.origin) == ("openai", None)


@pytest.mark.parametrize(
    ("asked_on", "resolved"),
    [
        pytest.param("openai", True, id="its-own-upstream"),
        pytest.param("acme", False, id="another-upstream"),
        pytest.param(None, False, id="no-upstream-named"),
    ],
)
async def test_a_reference_resolves_only_to_items_its_upstream_made(
    ledger: Ledger, asked_on: str | None, resolved: bool
) -> None:
    await ledger.record("t", response("resp_1", sales_call("c"), SAID), Context(), "openai")
    body = {"input": [{"type": "item_reference", "id": "fc_c"}, {"id": "msg_1"}]}

    view = await ledger.view("t", body, provenance=False, upstream=asked_on)

    assert view is not None
    assert sorted(view.by_id) == (["fc_c", "msg_1"] if resolved else [])


async def test_an_item_of_the_same_id_from_each_upstream_is_each_ones_own(ledger: Ledger) -> None:
    await ledger.record("t", response("resp_1", sales_call("c")), Context(), "openai")
    await ledger.record("t", response("resp_2", sales_call("c", "emea")), Context(), "acme")
    body = {"input": [{"type": "item_reference", "id": "fc_c"}]}

    found = {}
    for upstream in ("openai", "acme"):
        view = await ledger.view("t", body, provenance=False, upstream=upstream)
        assert view is not None
        found[upstream] = json.loads(view.by_id["fc_c"]["arguments"])["region"]

    assert found == {"openai": "apac", "acme": "emea"}


async def test_a_response_read_again_keeps_its_upstream_and_whole_items(ledger: Ledger) -> None:
    await ledger.record("t", response("resp_1"), whole(USER), "openai")
    await ledger.record("t", response("resp_1", SAID), None, None)  # GET, done by now

    assert await ledger.history("t", "resp_1") == [USER]
    view = await ledger.view("t", {"previous_response_id": "resp_1"}, provenance=False)
    assert view is not None
    assert view.origin == "openai"


async def test_the_history_is_each_turns_input_then_output_oldest_first(ledger: Ledger) -> None:
    call, output = sales_call("c"), sales_output("c", "apac: 42")
    await ledger.record("t", response("resp_1", call), whole(USER), "openai")
    await ledger.record("t", response("resp_2", SAID, previous="resp_1"), whole(output), "openai")

    assert await ledger.history("t", "resp_2") == [USER, call, output, SAID]
    assert await ledger.history("u", "resp_2") is None  # another tenant's


# (what is recorded, the history of resp_2): None when it cannot be had whole.
NOT_WHOLE = [
    pytest.param([("resp_2", "resp_1", True)], id="its-first-response-unknown"),
    pytest.param([("resp_1", None, False), ("resp_2", "resp_1", True)], id="one-not-whole"),
    pytest.param(
        [
            ("resp_0", None, True),
            ("resp_1", "resp_0", True),
            ("r", "resp_1", True),
            ("resp_2", "r", True),
        ],
        id="longer-than-max-chain",
    ),
]


@pytest.mark.parametrize("recorded", NOT_WHOLE)
async def test_a_history_that_is_not_whole_is_none(
    ledger: Ledger, recorded: list[tuple[str, str | None, bool]]
) -> None:
    for response_id, previous, kept_whole in recorded:
        context = whole(USER) if kept_whole else Context()
        await ledger.record("t", response(response_id, previous=previous), context, "openai")
    assert await ledger.history("t", "resp_2") is None


def test_a_recording_encodes_its_upstream_and_whole_items() -> None:
    recording = RecordedResponse("r", "p", (), 0, None, "acme", (USER, SAID))
    assert decode("r", encode(recording)) == recording
    # Without them, a recording is stored as before (and one stored before still decodes).
    assert json.loads(encode(RecordedResponse("r", None, ()))) == {"prev": None, "items": []}
    assert decode("r", '{"prev": null, "items": []}').upstream is None
