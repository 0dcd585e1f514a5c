"""What the ledger tells the gate: emitted calls and their statuses, and what fail_open waives."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.state.arguments import same_arguments
from proxy.state.ledger import Ledger, LedgerFault
from proxy.state.ledger_view import LedgerView
from proxy.state.recording import RecordedResponse
from proxy.state.stores import MemoryStore
from tests.builders import APAC, sales_call, sales_output

SAME_ARGUMENTS = [
    pytest.param(APAC, APAC, True, id="same-string"),
    pytest.param('{ "region" : "apac" }\n', APAC, True, id="spacing"),
    pytest.param('{"a":1,"b":2}', '{"b":2,"a":1}', True, id="key-order"),
    pytest.param('{"city":"Krak\\u00f3w"}', '{"city":"Kraków"}', True, id="escapes"),
    pytest.param('{"n":[1,2.5,-0,1e3]}', '{"n": [1, 2.5, -0, 1e3]}', True, id="numbers-alike"),
    pytest.param("null", "null", True, id="null"),
    pytest.param(APAC, '{"region":"emea"}', False, id="other-value"),
    pytest.param('{"n":1.0}', '{"n":1}', False, id="number-written-otherwise"),
    pytest.param('{"n":100}', '{"n":100.00000000000000001}', False, id="digits-beyond-a-double"),
    pytest.param('{"n":1}', '{"n":"1"}', False, id="number-or-string"),
    pytest.param('{"n":1}', '{"n":true}', False, id="number-or-bool"),
    pytest.param('{"n":0}', '{"n":false}', False, id="zero-or-false"),
    pytest.param('{"n":null}', "{}", False, id="null-or-absent"),
    pytest.param("[1,2]", "[2,1]", False, id="array-order"),
    pytest.param(APAC, '{"region":"apac","region":"apac"}', False, id="duplicate-key"),
    pytest.param('{"n":NaN}', '{"n": NaN}', False, id="nan"),
    pytest.param(APAC, APAC + " x", False, id="trailing-data"),
    pytest.param(APAC, {"region": "apac"}, False, id="replayed-not-a-string"),
    pytest.param({"region": "apac"}, {"region": "apac"}, True, id="equal-non-strings"),
    pytest.param("[" * 5000 + "]" * 5000, "[" * 5000 + "] " * 5000, False, id="too-deep"),
    # Read as strictjson reads a body: the digits and exponent, not how the exponent is spelt;
    # an integer's value (`-0` is the `0` that JSON.stringify writes); no lone surrogate.
    pytest.param('{"n":[1e3,2.5E-1]}', '{"n":[1E+3,2.5e-01]}', True, id="exponent-spelling"),
    pytest.param('{"n":1.50}', '{"n":1.5}', False, id="trailing-zero"),
    pytest.param('{"n":-0}', '{"n": 0}', True, id="integer-minus-zero"),
    pytest.param('{"n":-0.0}', '{"n": 0.0}', False, id="fraction-minus-zero"),
    pytest.param('{"a":"\\ud800"}', '{ "a": "\\ud800" }', False, id="lone-surrogate"),
    pytest.param('{"n":1' + "0" * 4400 + "}", '{"n": 1' + "0" * 4400 + "}", False, id="huge-int"),
    pytest.param("[" * 900 + "]" * 900, "[" * 900 + "] " * 900, True, id="deep-within-bounds"),
]


@pytest.mark.parametrize(("emitted", "replayed", "same"), SAME_ARGUMENTS)
def test_same_arguments(emitted: Any, replayed: Any, same: bool) -> None:
    assert same_arguments(emitted, replayed) is same
    assert same_arguments(replayed, emitted) is same


def replayed(**changes: Any) -> dict[str, Any]:
    call = {k: v for k, v in sales_call("c").items() if k != "status"}
    return call | changes


EMITTED_STATUSES = [
    pytest.param([sales_call("c")], replayed(), ["completed"], id="emitted-completed"),
    pytest.param(
        [sales_call("c", status="incomplete")], replayed(), ["incomplete"], id="emitted-incomplete"
    ),
    pytest.param(
        [sales_call("c"), sales_call("c", status="incomplete")],
        replayed(),
        ["completed", "incomplete"],
        id="emitted-twice",
    ),
    pytest.param(
        [sales_call("c")],
        replayed(arguments=json.dumps({"region": "apac"}, indent=2)),
        ["completed"],
        id="re-serialised",
    ),
    pytest.param([sales_call("c", "emea")], replayed(), [], id="other-arguments"),
    pytest.param([sales_call("c", name="lookup")], replayed(), [], id="other-name"),
    pytest.param([sales_call("other")], replayed(), [], id="other-call-id"),
    pytest.param([sales_call("c", type="message")], replayed(), [], id="not-a-call"),
    pytest.param([], replayed(), [], id="nothing-emitted"),
]


@pytest.mark.parametrize(("emitted", "call", "statuses"), EMITTED_STATUSES)
def test_emitted_statuses(
    emitted: list[dict[str, Any]], call: dict[str, Any], statuses: list[str]
) -> None:
    view = LedgerView()
    for item in emitted:
        view.add_emitted(item)
    assert view.emitted_statuses(call) == statuses
    # Failing open on a history that could not be read vouches for nothing.
    view.trust_unpaired = True
    assert view.emitted_statuses(call) == statuses


class BrokenStore(MemoryStore):
    """A store whose every read fails, as Redis does when it is down."""

    async def chain(self, tenant: str, response_id: str, depth: int) -> list[RecordedResponse]:
        raise LedgerFault("down")

    async def lookup(self, *args: Any, **kwargs: Any) -> Any:
        raise LedgerFault("down")


# (the store, the request body, trust_unpaired under fail_open)
FAIL_OPEN = [
    pytest.param("memory", {"previous_response_id": "resp_unknown"}, True, id="unknown-previous"),
    pytest.param("memory", {"previous_response_id": "resp_1"}, False, id="known-previous"),
    pytest.param("broken", {"previous_response_id": "resp_1"}, True, id="fault-with-previous"),
    pytest.param(
        "broken", {"input": [{"type": "item_reference", "id": "fc_c"}]}, False, id="fault-no-prev"
    ),
    pytest.param(
        "broken", {"input": [replayed(), sales_output("c")]}, False, id="fault-status-lookup"
    ),
]


@pytest.mark.parametrize(("store", "body", "trusted"), FAIL_OPEN)
async def test_fail_open_waives_only_an_unreadable_previous_response(
    store: str, body: dict[str, Any], trusted: bool
) -> None:
    backend = (BrokenStore if store == "broken" else MemoryStore)(max_responses=10, ttl_s=60)
    ledger = Ledger(backend, max_chain=8, fail_open=True)
    await backend.put("t", RecordedResponse("resp_1", None, (sales_call("c"),)))
    view = await ledger.view("t", body, provenance=False)
    assert view is not None
    assert view.trust_unpaired is trusted


async def test_a_call_without_status_is_looked_up_without_provenance() -> None:
    backend = MemoryStore(max_responses=10, ttl_s=60)
    ledger = Ledger(backend, max_chain=8, fail_open=False)
    await backend.put("t", RecordedResponse("resp_1", None, (sales_call("c"),)))
    view = await ledger.view("t", {"input": [replayed(), sales_output("c")]}, provenance=False)
    assert view is not None
    assert view.emitted_statuses(replayed()) == ["completed"]
    # With a status, the call is judged as given: nothing to look up.
    given = {"input": [sales_call("c"), sales_output("c")]}
    assert await ledger.view("t", given, provenance=False) is None


async def test_a_call_id_given_many_times_is_looked_up_once() -> None:
    backend = MemoryStore(max_responses=10, ttl_s=60)
    ledger = Ledger(backend, max_chain=8, fail_open=False)
    await backend.put("t", RecordedResponse("resp_1", None, (sales_call("c"),)))
    body = {"input": [replayed()] * 1000 + [sales_output("c")]}
    view = await ledger.view("t", body, provenance=True)
    assert view is not None
    assert view.emitted_statuses(replayed()) == ["completed"]
