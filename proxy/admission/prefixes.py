"""Verified prefixes: a body that begins with the bytes of one the gate passed for its tenant is
read and judged only past them.

A stateless client re-sends its whole conversation every turn, one more call and its output at
the end of the items array. Once a body was read in full and passed clean (no finding; the ledger
asked at most about calls, never about a response or an item), the proxy holds its bytes, and
what the ledger held of those calls. A later body of the same tenant and gated path
that starts with those bytes up to the end of their last item, and ends with the same bytes from
the array's `]` on (every other top-level member unchanged, byte for byte), differs only in the
items between: those alone are parsed (strictly, as `[` + them + `]`: the whole body is then a
valid JSON document, its top-level keys those of the body already read) and judged, with the
body's other members, in `pipeline`. Anything else is read in full: no prefix held, a byte
differing anywhere before the cut or in the tail, a new item that shares a call id with the
prefix, an item of a kind whose verdict reaches across the body, a finding, the ledger holding
other than it held of the prefix's calls (a call replayed without its status, as every Chat
Completions call is, is judged by the status the proxy relayed it with; under provenance,
every call by whether it was relayed at all: the ledger is asked about those each turn, and
the prefix's verdicts stand only while its answer for them is the same).

What it holds is bounded: at most `limits.max_prefix_sessions` bodies, each at most
`limits.max_prefix_bytes` (0: nothing is held, every body is read in full), the least recently
matched dropped first.
"""

from __future__ import annotations

import functools
import json
from bisect import bisect_left, insort
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jiter

from proxy.admission import body
from proxy.admission.dialect import CHAT_COMPLETIONS, OPEN_RESPONSES, Dialect
from proxy.gate import items
from proxy.gate.policy import Policy

# The items array of each dialect's body; a dialect not listed is always read in full.
ITEMS_KEY: Mapping[Dialect, str] = {OPEN_RESPONSES: "input", CHAT_COMPLETIONS: "messages"}
# A body is found by its first bytes (with its tenant and path): a prefix shorter than this is
# not held (such a body is cheap to read in full).
ANCHOR = 1024
# The item kinds whose verdict depends on no item but their pair (by call id, or a local shell
# output's `id`): the calls and outputs that pair so, and the hosted calls whose results are in
# them. A kind that declares tools (`additional_tools`, `tool_search_output`), lists an MCP
# server's tools, is judged by such a list (`mcp_call`, an MCP approval), pairs by another field
# (`approval_request_id`) or names a recorded item reaches across the body.
LOCAL_KINDS = frozenset(
    {
        items.MESSAGE,
        items.FUNCTION_CALL,
        items.FUNCTION_CALL_OUTPUT,
        "reasoning",
        "custom_tool_call",
        "custom_tool_call_output",
        "computer_call",
        "computer_call_output",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "program",
        "program_output",
        "web_search_call",
        "file_search_call",
        "image_generation_call",
        "code_interpreter_call",
    }
)
# The ids an item may be paired or told apart by.
_ID_FIELDS = ("call_id", "id", "tool_call_id")
_WHITESPACE = b" \t\r\n"
# How many `]` that a member's name follows `locate` reads the rest after, from the end: more
# than one only when a later member nests one (a body that nests more is read in full).
_TRIES = 4


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
    # The calls it asked the ledger about (replayed without a status, or every one under
    # provenance) and what the ledger held of them then (`LedgerView.emitted_calls`): its
    # verdict stands for a later body only while the ledger holds the same.
    asked: tuple[str, ...] = ()
    emitted: Mapping[str, Any] = field(default_factory=dict)

    @property
    def held(self) -> int:
        """The bytes held for it: the body's, its ids' and the arguments of the calls the
        ledger said it relayed under them (each `emitted` entry is a name, arguments, status)."""
        relayed = sum(
            len(entry[1])
            for entries in self.emitted.values()
            for entry in entries
            if isinstance(entry[1], str)
        )
        return len(self.data) + sum(len(k) for k in self.keys) + relayed


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
    """The verified bodies of live sessions, by tenant, gated path and first bytes.

    Sessions of one tenant often share their first bytes (the same instructions and tools):
    a bucket holds its bodies sorted, so that the one a body extends is found beside where
    the body itself sorts (every body between the two starts with what they share), in
    O(log n) comparisons of bytes, not one try per session held."""

    def __init__(self, max_bytes: int, max_sessions: int) -> None:
        self.max_bytes = max_bytes
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[int, tuple[tuple[str, str, bytes], Verified]] = OrderedDict()
        # (tenant, path, first bytes) -> (body, serial) of each session held, sorted.
        self._buckets: dict[tuple[str, str, bytes], list[tuple[bytes, int]]] = {}
        self._serial = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0 and self.max_sessions > 0

    def held(self) -> list[int]:
        """The bytes held for each session, least recently matched first."""
        return [verified.held for _, verified in self._sessions.values()]

    def match(self, tenant: str, path: str, data: bytes) -> Match | None:
        """The verified body `data` extends (or repeats); None when none. It is looked for
        among the `NEIGHBOURS` held bodies on each side of where `data` sorts in its bucket:
        past them, only bodies that share with `data` all the one it extends has (sessions
        forked from one history) are passed over, and a body not found is read in full."""
        if len(data) <= ANCHOR:
            return None
        bucket = self._buckets.get((tenant, path, data[:ANCHOR]))
        if not bucket:
            return None
        at = bisect_left(bucket, (data,))
        for index in _around(at, len(bucket)):
            serial = bucket[index][1]
            found = _extension(self._sessions[serial][1], serial, data)
            if found is not None:
                return found
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
        insort(self._buckets.setdefault(key, []), (verified.data, serial))
        while len(self._sessions) > self.max_sessions:
            self._forget(next(iter(self._sessions)))

    def _forget(self, serial: int) -> None:
        found = self._sessions.pop(serial, None)
        if found is None:
            return
        key, verified = found
        bucket = self._buckets[key]
        del bucket[bisect_left(bucket, (verified.data, serial))]
        if not bucket:
            del self._buckets[key]


# How many held bodies on each side of where a body sorts are tried.
NEIGHBOURS = 8


def _around(at: int, size: int) -> list[int]:
    """The indices of a sorted bucket of `size` nearest `at`, where a body sorts: `at` first
    (the body it extends sorts just after it: its `]` after the bytes they share sorts after
    the body's `,`), then one before, one after, and so on, `NEIGHBOURS` on each side."""
    order = []
    for step in range(NEIGHBOURS):
        if at + step < size:
            order.append(at + step)
        if at - 1 - step >= 0:
            order.append(at - 1 - step)
    return order


def _extension(verified: Verified, serial: int, data: bytes) -> Match | None:
    """How `data` extends (or repeats) the held body `verified`; None when it does not."""
    known = memoryview(verified.data)
    size = len(data)
    tail = len(verified.data) - verified.end
    if size < verified.cut + tail or not data.startswith(known[: verified.cut]):
        return None
    if not data.endswith(known[verified.end :]):
        return None
    end = size - tail
    middle = data[verified.cut : end]
    rest = middle.lstrip(_WHITESPACE)
    if not rest:
        return Match(verified, serial, b"[]", False, verified.cut, end)
    if rest[:1] != b",":
        return None
    cut = end - (len(middle) - len(middle.rstrip(_WHITESPACE)))
    return Match(verified, serial, b"[" + rest[1:] + b"]", True, cut, end)


def locate(
    data: bytes, key: str, parsed: Mapping[str, Any] | None = None
) -> tuple[int, int] | None:
    """Where the top-level member `key`'s array ends in a JSON object's bytes already read
    strictly (`parsed`, as read; None: read here): just after its last item, and at its `]`.
    None when the member is not a non-empty array, or the member after it is not written
    with its name unescaped.

    Found from the end, not by scanning the items (a regular expression over every string of
    a 27 KB body took 1.7 M instructions): a `]` followed by `,` and a quoted name is outside
    any string (inside one a `"` is escaped, and nothing but `,`, `:`, `]`, `}` or whitespace
    follows a closing one), so it is the array's, or one nested in another member. The bytes
    from the name on, read as an object's members, tell them apart: after a nested one the
    object would close too often to be read (and its keys would not be the members after the
    array). The object's keys are unique, so only the array's `]` reads so.
    """
    if parsed is None:
        try:
            parsed = body.loads(data)
        except body.BodyError:
            return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get(key), list) or not parsed[key]:
        return None
    names = list(parsed)
    after = names[names.index(key) + 1 :]
    if not after:  # the last member: the object's `}` ends the bytes, its `]` just before
        end = _before_space(data, len(data)) - 1
        if end < 0 or data[end] != 0x7D:  # }
            return None
        end = _before_space(data, end) - 1
        if end < 0 or data[end] != 0x5D:  # ]
            return None
    else:
        closing = _closing(data, _quoted(after[0]), after)
        if closing is None:
            return None
        end = closing
    return _before_space(data, end), end


def _closing(data: bytes, name: bytes, after: list[str]) -> int | None:
    """The `]` followed by `,` and `name` after which the bytes read as an object of the
    members `after`: written compactly, or among the last _TRIES followed by the name."""
    # Only one `]` can be read so (the object's keys are unique): the compact form first.
    end = data.rfind(b"]," + name)
    if end >= 0 and _members_at(data, end + 2, after):
        return end
    end = len(data)
    tries = _TRIES
    while tries:
        end = data.rfind(b"]", 0, end)
        if end < 0:
            return None
        comma = _after_space(data, end + 1)
        if data[comma : comma + 1] != b",":
            continue
        start = _after_space(data, comma + 1)
        if not data.startswith(name, start):
            continue
        tries -= 1
        if _members_at(data, start, after):
            return end
    return None


def _members_at(data: bytes, start: int, after: list[str]) -> bool:
    """Whether `data` from `start` on reads as the members `after` of an object (their values
    are known: `data` was read strictly whole)."""
    try:
        rest = jiter.from_json(b"{" + data[start:], allow_inf_nan=False, cache_mode="none")
    except ValueError:
        return False
    return list(rest) == after


def _before_space(data: bytes, at: int) -> int:
    """Where the whitespace that ends at `at` begins."""
    while at > 0 and data[at - 1] in _WHITESPACE:
        at -= 1
    return at


def _after_space(data: bytes, at: int) -> int:
    """Where the whitespace that begins at `at` ends."""
    size = len(data)
    while at < size and data[at] in _WHITESPACE:
        at += 1
    return at


@functools.lru_cache(maxsize=64)
def _quoted(name: str) -> bytes:
    """A member's name as written unescaped (a body's are few, and the same every turn)."""
    return json.dumps(name, ensure_ascii=False).encode()


def keys_of(shown: Mapping[str, Any]) -> frozenset[str] | None:
    """Every id the items of a body as the gate reads it (a dialect's view) may be paired or
    told apart by; None when one is of a kind whose verdict reaches past its pair."""
    items_shown = shown.get("input")
    found: set[str] = set()
    for item in items_shown if isinstance(items_shown, list) else ():
        if items.kind(item) not in LOCAL_KINDS:
            return None
        for name in _ID_FIELDS:
            value = item.get(name)
            if type(value) is str:
                found.add(value)
    return frozenset(found)
