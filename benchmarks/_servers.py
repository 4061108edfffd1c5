"""The MCP servers the call-level benchmarks talk to: one guarded tool and its unwrapped twin.

Both tools do the same work (return the text they are given, optionally after a pause), so the
difference between calling `keyed` and `plain` is exactly what `@idempotent` adds.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

import anyio
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp_types import RequestParamsMeta, ToolAnnotations

from idempotency import KeyStore, idempotent, wire

SERVER_NAME = "bench"


def bench_server(store: KeyStore, **options: Any) -> MCPServer:
    """Tools: `plain` (unwrapped), `keyed` (guarded), `slow` (guarded, sleeps `seconds`).

    `plain` and `keyed` return `text` followed by `size` filler characters, so the result size
    is chosen by the caller without a large argument."""
    server = MCPServer(SERVER_NAME, log_level="WARNING")
    hint = ToolAnnotations(idempotent_hint=True)

    @server.tool(annotations=hint)
    async def plain(text: str, size: int = 0) -> str:
        return text + "x" * size

    @server.tool(annotations=hint)
    @idempotent(store, **options)
    async def keyed(text: str, size: int = 0) -> str:
        return text + "x" * size

    @server.tool(annotations=hint)
    @idempotent(store, **options)
    async def slow(text: str, seconds: float) -> str:
        await anyio.sleep(seconds)
        return text

    return server


def key_meta(key: str) -> RequestParamsMeta:
    return cast(RequestParamsMeta, {wire.KEY_META: key})


@asynccontextmanager
async def serve_http(
    server: MCPServer, *, app_wrapper: Callable[[Any], Any] | None = None, **app_options: Any
) -> AsyncIterator[str]:
    """Serve `server` over streamable HTTP with uvicorn on 127.0.0.1 in this event loop; yields
    the endpoint URL. `app_wrapper` wraps the ASGI app (e.g. an outage switch)."""
    app = server.streamable_http_app(**app_options)
    if app_wrapper is not None:
        app = app_wrapper(app)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2, access_log=False
    )
    web = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: web.serve(sockets=[sock]))
        try:
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            web.should_exit = True
    sock.close()
