"""What one WebSocket connection may still continue: a turn the proxy failed evicts the response
its `previous_response_id` named, as the spec has a failed continuation evict it from the
connection's cache (the upstream never saw that turn, so it cannot have evicted it itself)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from proxy.admission import body
from proxy.gate.errors import ProxyError

# Evicted ids a connection remembers, the oldest forgotten first: a client that fails turns on
# purpose must not grow the proxy's memory without bound.
MAX_EVICTED = 1024


def previous_response_id(raw: bytes) -> str | None:
    """The `previous_response_id` a frame names, if it is readable and names one."""
    try:
        parsed = body.parse(raw)
    except body.BodyError:
        return None
    named = parsed.get("previous_response_id")
    return named if isinstance(named, str) else None


def not_found(named: str) -> ProxyError:
    """The spec's answer to a continuation of a response the connection no longer holds."""
    return ProxyError(
        400,
        "previous_response_not_found",
        f"Previous response with id '{named}' not found.",
        param="previous_response_id",
    )


class Continuations:
    """The responses a connection's failed turns named: a later turn naming one is refused."""

    def __init__(self, limit: int = MAX_EVICTED) -> None:
        self._limit = limit
        # Digests, not ids: an id is as long as the client makes it.
        self._evicted: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._evicted)

    def failed(self, raw: bytes) -> None:
        """A frame the proxy answered itself: the response it continued is evicted."""
        named = previous_response_id(raw)
        if named is None:
            return
        digest = _digest(named)
        self._evicted[digest] = None
        self._evicted.move_to_end(digest)
        while len(self._evicted) > self._limit:
            self._evicted.popitem(last=False)

    def refusal(self, raw: bytes) -> ProxyError | None:
        """`previous_response_not_found` for a frame that continues an evicted response."""
        if not self._evicted:
            return None
        named = previous_response_id(raw)
        if named is None or _digest(named) not in self._evicted:
            return None
        return not_found(named)


def _digest(named: str) -> bytes:
    return hashlib.blake2b(named.encode("utf-8", "surrogatepass"), digest_size=16).digest()
