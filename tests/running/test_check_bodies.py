"""`check` on a body's own findings: a Chat Completions body as the proxy would find it, and an
audit record of one read back (no subprocess: the Checker itself)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.gate.messages import CHAT_BODY
from proxy.gate.policy import Policy
from proxy.running.check import Checker
from proxy.running.documents import Document, Kind

CHAT = [
    {"role": "user", "content": "sales?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]},
]
MESSAGES_FINDING = {
    "index": None,
    "call_id": None,
    "paired_index": None,
    "name": None,
    "reason": "envelope",
    "param": "messages",
    "message": CHAT_BODY,
}


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        pytest.param("chat_completions", {"model": "m", "messages": [CHAT[0]]}, id="chat-body"),
        pytest.param(
            "request", {"model": "m", "messages": [CHAT[0]], "input": []}, id="beside-input"
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
