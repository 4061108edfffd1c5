"""The SDK floor of a proxy hop: an SDK low-level server whose only handlers forward `tools/list`
and `tools/call` to one SDK session on the upstream, raw, and return what comes back. No guard,
no framework, no conversions: what any Python MCP hop costs at the least on this machine (two SDK
transports and one more process in the path), the floor the proxy's targets are read against.

With a store (`--store URL`), the floor of a guarding hop: the same raw forward, and around each
call of the upstream's effect tool the least a guard can do with that store
(`_servers.guard_by_hand`: claim, forward, store the result, marker). A do-nothing handler cannot
guard anything, so a guarded call's latency targets are read against this one: what any hop that
keeps a record of the call costs here, on that store, with the same fsyncs and round trips.

Two fronts: stdio in front of the stdio upstream (`serve_floor`), and streamable HTTP (the SDK's
own `streamable_http_app` under uvicorn, as `--listen` serves) in front of the upstream served
over streamable HTTP or over stdio (`serve_http_floor`), whose one client session speaks the
handshake era as the benchmark's client does (the SDK's own HTTP client, python-sdk#2712 and
all)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast

from mcp import StdioServerParameters
from mcp.client import Client
from mcp.client.session import ClientSession
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp_types import (
    CallToolRequest,
    CallToolRequestParams,
    CallToolResult,
    ListToolsRequest,
    PaginatedRequestParams,
)
from pydantic import TypeAdapter

from idempotency import CallScope, KeyStore, default_scope, open_store, wire

from ._servers import RETENTION, guard_by_hand

_RAW: Any = TypeAdapter(dict[str, Any])


@dataclass(frozen=True)
class Guarded:
    """What the guarded floor guards: calls of `tool`, their records in `store`."""

    tool: str
    store: KeyStore


@asynccontextmanager
async def guarding(tool: str, store_url: str | None) -> AsyncIterator[Guarded | None]:
    """`Guarded` on the store `store_url` names (closed at the end), or None without one."""
    if store_url is None:
        yield None
        return
    store = open_store(store_url)
    try:
        yield Guarded(tool, store)
    finally:
        await store.aclose()


def _forwarding(session: ClientSession, guarded: Guarded | None = None) -> Server[Any]:
    """The low-level server whose two handlers forward to `session`, raw; with `guarded`, calls
    of its tool carrying a key go through `guard_by_hand` around the forward."""
    server: Server[Any] = Server("sdk-floor")
    # The record's partition, named once: the guarded tool is fixed when the server is built.
    scope = (
        ""
        if guarded is None
        else default_scope(CallScope("sdk-floor", guarded.tool, None, None, None))
    )

    async def list_tools(ctx: Any, params: Any) -> Any:
        return await session.send_request(ListToolsRequest(params=params), _RAW)

    async def forward(params: CallToolRequestParams) -> dict[str, Any]:
        result = cast(
            dict[str, Any], await session.send_request(CallToolRequest(params=params), _RAW)
        )
        result.setdefault("resultType", "complete")
        return result

    async def call_tool(ctx: Any, params: CallToolRequestParams) -> Any:
        key = (params.meta or {}).get(wire.KEY_META)
        if guarded is None or params.name != guarded.tool or not isinstance(key, str):
            return await forward(params)

        async def run() -> CallToolResult:  # read once into the record's form, as the proxy does
            return CallToolResult.model_validate(await forward(params))

        return await guard_by_hand(
            guarded.store, scope, params.name, key, params.arguments or {}, run, RETENTION
        )

    server.add_request_handler("tools/list", PaginatedRequestParams, list_tools)
    server.add_request_handler("tools/call", CallToolRequestParams, call_tool)
    return server


async def serve_floor(upstream: list[str], guarded: Guarded | None = None) -> None:
    command, *args = upstream
    async with Client(StdioServerParameters(command=command, args=args)) as client:
        server = _forwarding(client.session, guarded)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())


async def serve_http_floor(
    upstream: str | list[str], port: int, guarded: Guarded | None = None
) -> None:
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
        app = _forwarding(client.session, guarded).streamable_http_app()
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        await uvicorn.Server(config).serve()
