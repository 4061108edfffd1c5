"""The SDK floor of a proxy hop: an SDK low-level server over stdio whose only handlers forward
`tools/list` and `tools/call` to one SDK session on the upstream, raw, and return what comes
back. No guard, no framework, no conversions: what any Python MCP hop costs at the least on this
machine (two SDK transports and one more process in the path), the floor the proxy's targets are
read against."""

from __future__ import annotations

from typing import Any, cast

from mcp import StdioServerParameters
from mcp.client import Client
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp_types import (
    CallToolRequest,
    CallToolRequestParams,
    ListToolsRequest,
    PaginatedRequestParams,
)
from pydantic import TypeAdapter

_RAW: Any = TypeAdapter(dict[str, Any])


async def serve_floor(upstream: list[str]) -> None:
    command, *args = upstream
    async with Client(StdioServerParameters(command=command, args=args)) as client:
        session = client.session
        server: Server[Any] = Server("sdk-floor")

        async def list_tools(ctx: Any, params: Any) -> Any:
            return await session.send_request(ListToolsRequest(params=params), _RAW)

        async def call_tool(ctx: Any, params: Any) -> Any:
            request = CallToolRequest(params=params)
            result = cast(dict[str, Any], await session.send_request(request, _RAW))
            result.setdefault("resultType", "complete")
            return result

        server.add_request_handler("tools/list", PaginatedRequestParams, list_tools)
        server.add_request_handler("tools/call", CallToolRequestParams, call_tool)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
