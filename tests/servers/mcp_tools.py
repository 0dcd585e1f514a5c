"""MCP servers of the official Python SDK on Streamable HTTP, for the MCP door's tests.

`reports_server` is the high-level `MCPServer` with one typed tool; `catalog_server` is the
low-level `Server` where the tests need control the high-level one does not give: a list in
pages, a list that changes (announced on the call's own stream), a list that depends on the
caller's key, a result that breaks its own `outputSchema`. Each counts the calls it ran.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel

from tests.servers.scripted_agent import serve_asgi_in_thread


@dataclass
class Ran:
    """The tool calls a server ran, in order: (tool, arguments)."""

    calls: list[tuple[str, Any]] = field(default_factory=list)


class Report(BaseModel):
    region: str
    total: int


def reports_server(ran: Ran) -> MCPServer:
    server = MCPServer("reports")

    @server.tool()
    def get_report(region: Literal["us", "eu"], include_lines: bool = False) -> Report:
        """The sales report of a region."""
        ran.calls.append(("get_report", {"region": region, "include_lines": include_lines}))
        return Report(region=region, total=42)

    return server


def _report_tool(regions: list[str]) -> types.Tool:
    return types.Tool(
        name="get_report",
        input_schema={
            "type": "object",
            "properties": {"region": {"enum": regions}},
            "required": ["region"],
            "additionalProperties": False,
        },
    )


_TOTALS = types.Tool(
    name="totals",
    input_schema={"type": "object", "properties": {"bad": {"type": "boolean"}}},
    output_schema={
        "type": "object",
        "properties": {"total": {"type": "integer"}},
        "required": ["total"],
    },
)
_SWAP = types.Tool(name="swap", input_schema={"type": "object"})


def catalog_server(ran: Ran) -> Server[Any]:
    """Lists three tools one per page. `get_report`'s regions: `us` (and `apac` once `swap`
    ran), or `eu` alone for a caller whose key is `sk-b`."""
    state = {"swapped": False}

    def tools(ctx: Any) -> list[types.Tool]:
        request = ctx.request
        key = request.headers.get("authorization", "") if request is not None else ""
        regions = ["eu"] if key == "Bearer sk-b" else ["us", "apac"] if state["swapped"] else ["us"]
        return [_report_tool(regions), _TOTALS, _SWAP]

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        listed = tools(ctx)
        at = int(params.cursor) if params is not None and params.cursor else 0
        more = str(at + 1) if at + 1 < len(listed) else None
        return types.ListToolsResult(tools=listed[at : at + 1], next_cursor=more)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        ran.calls.append((params.name, params.arguments))
        if params.name == "swap":
            state["swapped"] = True
            await ctx.session.send_notification(
                types.ToolListChangedNotification(), related_request_id=ctx.request_id
            )
        if params.name == "totals":
            bad = (params.arguments or {}).get("bad")
            total: Any = "many" if bad else 3
            return types.CallToolResult(
                content=[types.TextContent(text=str(total))], structured_content={"total": total}
            )
        return types.CallToolResult(content=[types.TextContent(text="done")])

    return Server("catalog", on_list_tools=list_tools, on_call_tool=call_tool)


# MCP's own rule for a tool's name: 1 to 128 of A-Z, a-z, 0-9, `_`, `-` and `.`.
DOTTED = "files.read_v2-" + "x" * 100


def files_server(ran: Ran) -> MCPServer:
    """One tool, `DOTTED`, named as MCP allows and the Responses item schema does not."""
    server = MCPServer("files")

    @server.tool(name=DOTTED)
    def read(path: str) -> str:
        ran.calls.append((DOTTED, {"path": path}))
        return "contents"

    return server


# A pattern that backtracks exponentially on `a`s and a `b`, and a result that makes it.
_SLOW = types.Tool(
    name="grep",
    input_schema={"type": "object"},
    output_schema={
        "type": "object",
        "properties": {"line": {"type": "string", "pattern": "^(a|a)*$"}},
    },
)


def slow_schema_server(ran: Ran) -> Server[Any]:
    """Lists `grep`, whose outputSchema's pattern takes exponential time on the result it gives
    (the low-level server checks nothing of its own)."""

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[_SLOW])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        ran.calls.append((params.name, params.arguments))
        line = "a" * 40 + "b"
        return types.CallToolResult(
            content=[types.TextContent(text=line)], structured_content={"line": line}
        )

    return Server("slow", on_list_tools=list_tools, on_call_tool=call_tool)


@contextlib.contextmanager
def serve_mcp(server: MCPServer | Server[Any], *, json_response: bool = False) -> Iterator[str]:
    """Serve an MCP server on Streamable HTTP in a thread; yields its endpoint's URL."""
    app = server.streamable_http_app(json_response=json_response)
    with serve_asgi_in_thread(app, lifespan="on", name="mcp-server") as base:
        yield f"{base}/mcp"


def main() -> None:
    """Serve `reports_server` on 127.0.0.1 (`--port`), JSON answers (`--json`) or SSE."""
    import argparse

    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m tests.servers.mcp_tools")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    app = reports_server(Ran()).streamable_http_app(json_response=args.json)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
