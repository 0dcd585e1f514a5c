"""A ledger double for the gate's tables: what `Recorded` answers, from lists."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.gate import items
from proxy.gate.items import Item


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

    def mcp_lists(self) -> Sequence[Item]:
        return [item for item in self.chain if item.get("type") == items.MCP_LIST_TOOLS]

    def emitted_statuses(self, call: Item) -> Sequence[Any]:
        self.asked.append(call)
        key = (call.get("call_id"), call.get("name"), call.get("arguments"))
        return [s for c, s in zip(self.emitted_calls, self.statuses, strict=True) if c == key]
