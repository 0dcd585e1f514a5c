"""The item vocabulary: the table matches the openai SDK, and a vendor's vocabulary decides which
kinds are native (a kind outside it is a `foreign_item`)."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from openai.types.responses import response_input_item_param

from proxy.gate.findings import message as sentence
from proxy.gate.policy import Policy
from proxy.gate.verdict import inspect, rejection
from proxy.gate.vocabulary import CORE, OPENAI_KINDS, VOCABULARIES, Role, vocabulary_of
from tests.builders import call, message, output, request
from tests.gate.ledger_double import Ledger


def _literals(annotation: Any) -> list[str]:
    found: list[str] = []
    for arg in typing.get_args(annotation):
        found.extend([arg] if isinstance(arg, str) else _literals(arg))
    return found


def sdk_kinds() -> dict[str, set[str]]:
    """Each `type` of the SDK's union of input items, with the fields its TypedDicts define."""
    kinds: dict[str, set[str]] = {}
    for member in typing.get_args(response_input_item_param.ResponseInputItemParam):
        hints = typing.get_type_hints(member, include_extras=True)
        for item_type in _literals(hints["type"]):
            kinds.setdefault(item_type, set()).update(hints)
    return kinds


def test_the_table_has_every_kind_of_the_sdk() -> None:
    table = {k.type for k in OPENAI_KINDS}
    assert sdk_kinds().keys() - table == set()
    assert len(table) == len(OPENAI_KINDS), "a kind is in the table twice"


@pytest.mark.parametrize("kind", OPENAI_KINDS, ids=lambda k: k.type)
def test_each_kind_names_fields_the_sdk_defines(kind: Any) -> None:
    fields = sdk_kinds()[kind.type]
    for field in (kind.pairs_by, kind.payload, "status" if kind.status else None):
        assert field is None or field in fields
    if kind.role != Role.NEITHER:
        partner = VOCABULARIES["openai"].of(kind.partner)
        assert partner is not None
        assert partner.partner == kind.type
        assert {kind.role, partner.role} == {Role.CALL, Role.OUTPUT}


def test_an_upstream_without_a_known_vendor_keeps_the_core_vocabulary() -> None:
    assert vocabulary_of(None) is CORE
    assert vocabulary_of("acme") is CORE
    assert CORE.native("anything_call")
    assert not VOCABULARIES["openai"].native("anything_call")


def every_sdk_item() -> list[Any]:
    return [pytest.param({"type": t, "id": f"x_{t}"}, id=t) for t in sorted(sdk_kinds())]


@pytest.mark.parametrize("item", every_sdk_item())
def test_every_sdk_kind_is_native_to_openai(item: dict[str, Any]) -> None:
    verdict = inspect(request(message("hi"), item), Policy(vendor="openai"), Ledger())
    assert "foreign_item" not in [f.reason for f in verdict.findings]


OTHER = {"type": "bespoke_call", "call_id": "b1", "query": "apac"}

# (input items, the target's vendor, every finding as (index, reason))
NATIVE = [
    pytest.param([OTHER], None, [], id="no-vendor"),
    pytest.param([OTHER], "acme", [], id="vendor-without-vocabulary"),
    pytest.param([message("hi"), OTHER], "openai", [(1, "foreign_item")], id="openai"),
    pytest.param([{"type": "openai:bespoke_call"}], "openai", [], id="own-slug"),
    pytest.param([call("c"), output("c")], "openai", [], id="function-pair"),
    # Not typed with a string: nothing to judge it by (the item schema does).
    pytest.param([{"type": 5}, {"type": ""}, {"type": None}], "openai", [], id="untyped"),
]


@pytest.mark.parametrize(("input_items", "vendor", "found"), NATIVE)
def test_a_kind_outside_the_vocabulary_is_foreign(
    input_items: list[Any], vendor: str | None, found: list[Any]
) -> None:
    verdict = inspect(request(*input_items), Policy(vendor=vendor), Ledger())
    assert [(f.index, f.reason) for f in verdict.findings] == found


def test_a_foreign_kind_says_so() -> None:
    verdict = inspect(request(message("hi"), OTHER), Policy(vendor="openai"), Ledger())
    [finding] = verdict.findings
    assert sentence(finding) == (
        "bespoke_call is not a kind of item the upstream's vendor speaks: it would be refused or "
        "misread there"
    )
    assert rejection(verdict)["error"]["message"] == (
        "input[1] (call_id b1): bespoke_call is not a kind of item this upstream speaks: "
        "foreign_item"
    )


def test_strip_removes_a_foreign_kind() -> None:
    body = request(message("hi"), OTHER, call("c"), output("c"))
    verdict = inspect(body, Policy(vendor="openai", action="strip"), Ledger())
    assert verdict.outcome == "strip"
    assert verdict.input == [message("hi"), call("c"), output("c")]


def test_the_per_item_maps_hold_the_outputs_and_the_kinds_that_carry_their_result() -> None:
    openai = VOCABULARIES["openai"]
    assert openai.outputs == {k.type: k for k in OPENAI_KINDS if k.role == Role.OUTPUT}
    assert set(openai.ran) == {"mcp_call"}
    assert set(CORE.outputs) == {"function_call_output"}
    assert CORE.ran == {}
    assert openai.output_of("function_call") is None
    assert openai.output_of("custom_tool_call_output") is openai.kinds["custom_tool_call_output"]
