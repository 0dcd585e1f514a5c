"""The tool loops every Chat Completions client runs, direct and through the proxy
(tests/server/test_chat_*_client.py): a subclass of `ChatClientLoops` says how its client runs
one loop to its final answer and what it raises on a 400; the tests are the same for all.

The upstream is tests/servers/scripted_chat.py: a valid loop asks for order A-1042 (a valid
call, its result, the answer); a breaking loop asks for order 1042, and the model's first call
breaks the tool's schema. Direct, the model answers with the client's result for that call;
through the proxy, `block` (the default) refuses the turn that replays it, and `rewrite` tells
the model why, so that it calls again, validly, and the run ends as a valid loop does.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.builders import audit_records
from tests.fixture_types import ProxyFactory
from tests.servers import scripted_chat
from tests.servers.scripted_chat import ORDER, ORDER_SCHEMA, VALID_ANSWER, ScriptedChat
from tests.servers.second_try import FINAL_TEXT, TOOL, told_why

KEY = "sk-chat-client"
MODEL = "scripted"
VALID = f"Where is order {ORDER}?"
BREAKING = "Where is order 1042?"
# A loop that has not ended after this many completions is a failure, not a hang.
MAX_TURNS = 5
DESCRIPTION = "Look an order up by its id."
# The tool as the openai SDK and LiteLLM declare it.
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": TOOL, "description": DESCRIPTION, "parameters": ORDER_SCHEMA},
    }
]


def lookup_order(arguments: Mapping[str, Any]) -> str:
    """The tool: it runs with whatever arguments the model gave it, as a careless host would."""
    return f"order {arguments.get('order_id')}: shipped"


def replays(tmp_path: Path) -> list[dict[str, Any]]:
    """The audit records of replays the gate refused (not door 2's of the model's own calls)."""
    return [r for r in audit_records(tmp_path) if r["event"] == "replay_rejected"]


class LoopNotEnded(AssertionError):
    """The model was still calling tools after MAX_TURNS completions."""


class ChatClientLoops:
    """The client matrix; a subclass gives `run` and `refused` (its BadRequestError)."""

    refused: ClassVar[type[Exception]]

    async def run(self, base: str, prompt: str) -> str:
        """One tool loop against `base` (no `/v1`), to the model's final answer."""
        raise NotImplementedError

    @pytest.fixture
    async def chat(self) -> AsyncIterator[ScriptedChat]:
        async with scripted_chat.serve() as upstream:
            yield upstream

    async def test_a_valid_loop_answers_the_same_through_the_proxy(
        self, chat: ScriptedChat, start_proxy: ProxyFactory, tmp_path: Path
    ) -> None:
        direct = await self.run(chat.url, VALID)
        by_default = await self.run(await start_proxy(chat.url), VALID)
        rewriting = await self.run(await start_proxy(chat.url, gate={"action": "rewrite"}), VALID)

        assert direct == VALID_ANSWER
        assert by_default == rewriting == direct
        assert chat.tool_messages() == [f"order {ORDER}: shipped"]
        assert audit_records(tmp_path) == []

    async def test_direct_the_model_is_given_the_breaking_calls_result(
        self, chat: ScriptedChat
    ) -> None:
        final = await self.run(chat.url, BREAKING)

        [told] = chat.tool_messages()
        assert not told_why(told)
        assert final == FINAL_TEXT + told

    async def test_block_refuses_the_turn_that_replays_a_breaking_call(
        self, chat: ScriptedChat, start_proxy: ProxyFactory, tmp_path: Path
    ) -> None:
        base = await start_proxy(chat.url)

        with pytest.raises(self.refused, match="failed the replay gate"):
            await self.run(base, BREAKING)

        # Only the first turn went upstream: the tool's result for the bad call never did.
        assert len(chat.requests) == 1
        assert chat.tool_messages() == []
        # (Door 2's record of the model's breaking call, written once its answer went out, is
        # tests/server/test_chat_answers.py's.)
        [record] = replays(tmp_path)
        assert (record["action"], record["path"]) == ("block", "/v1/chat/completions")
        assert [f["reason"] for f in record["findings"]] == ["arguments_schema"]

    async def test_rewrite_tells_the_model_why_and_the_run_recovers(
        self, chat: ScriptedChat, start_proxy: ProxyFactory, tmp_path: Path
    ) -> None:
        base = await start_proxy(chat.url, gate={"action": "rewrite"})

        final = await self.run(base, BREAKING)

        assert final == VALID_ANSWER
        told, result = chat.tool_messages()
        record = json.loads(told)
        assert (record["execute"], record["check"], record["reason"]) == (
            False,
            TOOL,
            "arguments_schema",
        )
        assert [f["path"] for f in record["fail"]] == ["/order_id", "/refund"]
        assert result == f"order {ORDER}: shipped"
        records = replays(tmp_path)
        assert records
        assert {(r["action"], r["path"]) for r in records} == {("rewrite", "/v1/chat/completions")}
