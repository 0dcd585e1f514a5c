"""The order of the gate's checks: the first failing one wins."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.gate.policy import Policy
from proxy.gate.verdict import inspect
from tests.builders import call, message, output, request
from tests.gate.ledger_double import Ledger

# A call_id over the spec's 64 characters.
LONG = "c" * 65

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
        [call(LONG, {"x": 1}, name="a b", type="acme:x", status="x"), output(LONG)],
        {},
        "namespaced",
        id="namespaced-before-not-portable",
    ),
    pytest.param(
        [message("hi") | {"type": "message", "call_id": "c", "arguments": 5}, output("c")],
        {},
        "not_function_call",
        id="not-function-call-before-status",
    ),
    pytest.param(
        [message("hi") | {"type": "message", "call_id": LONG, "name": "a b"}, output(LONG)],
        {},
        "not_function_call",
        id="not-function-call-before-not-portable",
    ),
    pytest.param(
        [call(LONG, {"x": 1}, name="no pe", status="in_progress"), output(LONG)],
        {},
        "not_portable",
        id="not-portable-before-status",
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
