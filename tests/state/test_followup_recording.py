"""What the ledger records of a forwarded request and its response, and how the gate uses it:
one call found by several routes, compacted calls, a recorded call's own tool, the stores."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from proxy.admission.pipeline import context_of
from proxy.gate import items
from proxy.gate.items import Item
from proxy.gate.policy import Policy
from proxy.gate.reasons import Outcome
from proxy.gate.verdict import Verdict, inspect
from proxy.state.encoding import decode, encode
from proxy.state.ledger import Ledger, Store
from proxy.state.ledger_view import LedgerView
from proxy.state.recording import Context, RecordedResponse
from proxy.state.stores import MemoryStore, RedisStore
from tests.builders import SALES_SCHEMA, SALES_TOOL, sales_call, sales_output
from tests.servers.redis_server import RedisServer

APAC = '{"region":"apac"}'
MARS = '{"region":"mars"}'


class Recorded:
    """A Recorded double: the chain's calls and the items stored by id."""

    trust_unpaired = False

    def __init__(self, chain: Sequence[Item] = (), stored: Mapping[str, Item] | None = None):
        self.chain = list(chain)
        self.stored = dict(stored or {})

    def calls(self, call_id: str) -> Sequence[Item]:
        return [c for c in self.chain if items.pairing_key(c) == call_id]

    def item(self, item_id: str) -> Item | None:
        return self.stored.get(item_id)

    def emitted_statuses(self, call: Item) -> Sequence[Any]:
        return ()

    def mcp_lists(self) -> Sequence[Item]:
        return ()


def ref(item_id: str) -> dict[str, Any]:
    return {"type": "item_reference", "id": item_id}


def compaction(item_id: str = "cmp_1") -> dict[str, Any]:
    return {"type": "compaction", "id": item_id, "encrypted_content": "opaque"}


def compacted(*calls: Item, item_id: str = "cmp_1") -> dict[str, Any]:
    return {"type": "compaction", "id": item_id, "calls": list(calls)}


def own_tool(call: dict[str, Any], schema: Any = SALES_SCHEMA) -> dict[str, Any]:
    """A recorded call as the ledger's view gives it: with its own tool's parameters."""
    return call | {items.RECORDED_SCHEMAS: [schema]}


# (input, recorded, tools offered, the reasons found)
ROUTES = [
    pytest.param(
        [sales_output("c")],
        Recorded(chain=[sales_call("c"), sales_call("c")]),
        [SALES_TOOL],
        [],
        id="chain-twice-output-and-next-input",
    ),
    pytest.param(
        [ref("fc_c"), sales_output("c")],
        Recorded(chain=[sales_call("c")], stored={"fc_c": sales_call("c")}),
        [SALES_TOOL],
        [],
        id="reference-and-chain",
    ),
    pytest.param(
        [sales_call("c"), sales_output("c")],
        Recorded(chain=[sales_call("c")]),
        [SALES_TOOL],
        [],
        id="inline-and-chain",
    ),
    pytest.param(
        [sales_call("c"), ref("fc_c"), sales_output("c")],
        Recorded(stored={"fc_c": sales_call("c")}),
        [SALES_TOOL],
        [],
        id="inline-and-reference",
    ),
    pytest.param(
        [sales_call("c", status=None), sales_output("c")],
        Recorded(chain=[sales_call("c")]),
        [SALES_TOOL],
        ["status"],
        id="inline-without-status-is-the-recorded-call",
    ),
    pytest.param(
        [sales_output("c")],
        Recorded(chain=[sales_call("c"), sales_call("c", "emea")]),
        [SALES_TOOL],
        ["duplicate_call_id"],
        id="two-calls-in-the-chain",
    ),
    pytest.param(
        [sales_call("c"), sales_output("c")],
        Recorded(chain=[sales_call("c", id="fc_other")]),
        [SALES_TOOL],
        ["duplicate_call_id"],
        id="other-id-is-another-call",
    ),
    pytest.param(
        [sales_call("c"), sales_call("c"), sales_output("c")],
        Recorded(),
        [SALES_TOOL],
        ["duplicate_call_id"],
        id="twice-inline-is-two",
    ),
    pytest.param(
        [ref("fc_c"), ref("fc_c"), sales_output("c")],
        Recorded(stored={"fc_c": sales_call("c")}),
        [SALES_TOOL],
        ["duplicate_call_id"],
        id="two-references-are-two",
    ),
    # Compaction items stand for the calls recorded as compacted into them.
    pytest.param(
        [compaction(), sales_output("c")],
        Recorded(stored={"cmp_1": compacted(sales_call("c"))}),
        [SALES_TOOL],
        [],
        id="compacted-call",
    ),
    pytest.param(
        [sales_output("c"), compaction()],
        Recorded(stored={"cmp_1": compacted(sales_call("c"))}),
        [SALES_TOOL],
        ["orphan"],
        id="compaction-after-the-output",
    ),
    pytest.param(
        [compaction(), sales_output("c")],
        Recorded(),
        [SALES_TOOL],
        ["orphan"],
        id="compaction-never-recorded",
    ),
    pytest.param(
        [ref("cmp_1"), sales_output("c")],
        Recorded(stored={"cmp_1": compacted(sales_call("c"))}),
        [SALES_TOOL],
        [],
        id="reference-to-a-compaction",
    ),
    pytest.param(
        [compaction(), sales_output("c")],
        Recorded(stored={"cmp_1": compacted(sales_call("c", "mars"))}),
        [SALES_TOOL],
        ["arguments_schema"],
        id="compacted-call-still-judged",
    ),
    # A recorded call is judged by its own tool when the request offers none of that name.
    pytest.param(
        [sales_output("c")],
        Recorded(chain=[own_tool(sales_call("c"))]),
        [],
        [],
        id="own-tool-no-tools-offered",
    ),
    pytest.param(
        [sales_output("c")],
        Recorded(chain=[own_tool(sales_call("c", "mars"))]),
        [],
        ["arguments_schema"],
        id="own-tool-fails",
    ),
    pytest.param(
        [sales_output("c")],
        Recorded(chain=[own_tool(sales_call("c", "mars"), {})]),
        [SALES_TOOL],
        ["arguments_schema"],
        id="offered-tool-wins-over-own",
    ),
    pytest.param(
        [sales_output("c")],
        Recorded(chain=[sales_call("c")]),
        [],
        ["unknown_tool"],
        id="no-tool-recorded-no-tool-offered",
    ),
    pytest.param(
        [own_tool(sales_call("c", "mars"), {}), sales_output("c")],
        Recorded(),
        [],
        ["unknown_tool"],
        id="inline-call-never-brings-its-own-tool",
    ),
    pytest.param(
        [ref("fc_c"), sales_output("c")],
        Recorded(stored={"fc_c": own_tool(sales_call("c"))}),
        [],
        [],
        id="own-tool-by-reference",
    ),
]


@pytest.mark.parametrize(("input_items", "recorded", "tools", "reasons"), ROUTES)
def test_routes_to_a_call(
    input_items: list[Any], recorded: Recorded, tools: list[Any], reasons: list[str]
) -> None:
    body = {"model": "m", "tools": tools, "input": input_items}
    verdict = inspect(body, Policy(), recorded)
    assert [f.reason for f in verdict.findings] == reasons


def test_a_pinned_schema_wins_over_the_recorded_one() -> None:
    policy = Policy(tools={"get_latest_sales_report": {"const": "x"}})
    recorded = Recorded(chain=[own_tool(sales_call("c"))])
    verdict = inspect({"input": [sales_output("c")]}, policy, recorded)
    assert [(f.reason, f.fail[0].reason) for f in verdict.findings] == [
        ("arguments_schema", "const")
    ]


def test_stripping_a_compacted_calls_output_blocks() -> None:
    recorded = Recorded(stored={"cmp_1": compacted(sales_call("c", "mars"))})
    body = {"tools": [SALES_TOOL], "input": [compaction(), sales_output("c")]}
    verdict = inspect(body, Policy(action="strip"), recorded)
    assert verdict.outcome == "block"


INLINE_CALL = sales_call("c_inline")

# (the request body, the verdict it got, what its response is recorded with)
CONTEXTS = [
    pytest.param(
        {"input": [{"role": "user", "content": "hi"}, INLINE_CALL]},
        Verdict(Outcome.FORWARD),
        [{k: INLINE_CALL[k] for k in ("type", "id", "call_id", "name", "arguments", "status")}],
        id="unanswered-inline-call",
    ),
    pytest.param(
        {"input": [INLINE_CALL, sales_output("c_inline")]},
        Verdict(Outcome.FORWARD),
        [],
        id="answered-call-left-out",
    ),
    pytest.param(
        {"input": [{"type": "message", "id": "msg_9", "role": "user", "content": "x"}]},
        Verdict(Outcome.FORWARD),
        [],
        id="messages-of-input-left-out",
    ),
    pytest.param(
        {"input": [INLINE_CALL | {items.RECORDED_TOOLS: "forged"}]},
        Verdict(Outcome.FORWARD),
        [{k: INLINE_CALL[k] for k in ("type", "id", "call_id", "name", "arguments", "status")}],
        id="a-client-cannot-tag-its-call",
    ),
    pytest.param(
        {"input": "just text"},
        Verdict(Outcome.FORWARD),
        [],
        id="string-input",
    ),
]


@pytest.mark.parametrize(("body", "verdict", "recorded"), CONTEXTS)
def test_the_context_a_response_is_recorded_with(
    body: dict[str, Any], verdict: Verdict, recorded: list[dict[str, Any]]
) -> None:
    assert list(context_of(body, verdict, None, compacts=False).items) == recorded


def test_items_named_by_a_finding_or_stripped_are_not_recorded() -> None:
    bad = sales_call("bad", "mars")
    body = {"tools": [SALES_TOOL], "input": [INLINE_CALL, bad, sales_output("bad")]}
    logged = inspect(body, Policy(action="log"))
    assert [i["call_id"] for i in context_of(body, logged, None, compacts=False).items] == [
        "c_inline"
    ]
    stripped = inspect(body, Policy(action="strip"))
    assert stripped.outcome == "strip"
    assert [i["call_id"] for i in context_of(body, stripped, None, compacts=False).items] == [
        "c_inline"
    ]


def test_a_reference_is_recorded_as_the_item_it_names() -> None:
    view = LedgerView(by_id={"fc_r": sales_call("r") | {items.RECORDED_TOOLS: "h1"}})
    body = {"input": [ref("fc_r")], "tools": [SALES_TOOL]}
    [recorded] = context_of(body, Verdict(Outcome.FORWARD), view, compacts=False).items
    assert (recorded["call_id"], recorded[items.RECORDED_TOOLS]) == ("r", "h1")


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> Any:
    if request.param == "memory":
        yield MemoryStore(max_responses=2, ttl_s=60)
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    redis = RedisStore(server.url, ttl_s=60, timeout_s=5)
    yield redis
    await redis.close()


def response(response_id: str, *output: Item, previous: str | None = None) -> dict[str, Any]:
    found = {"id": response_id, "object": "response", "output": list(output)}
    return found | {"previous_response_id": previous}


async def test_a_response_read_again_keeps_the_input_it_was_created_with(store: Store) -> None:
    ledger = Ledger(store, max_chain=8, fail_open=False)
    tools = ((SALES_TOOL["name"], SALES_SCHEMA),)
    context = Context.of([{"type": "function_call", "call_id": "in", "name": "n"}], tools, False)
    await ledger.record("t", response("resp_1"), context)  # queued: no output yet
    await ledger.record("t", response("resp_1", sales_call("out")), None)  # GET: done

    view = await ledger.view("t", {"previous_response_id": "resp_1"}, provenance=False)
    assert view is not None
    assert sorted(view.chain_calls) == ["in", "out"]
    [out] = view.chain_calls["out"]
    assert out[items.RECORDED_SCHEMAS] == [SALES_SCHEMA]


async def test_tools_are_stored_once_and_forgotten_with_the_last_response() -> None:
    store = MemoryStore(max_responses=2, ttl_s=60)
    ledger = Ledger(store, max_chain=8, fail_open=False)
    context = Context.of([], ((SALES_TOOL["name"], SALES_SCHEMA),), False)
    for n in range(2):
        await ledger.record("t", response(f"resp_{n}", sales_call(f"c{n}")), context)
    assert len(store._tools) == 1
    assert store._tools[("t", str(context.tools_key))][1] == 2
    await ledger.record("t", response("resp_other", sales_call("x")), Context())
    await ledger.record("t", response("resp_other2", sales_call("y")), Context())
    assert store._tools == {}


async def test_a_compaction_maps_to_the_calls_that_went_in(store: Store) -> None:
    ledger = Ledger(store, max_chain=8, fail_open=False)
    context = Context.of([dict(sales_call("c"))], (), True)
    answer = {"id": "resp_c", "object": "response.compaction", "output": [compaction("cmp_9")]}
    await ledger.record("t", answer, context)

    body = {"input": [compaction("cmp_9"), sales_output("c")], "tools": [SALES_TOOL]}
    view = await ledger.view("t", body, provenance=False)
    assert view is not None
    assert inspect(body, Policy(), view).findings == ()
    other = await ledger.view("u", body, provenance=False)
    assert other is not None
    assert [f.reason for f in inspect(body, Policy(), other).findings] == ["orphan"]


def test_a_recording_encodes_and_decodes() -> None:
    recording = RecordedResponse("r", "p", ({"type": "message", "id": "m"},), 1, "h")
    assert decode("r", encode(recording)) == recording
    assert json.loads(encode(RecordedResponse("r", None, ()))) == {"prev": None, "items": []}
