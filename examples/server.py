"""The example MCP server, runnable: `uv run python examples/server.py [--stdio] [--store URL]`.

Its three tools (a payment, an upsert, a read) are written in `mcp_once/_cli/_example_server.py`
so that `mcp-once serve-example` ships them too; what a server author writes looks like this:

    store = open_store("redis://localhost:6379/0")    # or sqlite:///keys.db, memory://
    server = MCPServer("shop")

    @server.tool()              # the SDK's decorator on top...
    @idempotent(store)          # ...the guard under it: at most one run per key, replays after
    async def charge(order_id: str, cents: int) -> dict: ...

This script only picks the store and the transport.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

from idempotency import open_store
from mcp_once._cli._example_server import build_server

# The embedded durable default: a SQLite file in ./.mcp-once/. Records survive a restart, so a
# client retrying across a server restart still gets its replay.
DEFAULT_STORE = "sqlite:///.mcp-once/keys.sqlite3"


def options(description: str) -> argparse.Namespace:
    """The command line of the example servers (this one and examples/fastmcp_server.py)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--stdio", action="store_true", help="serve on stdin/stdout, not HTTP")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--store",
        default=os.environ.get("MCP_ONCE_STORE", DEFAULT_STORE),
        help=f"key store URL (default: $MCP_ONCE_STORE if set, else {DEFAULT_STORE})",
    )
    args = parser.parse_args()
    if args.store == DEFAULT_STORE:
        Path(".mcp-once").mkdir(exist_ok=True)
    return args


def main() -> None:
    args = options(__doc__.splitlines()[0])
    server = build_server(open_store(args.store))
    if args.stdio:
        server.run("stdio")  # a client spawns us (see examples/stdio_pair.py)
    else:
        # Streamable HTTP at http://HOST:PORT/mcp (see examples/client_http.py).
        server.run("streamable-http", host=args.host, port=args.port)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the server has shut down cleanly
        main()
