"""`check` on a body's own findings: Chat messages where Open Responses items belong, a Chat
Completions body judged as the proxy's Chat path judges it, and audit records of both read back
(no subprocess: the Checker itself)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.gate.phrases import CHAT_BODY
from proxy.gate.policy import Policy
from proxy.running.check import CHAT_DOCUMENT, CHAT_RECORD, Checker, dialect
from proxy.running.documents import Document, Kind
from tests.builders import CHAT_MESSAGES, MESSAGES_FINDING, SALES_SCHEMA


@pytest.mark.parametrize(
    ("kind", "value"),
    [
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
def test_chat_messages_on_a_responses_path_are_reported_at_messages(
    kind: Kind, value: dict[str, Any]
) -> None:
    checked = Checker(Policy()).check(Document("a.json", 1, None, kind, value))
    assert checked.outcome == "block"
    [reported] = checked.reported
    assert (reported.where, reported.message) == ("messages", CHAT_BODY)
    assert reported.finding.as_dict() == MESSAGES_FINDING


SALES = "get_latest_sales_report"
TOOLS: list[Any] = [{"type": "function", "function": {"name": SALES, "parameters": SALES_SCHEMA}}]
USER = {"role": "user", "content": "APAC?"}


def calls(*entries: tuple[str, str]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": SALES, "arguments": a}}
            for i, a in entries
        ],
    }


def tool(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "42 units"}


APAC, MARS = '{"region":"apac"}', '{"region":"mars"}'


@pytest.mark.parametrize(
    ("messages", "found"),
    [
        pytest.param([USER, calls(("c1", APAC)), tool("c1")], [], id="clean"),
        pytest.param(
            [USER, calls(("c1", APAC), ("c2", MARS)), tool("c1"), tool("c2")],
            [("messages[3]", "arguments_schema", "c2")],
            id="a-tool-message-at-its-place",
        ),
        pytest.param(
            [USER, calls(("c1", APAC)), tool("c9")],
            [("messages[2]", "orphan", "c9")],
            id="orphan",
        ),
        pytest.param(
            [USER, calls(("c1", MARS))],
            [("messages[1].tool_calls[0]", "arguments_schema", "c1")],
            id="a-call-not-answered-yet-is-judged-as-its-replay",
        ),
        pytest.param(
            [USER, {"type": "function_call_output", "call_id": "c1", "output": "x"}],
            [("messages[1]", "envelope", "c1")],
            id="an-open-responses-item-in-messages",
        ),
    ],
)
def test_a_chat_completions_body_is_judged_as_the_chat_path_judges_it(
    messages: list[Any], found: list[tuple[str, str | None, str]]
) -> None:
    body = {"model": "m", "tools": TOOLS, "messages": messages}
    checked = Checker(Policy()).check(Document("a.json", 1, None, "chat_completions", body))

    assert [(r.where, r.finding.reason, r.finding.call_id) for r in checked.reported] == found
    assert checked.outcome == ("block" if found else "forward")
    assert checked.notes == (CHAT_DOCUMENT,)
    assert dialect(checked.document) == "chat"


@pytest.mark.parametrize(
    ("path", "where", "notes", "named"),
    [
        pytest.param(
            "/v1/chat/completions", "messages[3]", (CHAT_RECORD,), "chat", id="chat-record"
        ),
        pytest.param("/v1/responses", "input[3]", (), "responses", id="responses-record"),
    ],
)
def test_an_audit_record_is_read_in_its_dialect(
    path: str, where: str, notes: tuple[str, ...], named: str
) -> None:
    finding = {
        "index": 3,
        "call_id": "c2",
        "paired_index": 1,
        "name": SALES,
        "reason": "orphan",
    }
    if named == "chat":
        finding["param"] = where
    record = {"event": "replay_rejected", "path": path, "findings": [finding]}
    checked = Checker(Policy()).check(Document("audit.jsonl", 1, None, "audit_record", record))

    [reported] = checked.reported
    assert (reported.where, reported.finding.reason) == (where, "orphan")
    assert checked.notes == notes
    assert dialect(checked.document) == named
