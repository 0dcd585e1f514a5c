"""The replay gate through `inspect`: every reason, its order, every action, the caches."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

import pytest
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

from proxy.gate import items
from proxy.gate.caches import GateCaches
from proxy.gate.items import Item
from proxy.gate.policy import Policy
from proxy.gate.schemas import Compiled, SchemaCache, SchemaLimits
from proxy.gate.verdict import Verdict, inspect, rejection
from tests.conftest import SALES_SCHEMA as SALES

SALES_TOOL = {"type": "function", "name": "get_latest_sales_report", "parameters": SALES}
TOOLS = [SALES_TOOL]
APAC = '{"region":"apac"}'
GLOBAL = '{"region":"global"}'
DRAFT_07 = "http://json-schema.org/draft-07/schema#"


def call(
    call_id: str, arguments: Any = APAC, name: Any = "get_latest_sales_report", **extra: Any
) -> dict[str, Any]:
    item = {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "status": "completed",
        "arguments": arguments,
    }
    return item | extra


def without(item: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in keys}


def output(call_id: Any) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "sales report"}


def message(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def ref(item_id: str) -> dict[str, Any]:
    return {"type": "item_reference", "id": item_id}


def request(*input_items: Any, tools: Any = TOOLS, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "input": list(input_items), "tools": tools} | extra


def tool(parameters: Any, name: str = "get_latest_sales_report") -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": parameters}


class Ledger:
    """A Recorded double: calls of the `previous_response_id` chain, stored items, emitted calls."""

    def __init__(
        self,
        chain: Sequence[Item] = (),
        stored: Mapping[str, Item] | None = None,
        emitted: Sequence[Item] = (),
        trust_unpaired: bool = False,
    ) -> None:
        self.trust_unpaired = trust_unpaired
        self.chain = list(chain)
        self.stored = dict(stored or {})
        self.emitted_calls = [(c["call_id"], c["name"], c["arguments"]) for c in emitted]
        self.statuses = [c.get("status") for c in emitted]
        self.asked: list[Item] = []

    def calls(self, call_id: str) -> Sequence[Item]:
        return [item for item in self.chain if items.pairing_key(item) == call_id]

    def item(self, item_id: str) -> Item | None:
        return self.stored.get(item_id)

    def emitted_statuses(self, call: Item) -> Sequence[Any]:
        self.asked.append(call)
        key = (call.get("call_id"), call.get("name"), call.get("arguments"))
        return [s for c, s in zip(self.emitted_calls, self.statuses, strict=True) if c == key]


def only(verdict: Verdict) -> dict[str, Any]:
    [finding] = verdict.findings
    return finding.as_dict()


# (input items, policy settings, ledger, reason of the one finding or None, its paired_index)
REASONS = [
    # orphan
    pytest.param([output("c")], {}, None, "orphan", None, id="orphan-no-call"),
    pytest.param([output("c"), call("c")], {}, None, "orphan", None, id="orphan-call-after"),
    pytest.param([call("a"), output("c")], {}, None, "orphan", None, id="orphan-other-call-id"),
    pytest.param([call("c"), output(5)], {}, None, "orphan", None, id="orphan-call-id-number"),
    pytest.param(
        [call("c"), without(output("c"), "call_id")], {}, None, "orphan", None, id="orphan-no-id"
    ),
    pytest.param(
        [ref("fc_c"), output("c")],
        {},
        Ledger(stored={"fc_c": call("other")}),
        "orphan",
        None,
        id="orphan-ref-to-other-call",
    ),
    pytest.param(
        [output("c"), ref("fc_c")],
        {},
        Ledger(stored={"fc_c": call("c")}),
        "orphan",
        None,
        id="orphan-ref-after-output",
    ),
    pytest.param(
        [output("c")], {}, Ledger(chain=[call("other")]), "orphan", None, id="orphan-not-in-chain"
    ),
    # A ledger that could not be read, under fail_open: an unpaired output passes, nothing else.
    pytest.param(
        [output("c")], {}, Ledger(trust_unpaired=True), None, None, id="fail-open-unpaired"
    ),
    pytest.param(
        [call("c", GLOBAL), output("c")],
        {},
        Ledger(trust_unpaired=True),
        "arguments_schema",
        0,
        id="fail-open-inline-pair-still-gated",
    ),
    pytest.param(
        [call("c"), call("c"), output("c")],
        {},
        Ledger(trust_unpaired=True),
        "duplicate_call_id",
        0,
        id="fail-open-duplicate-still-gated",
    ),
    # duplicate_call_id
    pytest.param(
        [call("c"), call("c"), output("c")], {}, None, "duplicate_call_id", 0, id="dup-two-calls"
    ),
    pytest.param(
        [call("c"), output("c")],
        {},
        Ledger(chain=[call("c", GLOBAL)]),
        "duplicate_call_id",
        0,
        id="dup-inline-and-upstream",
    ),
    pytest.param(
        [call("c"), ref("fc_c"), output("c")],
        {},
        Ledger(stored={"fc_c": call("c", GLOBAL)}),
        "duplicate_call_id",
        0,
        id="dup-inline-and-reference",
    ),
    pytest.param(
        [call("c", GLOBAL, status="in_progress"), call("c", {"x": 1}), output("c")],
        {},
        None,
        "duplicate_call_id",
        0,
        id="dup-before-other-reasons",
    ),
    # provenance
    pytest.param(
        [call("c"), output("c")],
        {"require_provenance": True},
        Ledger(),
        "provenance",
        0,
        id="provenance-never-emitted",
    ),
    pytest.param(
        [call("c"), output("c")],
        {"require_provenance": True},
        Ledger(emitted=[call("c")]),
        None,
        None,
        id="provenance-emitted",
    ),
    pytest.param(
        [call("c", '{"region":"emea"}'), output("c")],
        {"require_provenance": True},
        Ledger(emitted=[call("c")]),
        "provenance",
        0,
        id="provenance-arguments-changed",
    ),
    pytest.param([call("c"), output("c")], {}, Ledger(), None, None, id="provenance-not-required"),
    pytest.param(
        [output("c")],
        {"require_provenance": True},
        Ledger(chain=[call("c")], emitted=[call("c")]),
        None,
        None,
        id="provenance-upstream-call-emitted",
    ),
    # namespaced
    pytest.param(
        [
            {
                "type": "openai:web_search_call",
                "id": "ws_001",
                "status": "completed",
                "action": {"type": "search", "query": "apac sales report"},
            },
            output("ws_001"),
        ],
        {},
        None,
        "namespaced",
        0,
        id="namespaced-web-search",
    ),
    pytest.param(
        [call("c", type="acme:function_call"), output("c")],
        {},
        None,
        "namespaced",
        0,
        id="namespaced-vendor-function-call",
    ),
    pytest.param([call("c", type=5), output("c")], {}, None, "namespaced", 0, id="type-number"),
    pytest.param(
        [without(call("c", type=None), "id"), output("c")],
        {},
        None,
        "namespaced",
        0,
        id="type-null",
    ),
    pytest.param(
        [without(call("c"), "type", "id"), output("c")],
        {},
        None,
        "namespaced",
        0,
        id="type-missing",
    ),
    pytest.param(
        [message("hi") | {"call_id": "c"}, output("c")],
        {},
        None,
        "namespaced",
        0,
        id="typeless-msg",
    ),
    # not_function_call
    pytest.param(
        [message("hi") | {"type": "message", "call_id": "c"}, output("c")],
        {},
        None,
        "not_function_call",
        0,
        id="not-fc-message",
    ),
    pytest.param(
        [call("c", type="custom_tool_call"), output("c")],
        {},
        None,
        "not_function_call",
        0,
        id="not-fc-custom-tool-call",
    ),
    pytest.param(
        [{"type": "reasoning", "id": "rs_1", "summary": []}, output("rs_1")],
        {},
        None,
        "not_function_call",
        0,
        id="not-fc-reasoning-by-id",
    ),
    # status
    pytest.param([call("c", status="in_progress"), output("c")], {}, None, "status", 0, id="st-ip"),
    pytest.param(
        [call("c", status="incomplete"), output("c")], {}, None, "status", 0, id="st-incomplete"
    ),
    pytest.param([call("c", status="COMPLETED"), output("c")], {}, None, "status", 0, id="st-case"),
    pytest.param([call("c", status=1), output("c")], {}, None, "status", 0, id="st-number"),
    pytest.param(
        [without(call("c"), "status"), output("c")], {}, None, "status", 0, id="st-missing"
    ),
    pytest.param([call("c", status=None), output("c")], {}, None, "status", 0, id="st-null"),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {"allow_missing_status": True},
        None,
        None,
        None,
        id="st-missing-allowed",
    ),
    pytest.param(
        [call("c", status=None), output("c")],
        {"allow_missing_status": True},
        None,
        None,
        None,
        id="st-null-allowed",
    ),
    pytest.param(
        [call("c", status="in_progress"), output("c")],
        {"allow_missing_status": True},
        None,
        "status",
        0,
        id="st-in-progress-never-allowed",
    ),
    # arguments_type
    pytest.param(
        [call("c", {"region": "apac"}), output("c")], {}, None, "arguments_type", 0, id="at-object"
    ),
    pytest.param([call("c", None), output("c")], {}, None, "arguments_type", 0, id="at-null"),
    pytest.param([call("c", 5), output("c")], {}, None, "arguments_type", 0, id="at-number"),
    pytest.param([call("c", ["apac"]), output("c")], {}, None, "arguments_type", 0, id="at-list"),
    pytest.param(
        [without(call("c"), "arguments"), output("c")],
        {},
        None,
        "arguments_type",
        0,
        id="at-missing",
    ),
    # arguments_parse
    *(
        pytest.param([call("c", arguments), output("c")], {}, None, "arguments_parse", 0, id=name)
        for name, arguments in [
            ("ap-empty", ""),
            ("ap-truncated", '{"region":'),
            ("ap-trailing-data", APAC + " x"),
            ("ap-two-values", APAC + APAC),
            ("ap-two-values-jsonl", APAC + "\n" + APAC),
            ("ap-duplicate-key", '{"region":"apac","region":"global"}'),
            ("ap-duplicate-key-nested", '{"region":"apac","f":{"a":1,"a":2}}'),
            ("ap-duplicate-key-in-array", '{"region":"apac","f":[{"a":{"b":1,"b":1}}]}'),
            ("ap-nan", '{"region":"apac","n":NaN}'),
            ("ap-infinity", '{"region":"apac","n":Infinity}'),
            ("ap-minus-infinity", '{"region":"apac","n":-Infinity}'),
            ("ap-lone-high-surrogate", '{"region":"\\ud800"}'),
            ("ap-lone-low-surrogate", '{"region":"apac\\udc00"}'),
            ("ap-lone-surrogate-in-key", '{"\\ud83d":1}'),
            ("ap-raw-lone-surrogate", '{"region":"\ud800"}'),
            ("ap-single-quotes", "{'region':'apac'}"),
            ("ap-trailing-comma", '{"region":"apac",}'),
            ("ap-bom", "\ufeff" + APAC),
            ("ap-huge-integer", '{"region":"apac","n":' + "9" * 5000 + "}"),
            ("ap-number-overflows", '{"region":"apac","n":1e400}'),
            ("ap-too-deep", "[" * 100_000 + "]" * 100_000),
        ]
    ),
    pytest.param(
        [call("c", '{"region":"apac","emoji":"\\ud83d\\ude00"}'), output("c")],
        {"tools": {"get_latest_sales_report": {"type": "object"}}},
        None,
        None,
        None,
        id="ap-surrogate-pair-ok",
    ),
    # unknown_tool
    pytest.param(
        [call("c", name="delete_everything"), output("c")],
        {},
        None,
        "unknown_tool",
        0,
        id="ut-not-in-tools",
    ),
    pytest.param([call("c", name=5), output("c")], {}, None, "unknown_tool", 0, id="ut-name-num"),
    pytest.param(
        [call("c", name=None), output("c")], {}, None, "unknown_tool", 0, id="ut-name-null"
    ),
    # arguments_schema
    pytest.param([call("c", GLOBAL), output("c")], {}, None, "arguments_schema", 0, id="as-enum"),
    pytest.param(
        [call("c", '{"region":"apac","refund":true}'), output("c")],
        {},
        None,
        "arguments_schema",
        0,
        id="as-additional",
    ),
    pytest.param([call("c", "{}"), output("c")], {}, None, "arguments_schema", 0, id="as-required"),
    pytest.param(
        [call("c", '"apac"'), output("c")], {}, None, "arguments_schema", 0, id="as-not-object"
    ),
    pytest.param([call("c"), output("c")], {}, None, None, None, id="ok"),
    pytest.param(
        [message("hi"), call("c"), message("x"), output("c"), message("bye")],
        {},
        None,
        None,
        None,
        id="ok-between-messages",
    ),
    pytest.param(
        [call("c", '{ "region" : "apac" }\n'), output("c")],
        {},
        None,
        None,
        None,
        id="ok-whitespace-around-value",
    ),
    pytest.param([output("c")], {}, Ledger(chain=[call("c")]), None, None, id="ok-upstream-call"),
    pytest.param(
        [ref("fc_c"), output("c")],
        {},
        Ledger(stored={"fc_c": call("c")}),
        None,
        None,
        id="ok-item-reference",
    ),
    pytest.param(
        [{"id": "fc_c"}, output("c")],
        {},
        Ledger(stored={"fc_c": call("c")}),
        None,
        None,
        id="ok-bare-id-reference",
    ),
    pytest.param(
        [ref("fc_c"), output("c")],
        {},
        Ledger(stored={"fc_c": call("c", GLOBAL)}),
        "arguments_schema",
        0,
        id="as-through-item-reference",
    ),
    pytest.param(
        [output("c")],
        {},
        Ledger(chain=[call("c", status="incomplete")]),
        "status",
        None,
        id="status-upstream-call",
    ),
]


@pytest.mark.parametrize(("input_items", "settings", "ledger", "reason", "paired_index"), REASONS)
def test_reason(
    input_items: list[Any],
    settings: dict[str, Any],
    ledger: Ledger | None,
    reason: str | None,
    paired_index: int | None,
) -> None:
    policy = Policy(**settings)
    body = request(*input_items)
    verdict = inspect(body, policy) if ledger is None else inspect(body, policy, ledger)
    if reason is None:
        assert verdict == Verdict("forward")
        return
    found = only(verdict)
    assert found["reason"] == reason
    assert found["index"] == next(i for i, item in enumerate(input_items) if items.is_output(item))
    assert found["paired_index"] == paired_index
    assert verdict.outcome == "block"


def typeless(item: dict[str, Any]) -> dict[str, Any]:
    return without(item, "type")


# Items as a lenient server reads them (the spec's defaults), and item-level findings:
# (input items, policy settings, ledger, every finding as (index, reason)).
CLASSIFIED = [
    # A typeless item with `call_id` and `output` is a function_call_output.
    pytest.param(
        [call("c", GLOBAL), typeless(output("c"))],
        {},
        None,
        [(1, "arguments_schema")],
        id="typeless-output-gated",
    ),
    pytest.param(
        [call("c", GLOBAL), output("c") | {"type": None}],
        {},
        None,
        [(1, "arguments_schema")],
        id="null-type-output-gated",
    ),
    pytest.param([typeless(output("c"))], {}, None, [(0, "orphan")], id="typeless-output-orphan"),
    pytest.param(
        [call("c", GLOBAL), output("c") | {"type": ""}],
        {},
        None,
        [(1, "arguments_schema")],
        id="empty-type-output-gated",
    ),
    pytest.param(
        [call("c", GLOBAL), output("c") | {"type": False}],
        {},
        None,
        [(1, "arguments_schema")],
        id="false-type-output-gated",
    ),
    pytest.param(
        [without(call("c", type=""), "id"), output("c")],
        {},
        None,
        [(1, "not_function_call")],
        id="empty-type-call",
    ),
    pytest.param(
        [call("c"), typeless(output("c")), typeless(output("c"))],
        {},
        None,
        [(1, "duplicate_call_id"), (2, "duplicate_call_id")],
        id="typeless-outputs-duplicate",
    ),
    pytest.param([call("c"), typeless(output("c"))], {}, None, [], id="typeless-output-ok"),
    # A typeless call pairs (and counts for duplicate_call_id) but must say it is one.
    pytest.param(
        [call("c"), typeless(without(call("c", GLOBAL), "id")), output("c")],
        {},
        None,
        [(2, "duplicate_call_id")],
        id="typeless-call-beside-a-good-one",
    ),
    pytest.param(
        [call("c"), {"call_id": "c", "name": "get_latest_sales_report"}, output("c")],
        {},
        None,
        [(2, "duplicate_call_id")],
        id="typeless-call-without-arguments-beside-a-good-one",
    ),
    # Several readings: the gate cannot know which one the upstream takes.
    pytest.param(
        [call("c"), typeless(call("c", GLOBAL)), output("c")],
        {},
        None,
        [(1, "ambiguous_item"), (2, "duplicate_call_id")],
        id="typeless-call-with-id-beside-a-good-one",
    ),
    pytest.param(
        [typeless(call("c", GLOBAL)), output("c")],
        {},
        Ledger(stored={"fc_c": call("c")}),
        [(0, "ambiguous_item"), (1, "namespaced")],
        id="typeless-call-or-reference",
    ),
    pytest.param(
        [call("c", GLOBAL), message("hi") | {"call_id": "c", "output": "x"}],
        {},
        None,
        [(1, "ambiguous_item")],
        id="message-or-output",
    ),
    pytest.param(
        [call("c", GLOBAL) | {"type": None, "output": "x"}],
        {},
        None,
        [(0, "ambiguous_item")],
        id="call-or-output",
    ),
    pytest.param(
        [message("hi") | {"id": "msg_1"}],
        {},
        Ledger(stored={"msg_1": call("c")}),
        [(0, "ambiguous_item")],
        id="message-or-reference",
    ),
    pytest.param(
        [{"role": "tool", "call_id": "c", "output": "x"}],
        {},
        None,
        [(0, "envelope"), (0, "ambiguous_item")],
        id="envelope-and-ambiguous",
    ),
    pytest.param(
        [message("hi"), {"summary": [], "encrypted_content": None}],
        {},
        None,
        [(1, "ambiguous_item")],
        id="reasoning-or-compaction",
    ),
    pytest.param(
        [message("hi"), {"id": "rs_1", "summary": []}],
        {},
        Ledger(stored={"rs_1": {"type": "reasoning", "id": "rs_1"}}),
        [(1, "ambiguous_item")],
        id="reasoning-or-reference",
    ),
    pytest.param(
        [message("hi"), {"summary": []}, {"content": "x"}, {"foo": 1}, {}],
        {},
        None,
        [],
        id="one-reading-or-none-pass",
    ),
    # item_reference: to nothing the proxy relayed, it is a finding of its own.
    pytest.param([ref("fco_1")], {}, None, [(0, "unknown_reference")], id="unknown-ref"),
    pytest.param([{"id": "fco_1"}], {}, None, [(0, "unknown_reference")], id="unknown-bare-id"),
    pytest.param(
        [{"type": None, "id": "fco_1"}], {}, None, [(0, "unknown_reference")], id="unknown-null"
    ),
    pytest.param(
        [{"type": "item_reference", "id": 5}], {}, None, [(0, "unknown_reference")], id="id-num"
    ),
    pytest.param(
        [{"type": "item_reference"}], {}, None, [(0, "unknown_reference")], id="ref-without-id"
    ),
    pytest.param(
        [ref("fc_c"), output("c")],
        {},
        None,
        [(0, "unknown_reference"), (1, "orphan")],
        id="unknown-ref-orphans-its-output",
    ),
    pytest.param(
        [ref("fc_c"), output("c")],
        {"actions": {"unknown_reference": "log"}},
        None,
        [(0, "unknown_reference"), (1, "orphan")],
        id="unknown-ref-logged-output-still-orphan",
    ),
    pytest.param(
        [ref("fco_1")],
        {},
        Ledger(trust_unpaired=True),
        [(0, "unknown_reference")],
        id="unknown-ref-not-waived-by-fail-open",
    ),
    pytest.param(
        [ref("msg_1"), message("hi")],
        {},
        Ledger(stored={"msg_1": {"type": "message", "id": "msg_1", "role": "assistant"}}),
        [],
        id="known-ref-to-a-message",
    ),
    # Provenance compares status too.
    pytest.param(
        [call("c"), output("c")],
        {"require_provenance": True},
        Ledger(emitted=[call("c", status="incomplete")]),
        [(1, "provenance")],
        id="provenance-emitted-incomplete-replayed-completed",
    ),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {"require_provenance": True},
        Ledger(emitted=[call("c")]),
        [],
        id="provenance-status-missing-emitted-completed",
    ),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {"require_provenance": True},
        Ledger(emitted=[call("c", status="incomplete")]),
        [(1, "status")],
        id="provenance-status-missing-emitted-incomplete",
    ),
    # A call replayed without status: the status the proxy relayed it with, if it did.
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {},
        Ledger(emitted=[call("c")]),
        [],
        id="status-missing-relayed-completed",
    ),
    pytest.param(
        [without(call("c", id=None), "status", "id"), output("c")],
        {},
        Ledger(emitted=[call("c")]),
        [],
        id="status-and-id-missing-relayed-completed",
    ),
    pytest.param(
        [call("c", status=None), output("c")],
        {},
        Ledger(emitted=[call("c")]),
        [],
        id="status-null-relayed-completed",
    ),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {},
        Ledger(emitted=[call("c", status="incomplete")]),
        [(1, "status")],
        id="status-missing-relayed-incomplete",
    ),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {"allow_missing_status": True},
        Ledger(emitted=[call("c", status="incomplete")]),
        [(1, "status")],
        id="status-missing-relayed-incomplete-not-allowed",
    ),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {},
        Ledger(emitted=[call("c"), call("c", status="incomplete")]),
        [(1, "status")],
        id="status-missing-relayed-twice-differently",
    ),
    pytest.param(
        [without(call("c", '{"region":"emea"}'), "status"), output("c")],
        {},
        Ledger(emitted=[call("c")]),
        [(1, "status")],
        id="status-missing-relayed-other-arguments",
    ),
    pytest.param(
        [without(call("c", name="lookup"), "status"), output("c")],
        {},
        Ledger(emitted=[call("c")]),
        [(1, "status")],
        id="status-missing-relayed-other-name",
    ),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {},
        Ledger(emitted=[call("other")]),
        [(1, "status")],
        id="status-missing-relayed-other-call-id",
    ),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {},
        Ledger(emitted=[without(call("c"), "status")]),
        [(1, "status")],
        id="status-missing-relayed-without-status",
    ),
    pytest.param(
        [without(call("c"), "status"), output("c")],
        {"allow_missing_status": True},
        Ledger(emitted=[without(call("c"), "status")]),
        [],
        id="status-missing-relayed-without-status-allowed",
    ),
    pytest.param(
        [call("c", status="in_progress"), output("c")],
        {},
        Ledger(emitted=[call("c")]),
        [(1, "status")],
        id="status-given-is-judged-as-given",
    ),
    pytest.param(
        [without(call("c", GLOBAL), "status"), output("c")],
        {},
        Ledger(emitted=[call("c", GLOBAL)]),
        [(1, "arguments_schema")],
        id="status-from-record-then-schema",
    ),
]


@pytest.mark.parametrize(("input_items", "settings", "ledger", "expected"), CLASSIFIED)
def test_items_are_read_as_a_lenient_server_reads_them(
    input_items: list[Any],
    settings: dict[str, Any],
    ledger: Ledger | None,
    expected: list[tuple[int, str]],
) -> None:
    policy = Policy(**settings)
    body = request(*input_items)
    verdict = inspect(body, policy) if ledger is None else inspect(body, policy, ledger)
    assert [(f.index, f.reason) for f in verdict.findings] == expected
    assert (verdict.outcome == "block") == any(f.action == "block" for f in verdict.findings)


def test_unknown_reference_names_its_id() -> None:
    verdict = inspect(request(message("hi"), ref("fco_1")), Policy())
    assert only(verdict) == {
        "index": 1,
        "call_id": None,
        "paired_index": None,
        "name": None,
        "reason": "unknown_reference",
        "id": "fco_1",
    }
    assert rejection(verdict)["error"]["message"] == (
        "input[1]: item_reference fco_1 names no item the proxy relayed: unknown_reference"
    )


@pytest.mark.parametrize(
    ("input_items", "forwarded"),
    [
        pytest.param([message("a"), ref("fco_1"), message("b")], [0, 2], id="unknown-reference"),
        pytest.param(
            [call("c"), output("c"), message("hi") | {"id": "msg_1"}], [0, 1], id="ambiguous"
        ),
        pytest.param(
            [typeless(call("c")), output("c"), message("m")], [2], id="ambiguous-takes-its-output"
        ),
    ],
)
def test_strip_removes_an_item_level_finding(input_items: list[Any], forwarded: list[int]) -> None:
    verdict = inspect(request(*input_items), Policy(action="strip"))
    assert verdict.outcome == "strip"
    assert verdict.input is not None
    assert [id(item) for item in verdict.input] == [id(input_items[i]) for i in forwarded]
    assert inspect(request(*verdict.input), Policy(action="strip")).findings == ()


def test_provenance_is_asked_about_the_paired_call() -> None:
    paired = call("c")
    ledger = Ledger(emitted=[paired])
    verdict = inspect(request(paired, output("c")), Policy(require_provenance=True), ledger)
    assert verdict.outcome == "forward"
    assert ledger.asked == [paired]


def test_duplicate_outputs_are_each_a_finding() -> None:
    verdict = inspect(request(call("c"), output("c"), output("c")), Policy())
    assert [(f.index, f.reason, f.paired_index) for f in verdict.findings] == [
        (1, "duplicate_call_id", 0),
        (2, "duplicate_call_id", 0),
    ]


def test_finding_names_the_call() -> None:
    verdict = inspect(
        request(message("hi"), call("call_129", GLOBAL), output("call_129")), Policy()
    )
    assert only(verdict) == {
        "index": 2,
        "call_id": "call_129",
        "paired_index": 1,
        "name": "get_latest_sales_report",
        "reason": "arguments_schema",
        "fail": [{"path": "/region", "reason": "enum"}],
    }


@pytest.mark.parametrize(
    ("include", "expected"),
    [
        pytest.param(False, None, id="without"),
        pytest.param(True, GLOBAL, id="with"),
    ],
)
def test_finding_arguments_only_on_request(include: bool, expected: str | None) -> None:
    verdict = inspect(request(call("c", GLOBAL), output("c")), Policy())
    [finding] = verdict.findings
    assert finding.as_dict(include_arguments=include).get("arguments") == expected


# The first failing check wins: each row fails the expected reason and every later one.
ORDER = [
    pytest.param(
        [output("c"), call("c", {"x": 1}, type="acme:x", status="in_progress")],
        {"require_provenance": True},
        "orphan",
        id="orphan-first",
    ),
    pytest.param(
        [call("c", type="acme:x"), call("c", type="acme:x"), output("c")],
        {"require_provenance": True},
        "duplicate_call_id",
        id="duplicate-before-provenance",
    ),
    pytest.param(
        [call("c", {"x": 1}, type="acme:x", status="in_progress"), output("c")],
        {"require_provenance": True},
        "provenance",
        id="provenance-before-namespaced",
    ),
    pytest.param(
        [call("c", {"x": 1}, type="acme:x", status="in_progress"), output("c")],
        {},
        "namespaced",
        id="namespaced-before-status",
    ),
    pytest.param(
        [message("hi") | {"type": "message", "call_id": "c", "arguments": 5}, output("c")],
        {},
        "not_function_call",
        id="not-function-call-before-status",
    ),
    pytest.param(
        [call("c", {"x": 1}, name="nope", status="in_progress"), output("c")],
        {},
        "status",
        id="status-before-arguments-type",
    ),
    pytest.param(
        [call("c", {"x": 1}, name="nope"), output("c")],
        {},
        "arguments_type",
        id="arguments-type-before-unknown-tool",
    ),
    pytest.param(
        [call("c", "{nope", name="nope"), output("c")],
        {},
        "arguments_parse",
        id="arguments-parse-before-unknown-tool",
    ),
    pytest.param(
        [call("c", '{"region":1,"region":2}'), output("c")],
        {},
        "arguments_parse",
        id="arguments-parse-before-schema",
    ),
    pytest.param(
        [call("c", '{"region":"global"}', name="nope"), output("c")],
        {},
        "unknown_tool",
        id="unknown-tool-before-schema",
    ),
]


@pytest.mark.parametrize(("input_items", "settings", "reason"), ORDER)
def test_first_failing_check_wins(
    input_items: list[Any], settings: dict[str, Any], reason: str
) -> None:
    verdict = inspect(request(*input_items), Policy(**settings), Ledger())
    assert {f.reason for f in verdict.findings} == {reason}


# Schemas: where they come from and what they mean.
REFS = {
    "type": "object",
    "$defs": {"region": {"type": "string", "enum": ["apac", "emea", "amer"]}},
    "properties": {"region": {"$ref": "#/$defs/region"}},
    "required": ["region"],
}
DRAFT_07_REF_SIBLINGS = {
    "$schema": DRAFT_07,
    "definitions": {"any_object": {"type": "object"}},
    # Draft-07 ignores keywords beside `$ref`; Draft 2020-12 would apply `required`.
    "$ref": "#/definitions/any_object",
    "required": ["region"],
}
DRAFT_07_TUPLE = {
    "$schema": DRAFT_07,
    "type": "object",
    "properties": {
        "pair": {"type": "array", "items": [{"type": "string"}], "additionalItems": False}
    },
}
CHAT_SHAPE_TOOL = {"type": "function", "function": {"name": "lookup", "parameters": REFS}}

SCHEMAS = [
    pytest.param([tool(REFS)], {}, APAC, [], id="ref-ok"),
    pytest.param([tool(REFS)], {}, GLOBAL, [("/region", "enum")], id="ref-enum"),
    pytest.param(
        [tool(REFS)], {}, '{"region":7}', [("/region", "enum"), ("/region", "type")], id="ref-type"
    ),
    pytest.param([tool(DRAFT_07_REF_SIBLINGS)], {}, "{}", [], id="draft-07-ref-siblings-ignored"),
    pytest.param(
        [tool(DRAFT_07_REF_SIBLINGS | {"$schema": "https://json-schema.org/draft/2020-12/schema"})],
        {},
        "{}",
        [("/region", "required")],
        id="draft-2020-12-ref-siblings-apply",
    ),
    pytest.param([tool(DRAFT_07_TUPLE)], {}, '{"pair":["a"]}', [], id="draft-07-items-array-ok"),
    pytest.param(
        [tool(DRAFT_07_TUPLE)],
        {},
        '{"pair":["a","b"]}',
        [("/pair", "additionalItems")],
        id="draft-07-additional-items",
    ),
    pytest.param(
        [tool({"type": "object", "properties": {"a/b": {"const": 1}, "m~n": {"const": 1}}})],
        {},
        '{"a/b":2,"m~n":2}',
        [("/a~1b", "const"), ("/m~0n", "const")],
        id="pointer-escapes",
    ),
    pytest.param(
        [tool({"type": "object", "properties": {"list": {"items": {"type": "integer"}}}})],
        {},
        '{"list":[1,"x",3]}',
        [("/list/1", "type")],
        id="pointer-into-array",
    ),
    pytest.param([tool(SALES)], {"get_latest_sales_report": {}}, GLOBAL, [], id="pinned-looser"),
    pytest.param(
        [tool({})],
        {"get_latest_sales_report": SALES},
        GLOBAL,
        [("/region", "enum")],
        id="pinned-stricter",
    ),
    pytest.param(
        [], {"get_latest_sales_report": SALES}, APAC, [], id="pinned-without-request-tools"
    ),
    pytest.param(
        [tool(SALES), tool({"type": "object", "maxProperties": 0})],
        {},
        APAC,
        [("", "maxProperties")],
        id="same-name-twice-both-apply",
    ),
    pytest.param(
        [{"type": "function", "name": "get_latest_sales_report"}],
        {},
        '[1, "anything"]',
        [],
        id="no-parameters-any-json",
    ),
    pytest.param(
        [{"type": "function", "name": "get_latest_sales_report", "parameters": None}],
        {},
        "null",
        [],
        id="null-parameters-any-json",
    ),
    pytest.param([tool({"type": 12})], {}, APAC, [("", "invalid_schema")], id="invalid-schema"),
    pytest.param([tool({"$schema": 5})], {}, APAC, [("", "invalid_schema")], id="schema-not-str"),
    pytest.param([tool({"$schema": []})], {}, APAC, [("", "invalid_schema")], id="schema-list"),
    pytest.param([tool(12)], {}, APAC, [("", "invalid_schema")], id="schema-a-number"),
    pytest.param(
        [tool({"$ref": "#/$defs/missing"})], {}, APAC, [("", "schema_unusable")], id="dangling-ref"
    ),
    pytest.param(
        [tool({"$ref": "urn:example:nowhere"})], {}, APAC, [("", "schema_unusable")], id="urn-ref"
    ),
    pytest.param(
        # ECMA-262 named group syntax, which Python's `re` cannot compile: a valid pattern.
        [tool({"properties": {"region": {"pattern": "^(?<x>a)$"}}})],
        {},
        APAC,
        [("/region", "pattern")],
        id="ecma-only-pattern-valid",
    ),
    pytest.param(
        # Python's named group syntax, which ECMA-262 does not have.
        [tool({"properties": {"region": {"pattern": "^(?P<x>a)$"}}})],
        {},
        APAC,
        [("", "invalid_schema")],
        id="python-only-pattern-invalid",
    ),
]


@pytest.mark.parametrize(("tools", "pinned", "arguments", "fail"), SCHEMAS)
def test_schema(
    tools: list[Any], pinned: dict[str, Any], arguments: str, fail: list[tuple[str, str]]
) -> None:
    verdict = inspect(request(call("c", arguments), output("c"), tools=tools), Policy(tools=pinned))
    if not fail:
        assert verdict == Verdict("forward")
        return
    found = only(verdict)
    assert found["reason"] == "arguments_schema"
    assert sorted((v["path"], v["reason"]) for v in found["fail"]) == sorted(fail)


def test_chat_completions_tool_shape_is_read() -> None:
    body = request(call("c", GLOBAL, name="lookup"), output("c"), tools=[CHAT_SHAPE_TOOL])
    assert only(inspect(body, Policy()))["fail"] == [{"path": "/region", "reason": "enum"}]


@pytest.fixture
def schema_server() -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server that serves a permissive schema and records every request."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            data = b"{}"
            self.send_response(200)
            self.send_header("content-type", "application/schema+json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_remote_ref_is_never_fetched(schema_server: tuple[str, list[str]]) -> None:
    base, seen = schema_server
    schema = {"type": "object", "properties": {"region": {"$ref": f"{base}/region.json"}}}
    body = request(call("c"), output("c"), tools=[tool(schema)])
    assert only(inspect(body, Policy()))["fail"] == [{"path": "", "reason": "schema_unusable"}]
    assert seen == []


# Request-level: Chat Completions envelopes inside `input`.
ENVELOPES = [
    pytest.param(
        [call("c"), {"role": "tool", "tool_call_id": "c", "content": "x"}],
        1,
        "c",
        id="role-tool",
    ),
    pytest.param(
        [{"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}, message("hi")],
        0,
        None,
        id="tool-calls",
    ),
    pytest.param([message("hi"), {"role": "tool", "content": "x"}], 1, None, id="role-tool-no-id"),
    pytest.param(
        [call("c"), output("c") | {"tool_call_id": "c"}], 1, "c", id="tool-call-id-on-output"
    ),
    pytest.param([message("hi") | {"tool_call_id": 7}], 0, None, id="tool-call-id-number"),
    pytest.param(
        [call("c", tool_calls=[]), output("c")], 0, None, id="tool-calls-on-function-call"
    ),
]


@pytest.mark.parametrize(("input_items", "index", "call_id"), ENVELOPES)
def test_envelope(input_items: list[Any], index: int, call_id: str | None) -> None:
    verdict = inspect(request(*input_items), Policy())
    assert only(verdict) == {
        "index": index,
        "call_id": call_id,
        "paired_index": None,
        "name": None,
        "reason": "envelope",
    }
    assert verdict.outcome == "block"


def test_envelope_does_not_hide_a_failing_call() -> None:
    # Logging envelopes must not let an output carrying `tool_call_id` skip the replay gate.
    body = request(call("c", GLOBAL), output("c") | {"tool_call_id": "c"})
    verdict = inspect(body, Policy(actions={"envelope": "log"}))
    assert verdict.outcome == "block"
    assert [(f.index, f.reason, f.action) for f in verdict.findings] == [
        (1, "envelope", "log"),
        (1, "arguments_schema", "block"),
    ]


NOT_REQUESTS = [
    pytest.param(None, id="null"),
    pytest.param([output("c")], id="array"),
    pytest.param("text", id="string"),
    pytest.param({}, id="no-input"),
    pytest.param({"input": "one user message"}, id="string-input"),
    pytest.param({"input": {"type": "function_call_output"}}, id="object-input"),
    pytest.param({"input": None}, id="null-input"),
    pytest.param({"input": []}, id="empty-input"),
    pytest.param({"input": [None, 1, "x", [], {}]}, id="junk-items"),
]


@pytest.mark.parametrize("body", NOT_REQUESTS)
def test_nothing_to_gate_is_forwarded(body: Any) -> None:
    assert inspect(body, Policy()) == Verdict("forward")


# Actions. BAD_PAIR fails the gate; the other items are fine.
HISTORY = [
    message("sales?"),
    call("ok"),
    output("ok"),
    call("bad", GLOBAL),
    message("thinking"),
    output("bad"),
    message("done"),
]


@pytest.mark.parametrize(
    ("settings", "outcome", "action", "forwarded"),
    [
        pytest.param({"action": "block"}, "block", "block", None, id="block"),
        pytest.param(
            {"action": "strip"}, "strip", "strip", [0, 1, 2, 4, 6], id="strip-removes-the-pair"
        ),
        pytest.param({"action": "log"}, "forward", "log", None, id="log"),
        pytest.param(
            {"action": "block", "actions": {"arguments_schema": "log"}},
            "forward",
            "log",
            None,
            id="override-log",
        ),
        pytest.param(
            {"action": "log", "actions": {"arguments_schema": "strip"}},
            "strip",
            "strip",
            [0, 1, 2, 4, 6],
            id="override-strip",
        ),
        pytest.param(
            {"action": "strip", "actions": {"arguments_schema": "block"}},
            "block",
            "block",
            None,
            id="override-block",
        ),
        pytest.param(
            {"action": "block", "actions": {"orphan": "log", "status": "strip"}},
            "block",
            "block",
            None,
            id="override-other-reason-unused",
        ),
    ],
)
def test_action(
    settings: dict[str, Any], outcome: str, action: str, forwarded: list[int] | None
) -> None:
    verdict = inspect(request(*HISTORY), Policy(**settings))
    assert verdict.outcome == outcome
    assert [(f.index, f.reason, f.action) for f in verdict.findings] == [
        (5, "arguments_schema", action)
    ]
    if forwarded is None:
        assert verdict.input is None
    else:
        assert verdict.input is not None
        # The same items, in order: nothing but the pair is touched.
        assert [id(item) for item in verdict.input] == [id(HISTORY[i]) for i in forwarded]


@pytest.mark.parametrize(
    ("actions", "outcome", "header"),
    [
        pytest.param({"orphan": "strip", "status": "block"}, "block", None, id="block-beats-strip"),
        pytest.param({"orphan": "block", "status": "strip"}, "block", None, id="strip-loses"),
        pytest.param({"orphan": "log", "status": "block"}, "block", None, id="block-beats-log"),
        pytest.param(
            {"orphan": "log", "status": "strip"}, "strip", "stripped=1, logged=1", id="strip-log"
        ),
        pytest.param({"orphan": "strip", "status": "strip"}, "strip", "stripped=2", id="strip-2"),
        pytest.param({"orphan": "log", "status": "log"}, "forward", "logged=2", id="log-2"),
    ],
)
def test_two_findings_one_outcome(
    actions: dict[str, Any], outcome: str, header: str | None
) -> None:
    body = request(output("lost"), call("c", status="in_progress"), output("c"), message("next"))
    verdict = inspect(body, Policy(actions=actions))
    assert verdict.outcome == outcome
    assert {f.reason: f.action for f in verdict.findings} == actions
    if outcome == "block":
        assert verdict.input is None
    else:
        assert verdict.header() == header


def history_errors(input_items: Sequence[Any]) -> list[str]:
    """What would make a provider reject the history: dangling outputs or calls."""
    errors = []
    calls: dict[str, int] = {}
    answered: set[str] = set()
    for index, item in enumerate(input_items):
        if items.is_output(item):
            call_id = item["call_id"]
            if call_id not in calls:
                errors.append(f"input[{index}]: output without its call")
            answered.add(call_id)
        elif items.kind(item) == items.FUNCTION_CALL:
            calls[item["call_id"]] = index
    errors.extend(f"input[{i}]: call without output" for c, i in calls.items() if c not in answered)
    return errors


# (input, settings, indexes of the forwarded input)
STRIPS = [
    pytest.param(HISTORY, {}, [0, 1, 2, 4, 6], id="pair-in-the-middle"),
    pytest.param([message("a"), output("lost")], {}, [0], id="orphan-output-only"),
    pytest.param([output("c"), call("c")], {}, [], id="output-before-call-takes-the-call"),
    pytest.param([call("c"), output("c"), output("c")], {}, [], id="duplicate-outputs"),
    pytest.param([call("c"), call("c"), output("c")], {}, [], id="duplicate-calls"),
    pytest.param(
        [call("a"), call("b", GLOBAL), output("a"), output("b")],
        {},
        [0, 2],
        id="parallel-calls",
    ),
    pytest.param(
        [call("a", GLOBAL), call("b", GLOBAL), output("a"), output("b"), message("m")],
        {},
        [4],
        id="parallel-calls-both-fail",
    ),
    pytest.param(
        [call("a"), output("a"), {"role": "tool", "tool_call_id": "a", "content": "x"}],
        {},
        [0, 1],
        id="envelope-item-only",
    ),
    pytest.param(
        [call("a"), output("a") | {"tool_call_id": "a"}, message("m")],
        {},
        [2],
        id="envelope-output-takes-its-call",
    ),
    pytest.param(
        [call("a", GLOBAL), output("a"), call("b", status="in_progress"), output("b")],
        {"actions": {"status": "log"}},
        [2, 3],
        id="logged-pair-stays",
    ),
    pytest.param(
        [ref("fc_a"), output("a"), message("m")],
        {},
        [2],
        id="reference-removed-with-output",
    ),
    pytest.param(
        [call("a"), output("a"), call("a", GLOBAL), output("a")],
        {},
        [],
        id="reused-call-id",
    ),
]


@pytest.mark.parametrize(("input_items", "settings", "forwarded"), STRIPS)
def test_strip_keeps_history_valid(
    input_items: list[Any], settings: dict[str, Any], forwarded: list[int]
) -> None:
    ledger = Ledger(stored={"fc_a": call("a", GLOBAL)})
    verdict = inspect(request(*input_items), Policy(action="strip", **settings), ledger)
    assert verdict.outcome == "strip"
    assert verdict.input is not None
    assert [id(item) for item in verdict.input] == [id(input_items[i]) for i in forwarded]
    assert history_errors(verdict.input) == []
    again = inspect(request(*verdict.input), Policy(action="strip", **settings), ledger)
    assert again.outcome == "forward"
    assert [f.action for f in again.findings] == [
        f.action for f in verdict.findings if f.action == "log"
    ]


@pytest.mark.parametrize(
    ("input_items", "ledger"),
    [
        pytest.param(
            [output("c")], Ledger(chain=[call("c", GLOBAL)]), id="call-in-previous-response"
        ),
        pytest.param(
            [call("c"), output("c")],
            Ledger(chain=[call("c", GLOBAL)]),
            id="duplicate-one-upstream",
        ),
    ],
)
def test_strip_escalates_when_the_call_lives_upstream(
    input_items: list[Any], ledger: Ledger
) -> None:
    body = request(*input_items, previous_response_id="resp_1")
    verdict = inspect(body, Policy(action="strip"), ledger)
    assert verdict.outcome == "block"
    assert [f.action for f in verdict.findings] == ["block"]
    assert verdict.input is None


def test_strip_escalation_blocks_the_whole_request() -> None:
    body = request(call("a", GLOBAL), output("a"), output("up"), previous_response_id="resp_1")
    verdict = inspect(body, Policy(action="strip"), Ledger(chain=[call("up", GLOBAL)]))
    assert verdict.outcome == "block"
    assert [(f.index, f.action) for f in verdict.findings] == [(1, "strip"), (2, "block")]


@pytest.mark.parametrize(
    ("settings", "header"),
    [
        pytest.param({"action": "block"}, None, id="clean"),
        pytest.param({"action": "log"}, "logged=2", id="logged"),
        pytest.param({"action": "strip"}, "stripped=2", id="stripped"),
        pytest.param(
            {"action": "strip", "actions": {"status": "log"}}, "stripped=1, logged=1", id="both"
        ),
    ],
)
def test_header(settings: dict[str, Any], header: str | None) -> None:
    failing = [call("a", GLOBAL), output("a"), call("b", status="incomplete"), output("b")]
    clean = [call("a"), output("a")]
    input_items = clean if header is None else failing
    verdict = inspect(request(*input_items), Policy(**settings))
    assert verdict.outcome != "block"
    assert verdict.header() == header


def test_rejection_matches_the_design_example() -> None:
    body = request(
        message("latest global sales?"),
        call("call_123"),
        output("call_123"),
        call("call_129", GLOBAL, id="fc_009"),
        output("call_129"),
    )
    assert rejection(inspect(body, Policy())) == {
        "error": {
            "type": "invalid_request_error",
            "code": "replay_rejected",
            "param": "input[4]",
            "message": (
                "input[4] (call_id call_129): paired function_call failed the replay gate: "
                "arguments_schema at /region (enum)"
            ),
            "findings": [
                {
                    "index": 4,
                    "call_id": "call_129",
                    "paired_index": 3,
                    "name": "get_latest_sales_report",
                    "reason": "arguments_schema",
                    "fail": [{"path": "/region", "reason": "enum"}],
                }
            ],
        }
    }


@pytest.mark.parametrize(
    ("input_items", "actions", "param", "message"),
    [
        pytest.param(
            [output("lost"), call("c", status="in_progress"), output("c")],
            {"orphan": "log"},
            "input[2]",
            "input[2] (call_id c): paired function_call failed the replay gate: status"
            " (and 1 more finding)",
            id="first-blocking-finding-named",
        ),
        pytest.param(
            [output("a"), output("b"), output("c")],
            {},
            "input[0]",
            "input[0] (call_id a): no function_call with this call_id precedes it: orphan"
            " (and 2 more findings)",
            id="orphans",
        ),
        pytest.param(
            [{"role": "tool", "tool_call_id": "x", "content": "y"}],
            {},
            "input[0]",
            "input[0] (call_id x): a Chat Completions message inside input: envelope",
            id="envelope",
        ),
    ],
)
def test_rejection_names_the_first_blocking_finding(
    input_items: list[Any], actions: dict[str, Any], param: str, message: str
) -> None:
    verdict = inspect(request(*input_items), Policy(actions=actions))
    assert verdict.outcome == "block"
    error = rejection(verdict)["error"]
    assert error["param"] == param
    assert error["message"] == message
    assert len(error["findings"]) == len(verdict.findings)
    assert "arguments" not in json.dumps(error["findings"])


# Caches.
class CountingValidator:
    """A real validator that counts the instances it is asked to validate."""

    def __init__(self, inner: Validator, seen: list[Any]) -> None:
        self.inner = inner
        self.seen = seen

    def iter_errors(self, instance: Any) -> Iterator[ValidationError]:
        self.seen.append(instance)
        return self.inner.iter_errors(instance)


class CountingSchemas(SchemaCache):
    """The request-schema cache, with each compiled schema's validations recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.validated: list[Any] = []
        self.compiled: dict[int, Compiled] = {}

    def compile(self, schema: Any, limits: SchemaLimits | None = None) -> Compiled:
        found = super().compile(schema, limits)
        if found.key not in self.compiled:
            counting = CountingValidator(found.validator, self.validated)
            self.compiled[found.key] = Compiled(
                found.key, cast(Validator, counting), found.patterns
            )
        return self.compiled[found.key]


def counted(max_cached_verdicts: int = 65536) -> tuple[Policy, GateCaches, list[Any]]:
    schemas = CountingSchemas()
    policy = Policy(max_cached_verdicts=max_cached_verdicts)
    return policy, GateCaches.for_policy(policy, schemas), schemas.validated


def test_repeated_call_is_not_revalidated() -> None:
    policy, caches, validated = counted()
    turn_1 = [message("q"), call("a", GLOBAL), output("a")]
    turn_2 = [*turn_1, call("b"), output("b")]
    turn_3 = [*turn_2, call("c", '{"region":"emea"}'), output("c")]
    first = inspect(request(*turn_1), policy, caches=caches)
    inspect(request(*turn_2), policy, caches=caches)
    third = inspect(request(*turn_3), policy, caches=caches)
    assert validated == [{"region": "global"}, {"region": "apac"}, {"region": "emea"}]
    # A remembered failure is still reported in full.
    assert first.findings == third.findings[:1]
    assert only(first)["fail"] == [{"path": "/region", "reason": "enum"}]


def test_identical_call_under_other_call_id_is_not_revalidated() -> None:
    policy, caches, validated = counted()
    inspect(request(call("a"), output("a"), call("b"), output("b")), policy, caches=caches)
    assert validated == [{"region": "apac"}]


@pytest.mark.parametrize(
    ("second_arguments", "second_tools", "validations", "second_reason"),
    [
        pytest.param(APAC, TOOLS, 1, None, id="same-call"),
        pytest.param('{"region":"emea"}', TOOLS, 2, None, id="changed-arguments"),
        pytest.param('{ "region":"apac"}', TOOLS, 2, None, id="changed-whitespace"),
        pytest.param(
            APAC,
            [tool(SALES | {"properties": {"region": {"const": "emea"}}})],
            2,
            "arguments_schema",
            id="changed-schema",
        ),
        pytest.param(
            APAC, [tool(dict(reversed(SALES.items())))], 1, None, id="same-schema-other-key-order"
        ),
        pytest.param(APAC, [], 1, "unknown_tool", id="schema-gone"),
    ],
)
def test_cache_revalidates_what_changed(
    second_arguments: str, second_tools: list[Any], validations: int, second_reason: str | None
) -> None:
    policy, caches, validated = counted()
    inspect(request(call("a"), output("a")), policy, caches=caches)
    verdict = inspect(
        request(call("a", second_arguments), output("a"), tools=second_tools), policy, caches=caches
    )
    assert len(validated) == validations
    assert [f.reason for f in verdict.findings] == ([second_reason] if second_reason else [])


def test_verdict_cache_is_bounded() -> None:
    policy, caches, validated = counted(max_cached_verdicts=2)
    regions = ["apac", "emea", "amer", "apac"]
    for region in regions:
        inspect(
            request(call("c", json.dumps({"region": region})), output("c")), policy, caches=caches
        )
    # apac was forgotten when amer came in, so it is checked again.
    assert [v["region"] for v in validated] == regions
    assert len(caches.verdicts) == 2


def test_pinned_schema_verdict_is_cached() -> None:
    policy = Policy(tools={"get_latest_sales_report": SALES})
    caches = GateCaches.for_policy(policy)
    for _ in range(3):
        verdict = inspect(request(call("a", GLOBAL), output("a"), tools=[]), policy, caches=caches)
        assert only(verdict)["reason"] == "arguments_schema"
    assert len(caches.verdicts) == 1
    assert len(caches.schemas) == 0


def test_each_distinct_request_schema_is_compiled_once() -> None:
    policy = Policy()
    caches = GateCaches.for_policy(policy)
    other = {"type": "object", "required": ["order_id"]}
    bodies = [
        request(call("a"), output("a")),
        request(call("a"), output("a"), tools=[tool(json.loads(json.dumps(SALES)))]),
        request(call("b", name="lookup"), output("b"), tools=[*TOOLS, tool(other, "lookup")]),
        request(call("c", "{}", name="lookup"), output("c"), tools=[tool(other, "lookup")]),
        request(call("d"), output("d"), tools=[tool({"type": 12})]),
        request(call("d", "[]"), output("d"), tools=[tool({"type": 12})]),
    ]
    for body in bodies:
        inspect(body, policy, caches=caches)
    assert len(caches.schemas) == 3


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        pytest.param({"action": "blok"}, "action", id="bad-action"),
        pytest.param({"actions": {"orphn": "block"}}, "actions.orphn", id="unknown-reason"),
        pytest.param({"actions": {"orphan": "allow"}}, "actions.orphan", id="bad-override"),
        pytest.param({"tools": {"t": {"type": 12}}}, "tools.t", id="invalid-pinned-schema"),
        pytest.param({"tools": {"t": {"$schema": 7}}}, "tools.t", id="pinned-schema-not-str"),
    ],
)
def test_policy_names_the_bad_setting(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=rf"^{message}: "):
        Policy(**settings)
