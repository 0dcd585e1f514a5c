"""A deterministic, model-free Open Responses upstream built on ``fastresponses``.

The agent follows a tiny script so tests can drive it precisely:

* newest input contains ``function_call_output`` item(s) -> assistant message
  ``tool said: <output>`` (one line per output, in input order);
* the request declares function tools (and ``tool_choice`` is not ``"none"``)
  -> one ``function_call`` item per call. By default it calls the first tool
  (or the one forced via ``tool_choice``); arguments are ``{"region":"apac"}``
  for ``get_latest_sales_report`` and ``{}`` otherwise. Each line of the last
  user message of the form ``call TOOL with JSON`` overrides this and yields
  one call per matching line (so several lines give parallel calls);
* otherwise -> assistant message ``echo: <last user text>``.

Text is streamed as several ``TextDelta`` chunks, usage is always reported,
and a (non-streamed) ``reasoning`` item with a summary is emitted first when
the request sets ``reasoning.summary``. Requests without ``model`` are
rejected with HTTP 400 (like OpenAI) unless ``require_model=False`` /
``--allow-missing-model``. ``--api-key KEY`` makes every route except
``/health`` require ``Authorization: Bearer KEY`` (default: no auth).
``serve_in_thread()`` runs it in-process on a free port for pytest fixtures.

Run it with::

    python -m tests.servers.scripted_agent --host 127.0.0.1 --port 8123

Readiness: ``GET /health`` returns ``{"status": "ok", "adapter": "scripted"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI
from fastresponses import (
    AdapterError,
    AgentAdapter,
    AgentRun,
    ItemAdded,
    ItemDone,
    TextDelta,
    UsageDelta,
    create_app,
)
from fastresponses.models import (
    FunctionCallItem,
    ReasoningItem,
    SummaryText,
    new_function_call_id,
    new_reasoning_id,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "DEFAULT_ARGUMENTS",
    "REASONING_SUMMARY",
    "ScriptedAgent",
    "create_scripted_app",
    "main",
    "serve_in_thread",
]

#: Default ``arguments`` per tool name; any other tool gets ``{}``.
DEFAULT_ARGUMENTS: dict[str, str] = {"get_latest_sales_report": '{"region":"apac"}'}

#: Summary text of the reasoning item emitted when ``reasoning.summary`` is requested.
REASONING_SUMMARY = "Scripted reasoning: following the script."

_CALL_LINE = re.compile(r"^\s*call\s+(?P<name>\S+)\s+with\s+(?P<args>.+?)\s*$", re.IGNORECASE)
_CHUNK = re.compile(r"\S+\s*|\s+")
_MIN_CHUNKS = 3


def _field(item: Any, name: str) -> Any:
    """Read ``name`` from a fastresponses item (pydantic model) or a plain dict."""
    if isinstance(item, dict):
        return item.get(name)
    return getattr(item, name, None)


def _message_text(item: Any) -> str:
    content = _field(item, "content")
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content or []:
        text = _field(part, "text")
        if isinstance(text, str):
            parts.append(text)
    return "".join(parts)


def _last_user_text(items: Sequence[Any]) -> str | None:
    for item in reversed(items):
        if _field(item, "type") in ("message", None) and _field(item, "role") == "user":
            return _message_text(item)
    return None


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    texts = [_field(part, "text") for part in output or []]
    if texts and all(isinstance(text, str) for text in texts):
        return "".join(str(text) for text in texts)
    return json.dumps(output, separators=(",", ":"), default=str)


def _chunks(text: str) -> list[str]:
    """Split ``text`` into several delta chunks (at least 3 when possible)."""
    chunks = _CHUNK.findall(text)
    if len(chunks) >= _MIN_CHUNKS or len(text) < _MIN_CHUNKS:
        return chunks or [text]
    size = -(-len(text) // _MIN_CHUNKS)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _approx_tokens(text: str) -> int:
    return max(1, len(text.split()))


def _context_text(items: Sequence[Any]) -> str:
    texts: list[str] = []
    for item in items:
        kind = _field(item, "type")
        if kind == "message":
            texts.append(_message_text(item))
        elif kind == "function_call_output":
            texts.append(_output_text(_field(item, "output")))
        elif kind == "function_call":
            texts.append(str(_field(item, "arguments") or ""))
    return " ".join(texts)


class ScriptedAgent(AgentAdapter):  # type: ignore[misc]  # fastresponses is untyped
    """Model-free agent adapter with the scripted behaviour described above."""

    name = "scripted"
    default_model = "scripted-agent"

    def __init__(self, *, chunk_delay: float = 0.0, require_model: bool = False) -> None:
        self.chunk_delay = chunk_delay
        self.require_model = require_model
        self._calls = itertools.count(1)

    def new_call_id(self) -> str:
        return f"call_{next(self._calls)}_{secrets.token_hex(4)}"

    def plan_calls(self, run: AgentRun) -> list[tuple[str, str]]:
        """``(name, arguments)`` pairs to call, or ``[]`` to answer with text."""
        request = run.request
        tools = [t.name for t in request.function_tools()]
        tool_choice = request.tool_choice
        if not tools or tool_choice == "none":
            return []
        user_text = _last_user_text(run.context_items) or ""
        overrides = [
            (m["name"], m["args"])
            for m in map(_CALL_LINE.match, user_text.splitlines())
            if m is not None
        ]
        if overrides:
            return overrides
        forced = _field(tool_choice, "name")
        name = forced if isinstance(forced, str) and forced else tools[0]
        return [(name, DEFAULT_ARGUMENTS.get(name, "{}"))]

    async def _pause(self) -> None:
        if self.chunk_delay > 0:
            await asyncio.sleep(self.chunk_delay)

    async def _stream_text(self, text: str) -> AsyncIterator[Any]:
        for chunk in _chunks(text):
            await self._pause()
            yield TextDelta(delta=chunk)

    async def run(self, run: AgentRun) -> AsyncIterator[Any]:
        request = run.request
        if self.require_model and not request.model:
            # HTTP requests are rejected earlier by RequireModelMiddleware; this
            # covers the WebSocket transport (answered with an error envelope).
            raise AdapterError(
                "The 'model' parameter is required.",
                type="invalid_request",
                code="missing_required_parameter",
                param="model",
            )
        reasoning = request.reasoning
        if reasoning is not None and reasoning.summary is not None:
            # Built by hand rather than via ReasoningDelta: the engine's own
            # reasoning item has ``content: null`` / ``encrypted_content: null``,
            # which the spec's ReasoningBody schema rejects.
            reasoning_id = new_reasoning_id()
            yield ItemAdded(
                item=ReasoningItem(
                    id=reasoning_id,
                    status="in_progress",
                    summary=[],
                    content=[],
                    encrypted_content="",
                )
            )
            yield ItemDone(
                item=ReasoningItem(
                    id=reasoning_id,
                    status="completed",
                    summary=[SummaryText(text=REASONING_SUMMARY)],
                    content=[],
                    encrypted_content="",
                )
            )

        outputs = [
            _output_text(_field(item, "output"))
            for item in run.new_items
            if _field(item, "type") == "function_call_output"
        ]
        produced: str
        if outputs:
            produced = "\n".join(f"tool said: {output}" for output in outputs)
            async for delta in self._stream_text(produced):
                yield delta
        elif calls := self.plan_calls(run):
            produced = ""
            for name, arguments in calls:
                item_id = new_function_call_id()
                call_id = self.new_call_id()
                await self._pause()
                yield ItemAdded(
                    item=FunctionCallItem(
                        id=item_id,
                        call_id=call_id,
                        name=name,
                        arguments="",
                        status="in_progress",
                    )
                )
                yield ItemDone(
                    item=FunctionCallItem(
                        id=item_id,
                        call_id=call_id,
                        name=name,
                        arguments=arguments,
                        status="completed",
                    )
                )
                produced += arguments
        else:
            user_text = _last_user_text(run.context_items)
            produced = f"echo: {user_text if user_text is not None else '(no user message)'}"
            async for delta in self._stream_text(produced):
                yield delta

        input_tokens = _approx_tokens(_context_text(run.context_items))
        output_tokens = _approx_tokens(produced)
        yield UsageDelta(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            total_tokens=input_tokens + output_tokens,
        )


_MISSING_MODEL_BODY = json.dumps(
    {
        "error": {
            "type": "invalid_request",
            "code": "missing_required_parameter",
            "message": "The 'model' parameter is required.",
            "param": "model",
        }
    },
    separators=(",", ":"),
).encode()


class RequireModelMiddleware:
    """Reject ``POST /v1/responses`` bodies without ``model`` (HTTP 400).

    The body is read once and replayed to the wrapped app unchanged. When
    ``api_key`` is set, unauthenticated requests are passed through untouched
    so the app answers 401 first (auth errors take precedence).
    """

    def __init__(self, app: ASGIApp, api_key: str | None = None) -> None:
        self.app = app
        self.api_key = api_key

    def _authorized(self, scope: Scope) -> bool:
        if self.api_key is None:
            return True
        for key, value in scope.get("headers", []):
            if key.lower() == b"authorization":
                token = value.decode("latin-1").removeprefix("Bearer ").strip()
                return bool(token == self.api_key)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"].rstrip("/") != "/v1/responses"
            or not self._authorized(scope)
        ):
            await self.app(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, receive, send)  # client went away; let the app see it
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        if isinstance(payload, dict) and not payload.get("model"):
            await send(
                {
                    "type": "http.response.start",
                    "status": 400,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(_MISSING_MODEL_BODY)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": _MISSING_MODEL_BODY})
            return

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def create_scripted_app(
    *,
    api_key: str | None = None,
    require_model: bool = True,
    chunk_delay: float = 0.0,
) -> FastAPI:
    """Build the FastAPI app (HTTP + SSE + WebSocket on ``/v1/responses``).

    ``api_key``: when set, requests need ``Authorization: Bearer <api_key>``.
    """
    agent = ScriptedAgent(chunk_delay=chunk_delay, require_model=require_model)
    app: FastAPI = create_app(agent, api_key=api_key)
    if require_model:
        app.add_middleware(RequireModelMiddleware, api_key=api_key)
    return app


@contextlib.contextmanager
def serve_in_thread(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    require_model: bool = True,
    chunk_delay: float = 0.0,
    startup_timeout: float = 10.0,
) -> Iterator[str]:
    """Serve the scripted agent in a background thread; yields ``http://host:port/v1``."""
    app = create_scripted_app(api_key=api_key, require_model=require_model, chunk_delay=chunk_delay)
    with serve_asgi_in_thread(
        app, host=host, port=port, startup_timeout=startup_timeout, name="scripted-agent"
    ) as base:
        yield f"{base}/v1"


@contextlib.contextmanager
def serve_asgi_in_thread(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    lifespan: Literal["on", "off"] = "off",
    startup_timeout: float = 10.0,
    name: str = "asgi",
) -> Iterator[str]:
    """Serve an ASGI app with uvicorn in a background thread; yields ``http://host:port``."""
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", ws="websockets-sansio", lifespan=lifespan
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(timeout=startup_timeout)
            raise RuntimeError("scripted agent server failed to start")
        time.sleep(0.01)
    bound_port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound_port}"
    finally:
        server.should_exit = True
        thread.join(timeout=startup_timeout)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.servers.scripted_agent",
        description="Serve the scripted Open Responses agent (fastresponses).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument(
        "--api-key",
        default=None,
        help="Require 'Authorization: Bearer <key>' (default: no auth).",
    )
    parser.add_argument(
        "--allow-missing-model",
        action="store_true",
        help="Accept requests without 'model' instead of answering HTTP 400.",
    )
    parser.add_argument(
        "--chunk-delay",
        type=float,
        default=0.0,
        help="Seconds to sleep before each streamed chunk / tool call (default: 0).",
    )
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    app = create_scripted_app(
        api_key=args.api_key,
        require_model=not args.allow_missing_model,
        chunk_delay=args.chunk_delay,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        ws="websockets-sansio",
        lifespan="off",
    )


if __name__ == "__main__":
    main()
