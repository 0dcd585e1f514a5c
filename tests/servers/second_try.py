"""A strict upstream whose model makes a recoverable mistake: its first call breaks the tool's
schema, and once it is told why (a tool output whose JSON says `"execute": false`), it calls
again with valid arguments; given the valid call's output, it answers with text.

It is the strict upstream in every other way (pairing, the chain, WebSocket caches), so that a
rewritten output it accepts is one a provider would accept.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from tests.servers.loopback import serving
from tests.servers.strict_upstream import Item, StrictUpstream

TOOL = "lookup_order"
# The tool's schema asks for an order id like A-1042 and nothing else.
BAD_ARGUMENTS = '{"order_id":"1042","refund":true}'
GOOD_ARGUMENTS = '{"order_id":"A-1042"}'
FINAL_TEXT = "done: "


def told_why(output: Any) -> bool:
    """Whether a tool output is a failure record that says the call was not executed."""
    if not isinstance(output, str):
        return False
    try:
        record = json.loads(output)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("execute") is False


@dataclass
class SecondTryUpstream(StrictUpstream):
    """The strict upstream with the model above."""

    def answer(self, body: dict[str, Any], context: list[Item], tools: list[Item]) -> Item:
        # The outputs that end the context answer the model's latest calls (a client may resend
        # the whole history every turn, or continue a response).
        outputs: list[Item] = []
        for item in reversed(context):
            if item.get("type") != "function_call_output":
                break
            outputs.insert(0, item)
        if not outputs:
            return self.call(BAD_ARGUMENTS)
        if any(told_why(o.get("output")) for o in outputs):
            return self.call(GOOD_ARGUMENTS)
        text = FINAL_TEXT + "; ".join(str(o.get("output")) for o in outputs)
        return {
            "type": "message",
            "id": self.new_id("msg"),
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }

    def call(self, arguments: str) -> Item:
        return {
            "type": "function_call",
            "id": self.new_id("fc"),
            "call_id": self.new_id("call"),
            "name": TOOL,
            "arguments": arguments,
            "status": "completed",
        }


@contextlib.asynccontextmanager
async def serve() -> AsyncIterator[SecondTryUpstream]:
    """The upstream on a free loopback port, in the running event loop."""
    upstream = SecondTryUpstream()
    async with serving(upstream.app()) as upstream.url:
        yield upstream
