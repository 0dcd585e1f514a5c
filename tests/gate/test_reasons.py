"""Every reason the gate gives, one row a case, through `inspect`."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.gate import items
from proxy.gate.policy import Policy
from proxy.gate.reasons import Outcome
from proxy.gate.verdict import Verdict, inspect
from tests.builders import APAC, GLOBAL, call, message, only, output, ref, request, without
from tests.gate.ledger_double import Ledger

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
    # A name that is not a string breaks the spec's item schema before any tool is looked up.
    pytest.param([call("c", name=5), output("c")], {}, None, "not_portable", 0, id="np-name-num"),
    pytest.param(
        [call("c", name=None), output("c")], {}, None, "not_portable", 0, id="np-name-null"
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
        assert verdict == Verdict(Outcome.FORWARD)
        return
    found = only(verdict)
    assert found["reason"] == reason
    assert found["index"] == next(i for i, item in enumerate(input_items) if items.is_output(item))
    assert found["paired_index"] == paired_index
    assert verdict.outcome == "block"
