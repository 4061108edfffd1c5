"""An MCP server over stdio for the kill test: the client kills this process mid-call."""

from __future__ import annotations

import os

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

from idempotency import wire

server = MCPServer("stdio-tests")


@server.tool(annotations=ToolAnnotations(idempotent_hint=True))
async def slow_first(ctx: Context) -> dict[str, object]:
    """Attempt 1 reports progress (carrying this pid) and hangs; later attempts answer."""
    meta = ctx.request_context.meta or {}
    attempt, key = meta.get(wire.ATTEMPT_META), meta.get(wire.KEY_META)
    if attempt == 1:
        await ctx.report_progress(1, 2, f"{os.getpid()} {key}")
        await anyio.sleep_forever()
    return {"pid": os.getpid(), "key": key, "attempt": attempt}


if __name__ == "__main__":
    server.run("stdio")
