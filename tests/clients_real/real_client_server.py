"""The server the real clients talk to, in a process of its own (stdio or streamable HTTP).

    python real_client_server.py --flavor mcpserver|fastmcp --store KEYS.sqlite3
        --ledger LEDGER.sqlite3 [--http]

`--flavor mcpserver` is the SDK's `MCPServer` with `@idempotent(...)` on each tool;
`--flavor fastmcp` is FastMCP with `IdempotencyMiddleware` (one per option set, chosen by
`tools=`). Both serve the same three tools, all `keys="optional"` (a keyless call runs every
time, which is what the control legs count):

- `charge(order, cents)`: key in the argument `idempotency_key`, or the `Idempotency-Key` header;
- `charge_headerless(order, cents)`: key in the argument `idempotency_key`, headers ignored
  (`key_header` left at its default, None);
- `charge_nested(order, cents)`: key in the nested argument `meta.idempotency-key`, the shape of
  the commerce protocols' MCP bindings.

Every tool body appends a row to the ledger (`tests/server/effect_server.py`'s SQLite ledger,
a file the test reads) and answers with the execution count of its order. Store and ledger are
files, so a client that starts a new server process per call (the Inspector CLI over stdio)
still hits one store and one ledger.

With `--http` the server listens on a free 127.0.0.1 port and prints `listening on URL` once the
socket accepts connections (the kernel queues them until uvicorn takes them); it stops when its
stdin closes, so a test runner that dies takes it along.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import uvicorn

from idempotency import SQLiteKeyStore, idempotent

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from effect_server import Ledger  # rows (order_id, pid, phase); here the phase is the tool

KEY_ARGUMENT = "idempotency_key"
NESTED_KEY_ARGUMENT = "meta.idempotency-key"
KEY_HEADER = "Idempotency-Key"


#: Each tool's key places (all tools: `keys="optional"`).
KEY_PLACES: dict[str, dict[str, Any]] = {
    "charge": {"key_argument": KEY_ARGUMENT, "key_header": KEY_HEADER},
    "charge_headerless": {"key_argument": KEY_ARGUMENT},
    "charge_nested": {"key_argument": NESTED_KEY_ARGUMENT},
}


def tool_bodies(ledger: Ledger) -> list[Callable[[str, int], str]]:
    """The tools' bodies, the same on both servers: one effect each, counted in the ledger."""

    def charged(tool: str, order: str, cents: int) -> str:
        return f"charged {cents} for {order} (execution {ledger.write(order, tool)})"

    def charge(order: str, cents: int) -> str:
        return charged("charge", order, cents)

    def charge_headerless(order: str, cents: int) -> str:
        return charged("charge_headerless", order, cents)

    def charge_nested(order: str, cents: int) -> str:
        return charged("charge_nested", order, cents)

    return [charge, charge_headerless, charge_nested]


def mcpserver_app(store: SQLiteKeyStore, ledger: Ledger) -> Any:
    """`MCPServer`, each tool under `@idempotent(store, ...)` with its key places."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("real-clients")
    for body in tool_bodies(ledger):
        guarded = idempotent(store, keys="optional", **KEY_PLACES[body.__name__])(body)
        server.tool()(guarded)
    return server


def fastmcp_app(store: SQLiteKeyStore, ledger: Ledger) -> Any:
    """FastMCP with one `IdempotencyMiddleware` per tool (`tools=`), for its key places."""
    from fastmcp import FastMCP

    from idempotency.fastmcp import IdempotencyMiddleware

    server: FastMCP[Any] = FastMCP("real-clients")
    for body in tool_bodies(ledger):
        places = KEY_PLACES[body.__name__]
        server.add_middleware(
            IdempotencyMiddleware(store, tools=[body.__name__], keys="optional", **places)
        )
        server.tool(body)
    return server


def _stop_when_stdin_closes(server: uvicorn.Server) -> None:
    def watch() -> None:
        sys.stdin.buffer.read()
        server.should_exit = True

    threading.Thread(target=watch, name="stdin-watch", daemon=True).start()


async def serve(args: argparse.Namespace) -> None:
    store = SQLiteKeyStore(args.store)
    ledger = Ledger(Path(args.ledger))
    app = (mcpserver_app if args.flavor == "mcpserver" else fastmcp_app)(store, ledger)
    try:
        if not args.http:
            await app.run_stdio_async()
            return
        asgi = app.streamable_http_app() if args.flavor == "mcpserver" else app.http_app()
        config = uvicorn.Config(
            asgi, log_level="warning", lifespan="on", timeout_graceful_shutdown=2
        )
        http = uvicorn.Server(config)
        _stop_when_stdin_closes(http)
        sock = socket.create_server(("127.0.0.1", 0))
        host, port = sock.getsockname()[:2]
        print(f"listening on http://{host}:{port}/mcp", flush=True)
        with sock:
            await http.serve(sockets=[sock])
    finally:
        with anyio.CancelScope(shield=True):
            await store.aclose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--flavor", choices=["mcpserver", "fastmcp"], required=True)
    parser.add_argument("--store", required=True, help="the SQLite key store's file")
    parser.add_argument("--ledger", required=True, help="the SQLite ledger of effects")
    parser.add_argument("--http", action="store_true", help="streamable HTTP instead of stdio")
    anyio.run(serve, parser.parse_args())


if __name__ == "__main__":
    main()
