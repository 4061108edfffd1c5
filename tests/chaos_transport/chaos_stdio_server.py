"""A stdio MCP server for the chaos transport tests: `hit` counts executions, `count` reads them.

Run as a subprocess; the counter lives in this process, so the tests read it through `count`.
"""

from mcp.server.mcpserver import MCPServer

server = MCPServer("chaos-stdio")
executions = 0


@server.tool()
async def hit() -> int:
    global executions
    executions += 1
    return executions


@server.tool()
async def count() -> int:
    return executions


if __name__ == "__main__":
    server.run("stdio")
