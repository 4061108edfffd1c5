"""The Python upstream of the proxy hop benchmark (`benchmarks.proxy_hop`): an SDK `MCPServer`
over stdio (with `--port`, streamable HTTP on loopback) with a read-only tool (`read`: the proxy
passes it through) and an effect (`write`: the proxy guards it), both answering at once, so what
is measured is the hop, not the work.

    python -m benchmarks._hop_upstream [--port PORT]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations


def hop_server() -> MCPServer:
    server = MCPServer("hop-upstream", log_level="WARNING")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def read(text: str) -> str:
        return text

    @server.tool()
    async def write(text: str) -> str:
        return text

    return server


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, help="serve streamable HTTP on 127.0.0.1:PORT/mcp")
    port: int | None = parser.parse_args(argv).port
    if port is None:
        hop_server().run("stdio")
    else:
        hop_server().run("streamable-http", host="127.0.0.1", port=port)


if __name__ == "__main__":
    main()
