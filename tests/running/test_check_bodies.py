"""`check` on a body's own findings: a Chat Completions body as the proxy would find it, and an
audit record of one read back (no subprocess: the Checker itself)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.gate.phrases import CHAT_BODY
from proxy.gate.policy import Policy
from proxy.running.check import Checker
from proxy.running.documents import Document, Kind
from tests.builders import CHAT_MESSAGES, MESSAGES_FINDING


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        pytest.param(
            "chat_completions", {"model": "m", "messages": CHAT_MESSAGES[:1]}, id="chat-body"
        ),
        pytest.param(
            "request", {"model": "m", "messages": CHAT_MESSAGES[:1], "input": []}, id="beside-input"
        ),
        pytest.param(
            "audit_record",
            {"event": "replay_rejected", "findings": [MESSAGES_FINDING]},
            id="recorded",
        ),
    ],
)
def test_a_chat_completions_body_is_reported_at_messages(kind: Kind, value: dict[str, Any]) -> None:
    checked = Checker(Policy()).check(Document("a.json", 1, None, kind, value))
    assert checked.outcome == "block"
    [reported] = checked.reported
    assert (reported.where, reported.message) == ("messages", CHAT_BODY)
    assert reported.finding.as_dict() == MESSAGES_FINDING
