"""The AI SDK (Node) with `@ai-sdk/openai-compatible`: `generateText` with one tool, direct and
through the proxy (the matrix is tests/server/chat_loops.py). A refused request is the SDK's
`APICallError`, raised here as `Refused`."""

from __future__ import annotations

from tests.server.aisdk import run_script
from tests.server.chat_loops import ChatClientLoops

# The exit status chat_run.mjs gives an APICallError.
REFUSED = 3


class Refused(Exception):
    """The SDK's APICallError for a 400 answer, with the answer's message."""


async def generate_text(base: str, prompt: str) -> str:
    status, out, err = await run_script("chat_run.mjs", "openai-compatible", base + "/v1", prompt)
    text = out.removesuffix("\n")
    if status == REFUSED:
        code, _, message = text.removeprefix("refused ").partition(": ")
        assert code == "400", text
        raise Refused(message)
    assert status == 0, err
    return text


class TestAISDK(ChatClientLoops):
    refused = Refused

    async def run(self, base: str, prompt: str) -> str:
        return await generate_text(base, prompt)
