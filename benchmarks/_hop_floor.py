"""The SDK floor of a proxy hop: an SDK low-level server whose only handlers forward `tools/list`
and `tools/call` to one SDK session on the upstream, raw, and return what comes back. No guard,
no framework, no conversions: what any Python MCP hop costs at the least on this machine (two SDK
transports and one more process in the path), the floor the proxy's targets are read against.

Two fronts: stdio in front of the stdio upstream (`serve_floor`), and streamable HTTP (the SDK's
own `streamable_http_app` under uvicorn, as `--listen` serves) in front of the upstream served
over streamable HTTP or over stdio (`serve_http_floor`), whose one client session speaks the
handshake era as the benchmark's client does (the SDK's own HTTP client, python-sdk#2712 and
all)."""

from __future__ import annotations

from typing import Any, cast

from mcp import StdioServerParameters
from mcp.client import Client
from mcp.client.session import ClientSession
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


def _forwarding(session: ClientSession) -> Server[Any]:
    """The low-level server whose two handlers forward to `session`, raw."""
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
    return server


async def serve_floor(upstream: list[str]) -> None:
    command, *args = upstream
    async with Client(StdioServerParameters(command=command, args=args)) as client:
        server = _forwarding(client.session)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())


async def serve_http_floor(upstream: str | list[str], port: int) -> None:
    """The SDK's own streamable HTTP front on `port`, forwarding to `upstream`: a URL (the
    upstream served over HTTP) or a command line (the stdio upstream, as supergateway and
    mcp-proxy front it)."""
    import uvicorn

    target: str | StdioServerParameters = (
        upstream
        if isinstance(upstream, str)
        else StdioServerParameters(command=upstream[0], args=upstream[1:])
    )
    async with Client(target, mode="legacy") as client:
        app = _forwarding(client.session).streamable_http_app()
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        await uvicorn.Server(config).serve()
