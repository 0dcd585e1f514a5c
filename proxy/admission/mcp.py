"""The MCP dialect: a JSON-RPC message to an MCP server (Streamable HTTP, `/mcp/<server>`) shown
to the gate in the Open Responses vocabulary, and the gate's verdict answered in JSON-RPC.

Each `tools/call` is a `function_call` in the namespace of its server (`<server>/<tool>`, as a pin
names it; a pin by the bare name holds too) with its `params.arguments` as the call's arguments,
answered by an output so that the gate judges it; the tools are those the session's
`tools/list` gave, read from the ledger's store before the body is judged (`load`, see
`proxy.state.tool_lists`). Other messages are not shown: they pass.

A call that fails is never forwarded under `rewrite` or `block`: the proxy answers it itself,
with a `CallToolResult` whose `isError` is true, its text the failure record's sentence and its
`structuredContent` the record (in `_meta["replay-proxy/failure"]` when the tool declares an
`outputSchema`, which a client may hold any structuredContent to): the client's model is told
why and may call again; or with the JSON-RPC error -32602 whose `data`
holds the findings. A batch (an array) goes upstream only when every element is a message the
gate can read and no call in it is refused; else it is refused whole with -32600.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from proxy.admission import body
from proxy.gate import items
from proxy.gate.call_limits import MCP_LIMITS, CallLimits
from proxy.gate.errors import ProxyError
from proxy.gate.records import failure_record
from proxy.state.tool_lists import Listed, SessionKey, ToolLists

if TYPE_CHECKING:
    from proxy.gate.findings import Finding
    from proxy.gate.pairing import Recorded
    from proxy.gate.verdict import Verdict

# The metrics' route of every MCP server's path, and its dialect label.
ROUTE = "mcp"
LABEL = "mcp"
PREFIX = "/mcp/"
MESSAGES = "mcp"
BATCH = "batch"
TOOLS_CALL = "tools/call"
TOOLS_LIST = "tools/list"
LIST_CHANGED = "notifications/tools/list_changed"
# Where a rewritten call's failure record is when the tool declares an outputSchema.
FAILURE_META = "replay-proxy/failure"
# JSON-RPC 2.0's codes.
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603


@dataclass(frozen=True, slots=True)
class Asked:
    """A request of the body whose answer the tap watches: a tools/list (`first`: asked without
    a cursor, so its result starts the list again) or a tools/call (of tool `name`)."""

    method: str
    name: str | None = None
    first: bool = False


def server_of(path: str) -> str | None:
    """The server name of an MCP path (`/mcp/<name>`), or None for another path."""
    if not path.startswith(PREFIX):
        return None
    name = path[len(PREFIX) :]
    return name if name and "/" not in name else None


def unserved(path: str, servers: Collection[str]) -> bool:
    """Whether `path` is under `/mcp/` where the proxy serves MCP servers (`servers`, the
    config's `mcp.servers`) but names none of them: answered 404 by the proxy, never sent
    to the model's upstream. With no server configured, `/mcp/` is no path of the proxy's."""
    return bool(servers) and path.startswith(PREFIX) and server_of(path) not in servers


class McpCalls:
    """The messages of one request to an MCP server, as admission reads them: the tools of
    its session's list at hand (`listed`)."""

    records = False
    label = LABEL
    websocket = False
    continues = False

    def __init__(self, server: str, lists: ToolLists, key: SessionKey) -> None:
        self.server = server
        self.lists = lists
        self.key = key
        # The called tools of the session's list (`load`); None: it could not be read and the
        # ledger fails open, so the calls go unjudged.
        self.listed: Mapping[str, Listed] | None = {}
        # The requests of the body whose answers the tap watches, by JSON-RPC id (`load`).
        self.asked: Mapping[Any, Asked] = {}
        self.paths: Mapping[str, str] = {PREFIX + server: ROUTE}

    async def load(self, parsed: Mapping[str, Any]) -> None:
        """The tools the body calls, as the session's list names them: one read of the store
        when it calls any; and the requests whose answers the tap watches. Raises
        LedgerFault."""
        self.asked = _asked(parsed)
        names = {
            name
            for message in parsed[MESSAGES]
            if isinstance(message, dict) and message.get("method") == TOOLS_CALL
            if isinstance(params := message.get("params"), dict)
            if isinstance(name := params.get("name"), str)
        }
        if names:
            self.listed = await self.lists.tools(self.key, names)

    def unavailable(self, error: ProxyError) -> dict[str, Any]:
        """A fault of the proxy's in JSON-RPC terms, as Streamable HTTP has an error status
        carry one: no id, the proxy's code in `data`."""
        data = {"type": error.type, "code": error.code}
        failure = {"code": INTERNAL_ERROR, "message": error.message, "data": data}
        return {"jsonrpc": "2.0", "id": None, "error": failure}

    def parse(self, decoded: bytes) -> dict[str, Any]:
        """A message or a batch of them, as `{"mcp": [...], "batch": bool}`."""
        parsed = body.loads(decoded)
        if isinstance(parsed, dict):
            return {MESSAGES: [parsed], BATCH: False}
        if isinstance(parsed, list) and parsed:
            return {MESSAGES: parsed, BATCH: True}
        raise body.BodyError(
            400, "invalid_body", "the body must be a JSON-RPC message or a non-empty batch"
        )

    def view(self, parsed: Mapping[str, Any]) -> McpView:
        return McpView(parsed, self.server, self.listed)

    def call_limits(self, vendor: str | None) -> CallLimits:
        return MCP_LIMITS

    def compacts(self, path: str) -> bool:
        return False

    def input_items(self, parsed: Mapping[str, Any]) -> Sequence[Any]:
        return ()

    kind = staticmethod(items.kind)

    def sent(self, parsed: dict[str, Any], verdict: Verdict) -> dict[str, Any]:
        # Nothing is edited: a refused call is answered here (`answer`), the rest go as sent.
        return parsed

    def inlined(self, parsed: Mapping[str, Any], history: Sequence[Any]) -> dict[str, Any]:
        return dict(parsed)

    def answer(self, parsed: Mapping[str, Any], verdict: Verdict) -> dict[str, Any] | None:
        """The JSON-RPC answer the proxy gives itself, or None when the body goes upstream."""
        messages = parsed[MESSAGES]
        refused = [f for f in verdict.findings if f.action != "log"]
        if parsed[BATCH]:
            unread = [i for i, m in enumerate(messages) if not _readable(m)]
            if not refused and not unread:
                return None
            said = (
                f"batch element {unread[0]} is not a JSON-RPC message the proxy can judge"
                if unread
                else f"{refused[0].param}: {failure_record(refused[0])['error']}"
            )
            return _error(None, INVALID_REQUEST, said, verdict, refused)
        if not refused:
            return None
        finding = refused[0]
        asked = messages[0].get("id")
        if finding.action == "rewrite":
            record = failure_record(finding)
            result: dict[str, Any] = {"content": [{"type": "text", "text": record["error"]}]}
            listed = self.listed or {}
            tool = listed.get(finding.name) if finding.name is not None else None
            if tool is None or tool.output_schema is None:
                result["structuredContent"] = record
            else:
                # A client SDK (TypeScript's) holds any structuredContent to the tool's
                # outputSchema, a tool error's too: the record goes where it does not look.
                result["_meta"] = {FAILURE_META: record}
            result["isError"] = True
            return {"jsonrpc": "2.0", "id": asked, "result": result}
        return _error(asked, INVALID_PARAMS, failure_record(finding)["error"], verdict, refused)


class McpView:
    """The tools/calls of a body as function_calls (with an output each) in their server's
    namespace, and the tools its session listed; `located` puts findings at their message."""

    __slots__ = ("batch", "body", "places")

    def __init__(
        self, parsed: Mapping[str, Any], server: str, listed: Mapping[str, Listed] | None
    ) -> None:
        shown: list[dict[str, Any]] = []
        self.places: list[int] = []
        self.batch = bool(parsed[BATCH])
        # A list that could not be read, the ledger failing open: no call is shown.
        messages = parsed[MESSAGES] if listed is not None else ()
        for m, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("method") != TOOLS_CALL:
                continue
            params = message.get("params")
            params = params if isinstance(params, dict) else {}
            call_id = f"mcp_{m}"
            arguments = params.get("arguments", {})
            call: dict[str, Any] = {"type": items.FUNCTION_CALL, "call_id": call_id}
            call[items.NAMESPACE] = server
            call["name"] = params.get("name")
            # An object goes as its JSON text; anything else is no object, whatever its type
            # (a string too: it is never read as JSON text).
            call["arguments"] = (
                body.dumps(arguments).decode() if isinstance(arguments, dict) else [arguments]
            )
            call["status"] = "completed"
            shown += [call, {"type": items.FUNCTION_CALL_OUTPUT, "call_id": call_id, "output": ""}]
            self.places += [m, m]
        functions = [
            {"type": "function", "name": name, "parameters": tool.input_schema}
            for name, tool in (listed or {}).items()
        ]
        tools = [{"type": items.NAMESPACE, "name": server, "tools": functions}]
        self.body: dict[str, Any] = {"input": shown, "tools": tools}

    def settle(self, recorded: Recorded | None) -> None:
        return None  # a call's status is its own (`completed`): nothing is left to the ledger

    def located(self, verdict: Verdict) -> Verdict:
        """Each finding at its message (`params`, or `[i].params` in a batch), under its tool's
        own name; nothing is edited."""
        if not verdict.findings:
            return verdict
        return replace(
            verdict, findings=tuple(self._locate(f) for f in verdict.findings), input=None
        )

    def _locate(self, finding: Finding) -> Finding:
        if finding.index is None:
            return finding
        message = self.places[finding.index]
        return replace(
            finding,
            index=message,
            paired_index=message,
            param=f"[{message}].params" if self.batch else "params",
        )


def _asked(parsed: Mapping[str, Any]) -> dict[Any, Asked]:
    """The requests of a body whose answers the tap watches, by JSON-RPC id."""
    found: dict[Any, Asked] = {}
    for message in parsed[MESSAGES]:
        if not isinstance(message, dict) or not _hashable(message.get("id")):
            continue
        method, params = message.get("method"), message.get("params")
        params = params if isinstance(params, dict) else {}
        if method == TOOLS_LIST:
            found[message["id"]] = Asked(TOOLS_LIST, first=params.get("cursor") is None)
        elif method == TOOLS_CALL and isinstance(params.get("name"), str):
            found[message["id"]] = Asked(TOOLS_CALL, params["name"])
    return found


def _readable(message: Any) -> bool:
    """A JSON-RPC message the gate can judge: a request or notification with a method, or a
    response with a result or an error."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return False
    return isinstance(message.get("method"), str) or "result" in message or "error" in message


def _hashable(value: Any) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool)


def _error(
    asked: Any, code: int, message: str, verdict: Verdict, refused: Sequence[Finding]
) -> dict[str, Any]:
    listed, omitted = verdict.listed()
    data: dict[str, Any] = {"findings": [f.as_dict() for f in listed if f in refused]}
    if omitted:
        data["findings_omitted"] = omitted
    error = {"code": code, "message": message, "data": data}
    return {"jsonrpc": "2.0", "id": asked, "error": error}
