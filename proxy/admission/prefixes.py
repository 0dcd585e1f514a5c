"""Verified prefixes: a body that begins with the bytes of one the gate passed for its tenant is
read and judged only past them.

A stateless client re-sends its whole conversation every turn, one more call and its output at
the end of the items array. Once a body was read in full and passed clean (no finding, the
ledger not asked), the proxy holds its bytes. A later body of the same tenant and gated path
that starts with those bytes up to the end of their last item, and ends with the same bytes from
the array's `]` on (every other top-level member unchanged, byte for byte), differs only in the
items between: those alone are parsed (strictly, as `[` + them + `]`: the whole body is then a
valid JSON document, its top-level keys those of the body already read) and judged, with the
body's other members, in `pipeline`. Anything else is read in full: no prefix held, a byte
differing anywhere before the cut or in the tail, a new item that shares a call id with the
prefix, an item of a kind whose verdict reaches across the body, a finding.

What it holds is bounded: at most `limits.max_prefix_sessions` bodies, each at most
`limits.max_prefix_bytes` (0: nothing is held, every body is read in full), the least recently
matched dropped first.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.admission.dialect import CHAT_COMPLETIONS, OPEN_RESPONSES, Dialect
from proxy.gate import items
from proxy.gate.policy import Policy

# The items array of each dialect's body; a dialect not listed is always read in full.
ITEMS_KEY: Mapping[Dialect, str] = {OPEN_RESPONSES: "input", CHAT_COMPLETIONS: "messages"}
# A body is found by its first bytes (with its tenant and path): a prefix shorter than this is
# not held (such a body is cheap to read in full).
ANCHOR = 1024
# The item kinds whose verdict depends on no item but their pair (by call id): a kind that
# declares tools, lists an MCP server's tools or names a recorded item reaches across the body.
LOCAL_KINDS = frozenset(
    {
        items.MESSAGE,
        items.FUNCTION_CALL,
        items.FUNCTION_CALL_OUTPUT,
        "reasoning",
        "custom_tool_call",
        "custom_tool_call_output",
    }
)
# The ids an item may be paired or told apart by.
_ID_FIELDS = ("call_id", "id", "tool_call_id")
_WHITESPACE = b" \t\r\n"
# A JSON string (a key when a colon follows it), or a bracket: enough to find a member's array.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"(\s*:)?|[\[\]{}]')
_ARRAY = re.compile(rb"[ \t\r\n]*\[")


@dataclass(frozen=True, slots=True)
class Verified:
    """A body read and passed clean: `data[:cut]` ends with its last item, `data[end:]` is the
    rest from the `]` that closes its items."""

    data: bytes
    cut: int
    end: int
    fields: Mapping[str, Any]  # its top-level members but the items, as read
    keys: frozenset[str]  # every id an item of it may be paired by
    calls: tuple[dict[str, Any], ...]  # what its items add to the context recorded
    upstream: str
    policy: Policy

    @property
    def held(self) -> int:
        """The bytes held for it: the body's and its ids'."""
        return len(self.data) + sum(len(k) for k in self.keys)


@dataclass(frozen=True, slots=True)
class Match:
    """A body that starts with a verified one's prefix: `new` its items past the cut, as a JSON
    array to read; `cut` and `end` its own."""

    verified: Verified
    serial: int
    new: bytes
    grew: bool  # whether a comma and items follow the cut (else only whitespace)
    cut: int
    end: int


class Prefixes:
    """The verified bodies of live sessions, by tenant, gated path and first bytes."""

    def __init__(self, max_bytes: int, max_sessions: int) -> None:
        self.max_bytes = max_bytes
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[int, tuple[tuple[str, str, bytes], Verified]] = OrderedDict()
        self._buckets: dict[tuple[str, str, bytes], list[int]] = {}
        self._serial = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0 and self.max_sessions > 0

    def held(self) -> list[int]:
        """The bytes held for each session, least recently matched first."""
        return [verified.held for _, verified in self._sessions.values()]

    def match(self, tenant: str, path: str, data: bytes) -> Match | None:
        """The verified body `data` extends (or repeats), newest first; None when none."""
        if len(data) <= ANCHOR:
            return None
        bucket = self._buckets.get((tenant, path, data[:ANCHOR]))
        if not bucket:
            return None
        size = len(data)
        for serial in reversed(bucket):
            verified = self._sessions[serial][1]
            known = memoryview(verified.data)
            tail = len(verified.data) - verified.end
            if size < verified.cut + tail or not data.startswith(known[: verified.cut]):
                continue
            if not data.endswith(known[verified.end :]):
                continue
            end = size - tail
            middle = data[verified.cut : end]
            rest = middle.lstrip(_WHITESPACE)
            if not rest:
                return Match(verified, serial, b"[]", False, verified.cut, end)
            if rest[:1] != b",":
                continue
            cut = end - (len(middle) - len(middle.rstrip(_WHITESPACE)))
            return Match(verified, serial, b"[" + rest[1:] + b"]", True, cut, end)
        return None

    def remember(self, tenant: str, path: str, verified: Verified, serial: int | None) -> None:
        """Hold `verified` (in place of the session `serial` it extends, if given), unless it is
        over the bound: then the session is dropped."""
        if serial is not None:
            self._forget(serial)
        if not self.enabled or verified.cut <= ANCHOR or len(verified.data) > self.max_bytes:
            return
        key = (tenant, path, verified.data[:ANCHOR])
        if serial is None:
            self._serial += 1
            serial = self._serial
        self._sessions[serial] = (key, verified)
        self._buckets.setdefault(key, []).append(serial)
        while len(self._sessions) > self.max_sessions:
            self._forget(next(iter(self._sessions)))

    def _forget(self, serial: int) -> None:
        found = self._sessions.pop(serial, None)
        if found is None:
            return
        bucket = self._buckets[found[0]]
        bucket.remove(serial)
        if not bucket:
            del self._buckets[found[0]]


def locate(data: bytes, key: str) -> tuple[int, int] | None:
    """Where the top-level member `key`'s array ends in a JSON object's bytes already read
    strictly: just after its last item, and at its `]`. None when the member is not an array
    written with its name unescaped, or is empty."""
    name = b'"' + key.encode() + b'"'
    depth = 0
    inside = False  # within the member's array
    for token in _TOKEN.finditer(data):
        at = token.start()
        first = data[at]
        if first == 0x22:  # a string: the member's name?
            if (
                not inside
                and depth == 1
                and token.start(1) - at == len(name)
                and data.startswith(name, at)
            ):
                if _ARRAY.match(data, token.end()) is None:
                    return None
                inside = True
        elif first == 0x7B or first == 0x5B:  # { [
            depth += 1
        else:
            depth -= 1
            if inside and depth == 1:  # the array's ]
                cut = at
                while data[cut - 1] in _WHITESPACE:
                    cut -= 1
                return None if data[cut - 1] == 0x5B else (cut, at)
    return None


def keys_of(shown: Iterable[Any]) -> frozenset[str] | None:
    """Every id the items (as the gate reads them) may be paired or told apart by; None when
    one is of a kind whose verdict reaches past its pair."""
    found: set[str] = set()
    for item in shown:
        if items.kind(item) not in LOCAL_KINDS:
            return None
        for name in _ID_FIELDS:
            value = item.get(name)
            if type(value) is str:
                found.add(value)
    return frozenset(found)
