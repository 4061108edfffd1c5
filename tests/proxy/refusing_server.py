"""A stdio upstream whose one tool the SDK's low-level server refuses with a JSON-RPC error
unless asked right: `python refusing_server.py LEDGER`. `pay(amount)` appends `amount` to
LEDGER (fsynced before it answers) when `amount` is positive, and answers a negative one with
JSON-RPC -32602 (code, message and data as the caller must get them), nothing appended: the
upstream's own refusal, which a framework server turns into an `isError` result instead."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp import MCPError
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
)

LEDGER = Path(sys.argv[1])
PAY = Tool(
    name="pay", input_schema={"type": "object", "properties": {"amount": {"type": "number"}}}
)


async def list_tools(ctx: Any, params: Any) -> ListToolsResult:
    return ListToolsResult(tools=[PAY])


async def call_tool(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
    amount = (params.arguments or {}).get("amount", 0)
    if amount <= 0:
        raise MCPError(INVALID_PARAMS, "amount must be positive", {"amount": amount})
    _append(f"{amount}\n")
    return CallToolResult(content=[TextContent(type="text", text=f"paid {amount}")])


def _append(line: str) -> None:
    with LEDGER.open("a") as ledger:
        ledger.write(line)
        ledger.flush()
        os.fsync(ledger.fileno())


async def main() -> None:
    server: Server[Any] = Server("refusing")
    server.add_request_handler("tools/list", PaginatedRequestParams, list_tools)
    server.add_request_handler("tools/call", CallToolRequestParams, call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
