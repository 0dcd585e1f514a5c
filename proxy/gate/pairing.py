"""What the proxy recorded of earlier responses, as the pairing of outputs sees it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from proxy.gate.items import Item


class Recorded(Protocol):
    """What the proxy recorded of earlier upstream responses (the ledger), as the gate sees it.

    `trust_unpaired` is true when the previous response a request names could not be read
    and the config fails open: an output with no pair then passes instead of being an `orphan`.
    It waives nothing else.
    """

    trust_unpaired: bool

    def calls(self, call_id: str) -> Sequence[Item]:
        """Items answering `call_id` in the `previous_response_id` chain of this request."""
        ...

    def item(self, item_id: str) -> Item | None:
        """The recorded item an `item_reference` names, if any."""
        ...

    def emitted_statuses(self, call: Item) -> Sequence[Any]:
        """The `status` of each call with this call's `call_id`, `name` and `arguments` that an
        upstream response relayed to this tenant emitted; empty when none did."""
        ...


class NothingRecorded:
    """No ledger: only inline items pair, and nothing counts as emitted upstream."""

    trust_unpaired = False

    def calls(self, call_id: str) -> Sequence[Item]:
        return ()

    def item(self, item_id: str) -> Item | None:
        return None

    def emitted_statuses(self, call: Item) -> Sequence[Any]:
        return ()


NOTHING_RECORDED = NothingRecorded()
