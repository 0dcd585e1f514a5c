"""What an API of one vendor refuses in a replayed call beyond the spec's item schema.

The gate's `not_portable` checks a pair against the Open Responses item schemas (`call_id` 1-64
characters, `name` `^[a-zA-Z0-9_-]+$` up to 64). A vendor's other API may refuse more: OpenAI's
Chat Completions refuses a `tool_calls[].id` over 40 characters (400 `string_above_max_length`,
"Invalid 'messages[2].tool_calls[0].id': string too long. Expected a string with maximum
length 40"), where its Responses API takes 64. Its function names follow the same pattern and
length as the spec's, already checked. Only limits a vendor's own error shows are listed here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.gate.schemas import Violation


@dataclass(frozen=True, slots=True)
class CallLimits:
    """The limits one API puts on a replayed call's fields, beyond the spec's schema."""

    max_call_id: int | None = None
    # Whether the spec's item schema holds for the call at all: an MCP `tools/call` is no
    # Responses item, and its tool's name is whatever its server listed.
    item_schema: bool = True

    def iter_violations(self, call: Mapping[str, Any]) -> Iterator[Violation]:
        """Each limit `call` breaks, as a violation of its item (a JSON Pointer into it)."""
        call_id = call.get("call_id")
        limit = self.max_call_id
        if limit is not None and isinstance(call_id, str) and len(call_id) > limit:
            # Loaded only when a limit is broken: the request targets read the dialects, which
            # name these limits, and load no schema machinery.
            from proxy.gate.schemas import Violation

            # As the spec's own `maxLength` of a call_id is said.
            yield Violation("/call_id", "maxLength", None, (limit,))


# An MCP server's call: judged by its tool's schema only, never by the Responses item schema.
MCP_LIMITS = CallLimits(item_schema=False)
# Chat Completions, by upstream `vendor`.
CHAT_LIMITS: Mapping[str, CallLimits] = {"openai": CallLimits(max_call_id=40)}
