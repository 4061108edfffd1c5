"""A stdio upstream whose one tool answers outside the output schema it lists, with an effect
ledger: `python misfit_server.py LEDGER`. `count` appends its text to LEDGER (fsynced before it
answers) and answers `{"n": "not a number"}` against its schema's integer `n`: an upstream that
breaks its own contract, which the proxy passes on as sent and must not blame on an operator."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fastmcp import FastMCP
from fastmcp.tools import Tool
from fastmcp.tools.base import ToolResult
from mcp_types import TextContent

LEDGER = Path(sys.argv[1])
server = FastMCP("misfit")
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def count(text: str) -> ToolResult:
    """Append `text` to the ledger; answer outside the listed schema."""
    with LEDGER.open("a") as ledger:
        ledger.write(text + "\n")
        ledger.flush()
        os.fsync(ledger.fileno())
    return ToolResult(
        content=[TextContent(type="text", text="counted")],
        structured_content={"n": "not a number"},
    )


server.add_tool(Tool.from_function(count, output_schema=SCHEMA))

if __name__ == "__main__":
    server.run(transport="stdio", show_banner=False)
