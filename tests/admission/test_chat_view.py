"""The Chat view's places and its settling, as the gate's findings and the ledger read them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.admission.chat import ChatView
from proxy.admission.dialect import CHAT_COMPLETIONS
from proxy.gate import items
from proxy.gate.items import Item
from proxy.gate.pairing import NothingRecorded

CALL = {"type": "function", "id": "c1", "function": {"name": "f", "arguments": "{}"}}
CUSTOM = {"type": "custom", "id": "c2", "custom": {"name": "g", "input": "x"}}
MESSAGES: list[Any] = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "tool_calls": [CALL, CUSTOM], "function_call": {"name": "h"}},
    {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    {"role": "function", "name": "h", "content": "ok"},
]


class Relayed(NothingRecorded):
    """A ledger that relayed `c1`, cut."""

    def emitted_statuses(self, call: Item) -> Sequence[Any]:
        return ["incomplete"] if call.get("call_id") == "c1" else ()


def test_each_shown_item_says_its_place_as_a_param() -> None:
    view = ChatView({"messages": MESSAGES})
    assert [p.param for p in view.places] == [
        "messages[1].tool_calls[0]",
        "messages[1].tool_calls[1]",
        "messages[1].function_call",
        "messages[2]",
        "messages[3]",
    ]
    assert [(p.message, p.call, p.legacy) for p in view.places] == [
        (1, 0, False),
        (1, 1, False),
        (1, None, True),
        (2, None, False),
        (3, None, False),
    ]


def test_settling_gives_a_status_only_to_a_function_call_never_relayed() -> None:
    view = ChatView({"messages": MESSAGES})
    view.settle(None)
    assert [i.get("status") for i in view.body["input"]] == [
        "completed",  # never relayed
        "completed",  # not a function call: completed as shown
        "completed",  # legacy: its call id is its place
        None,  # an output
        None,
    ]
    relayed = ChatView({"messages": MESSAGES})
    relayed.settle(Relayed())
    # Relayed: judged by the status it was relayed with, so it keeps none of its own.
    assert "status" not in relayed.body["input"][0]


def test_the_chat_kind_is_the_gates_kind_of_every_message() -> None:
    members = ["type", "role", "content", "id", "call_id", "name", "output", "summary"]
    members += ["encrypted_content"]
    for mask in range(1 << len(members)):
        for type_value in (None, "", False, "message", "function_call", 3):
            message: dict[str, Any] = {k: "x" for i, k in enumerate(members) if mask >> i & 1}
            if "type" in message:
                message["type"] = type_value
            assert CHAT_COMPLETIONS.kind(message) == items.kind(message), message
    others: list[Any] = [None, [], "message", 1]
    for other in others:
        assert CHAT_COMPLETIONS.kind(other) == items.kind(other)
