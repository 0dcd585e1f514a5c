"""The Open Responses dialect: where a body's items live, how the gate's edits are made in it,
which paths it gates. A table per method."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.admission import targets
from proxy.admission.dialect import (
    CHAT_COMPLETIONS,
    GATED,
    OPEN_RESPONSES,
    dialect_of,
    whole_input,
)
from proxy.gate.reasons import Outcome
from proxy.gate.verdict import Verdict
from tests.builders import USER, sales_call, sales_output

CALL, OUTPUT = sales_call("call_1"), sales_output("call_1")
ASKED = "what were the sales?"


@pytest.mark.parametrize(
    ("parsed", "found"),
    [
        pytest.param({"input": [USER, CALL]}, [USER, CALL], id="a-list"),
        pytest.param(
            {"input": ASKED},
            [{"type": "message", "role": "user", "content": ASKED}],
            id="a-string-is-one-user-message",
        ),
        pytest.param({"model": "m"}, [], id="none"),
        pytest.param({"input": 5}, [], id="not-items"),
    ],
)
def test_input_items(parsed: dict[str, Any], found: list[Any]) -> None:
    assert list(OPEN_RESPONSES.input_items(parsed)) == found


@pytest.mark.parametrize(
    ("item", "kind"),
    [
        pytest.param(CALL, "function_call", id="call"),
        pytest.param({"call_id": "c", "output": "x"}, "function_call_output", id="typeless-output"),
        pytest.param({"id": "fc_1"}, "item_reference", id="typeless-reference"),
        pytest.param("text", None, id="not-an-object"),
    ],
)
def test_kind(item: Any, kind: str | None) -> None:
    assert OPEN_RESPONSES.kind(item) == kind


PARSED = {"model": "m", "input": [USER, CALL, OUTPUT], "messages": []}


@pytest.mark.parametrize(
    ("verdict", "sent"),
    [
        pytest.param(Verdict(Outcome.FORWARD), PARSED, id="unchanged"),
        pytest.param(
            Verdict(Outcome.STRIP, input=[USER]), PARSED | {"input": [USER]}, id="the-gates-input"
        ),
        pytest.param(
            Verdict(Outcome.STRIP, without=frozenset({"messages"})),
            {"model": "m", "input": [USER, CALL, OUTPUT]},
            id="members-stripped",
        ),
    ],
)
def test_sent(verdict: Verdict, sent: dict[str, Any]) -> None:
    assert OPEN_RESPONSES.sent(dict(PARSED), verdict) == sent


@pytest.mark.parametrize(
    ("verdict", "whole"),
    [
        pytest.param(Verdict(Outcome.FORWARD), [USER, CALL, OUTPUT], id="as-sent"),
        pytest.param(Verdict(Outcome.REWRITE, input=[USER]), [USER], id="as-the-gate-changed-it"),
    ],
)
def test_whole_input(verdict: Verdict, whole: list[Any]) -> None:
    assert whole_input(OPEN_RESPONSES, PARSED, verdict) == whole


def test_a_recorded_conversation_is_inlined_before_the_input() -> None:
    parsed = {"model": "m", "previous_response_id": "resp_1", "input": ASKED}
    assert OPEN_RESPONSES.inlined(parsed, [CALL]) == {
        "model": "m",
        "input": [CALL, {"type": "message", "role": "user", "content": ASKED}],
    }


@pytest.mark.parametrize(
    ("path", "route", "compacts"),
    [
        pytest.param("/v1/responses", "responses", False, id="responses"),
        pytest.param("/v1/responses/compact", "responses_compact", True, id="compact"),
        pytest.param("/responses", "responses", False, id="unversioned"),
        pytest.param("/responses/compact", "responses_compact", True, id="unversioned-compact"),
    ],
)
def test_the_paths_it_gates(path: str, route: str, compacts: bool) -> None:
    assert dialect_of(path) is OPEN_RESPONSES
    assert GATED[path] == OPEN_RESPONSES.paths[path] == route
    assert OPEN_RESPONSES.compacts(path) is compacts
    # The targets gate exactly the dialects' paths.
    assert targets.read_target(path).gated == path


def test_a_path_no_dialect_gates_has_none() -> None:
    with pytest.raises(KeyError):
        dialect_of("/v1/embeddings")
    assert targets.read_target("/v1/embeddings").gated is None


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/chat/completions"])
def test_chat_completions_is_gated_by_its_dialect(path: str) -> None:
    assert dialect_of(path) is CHAT_COMPLETIONS
    assert GATED[path] == "chat_completions"
    assert not CHAT_COMPLETIONS.compacts(path)
    # Its answers' tool calls are recorded; no body continues a recorded one.
    assert CHAT_COMPLETIONS.records
    assert not CHAT_COMPLETIONS.continues
    assert targets.read_target(path).gated == path
