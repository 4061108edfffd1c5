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

Every tool body appends a row to the ledger (a SQLite file the test reads) and answers with the
execution count of its order. Stores and ledger are files, so a client that starts a new server
process per call (the Inspector CLI over stdio) still hits one store and one ledger.

With `--http` the server listens on a free 127.0.0.1 port and prints `listening on URL` once the
socket accepts connections (the kernel queues them until uvicorn takes them); it stops when its
stdin closes, so a test runner that dies takes it along.
"""

from __future__ import annotations

import argparse
import os
import socket
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import uvicorn

from idempotency import SQLiteKeyStore, idempotent

KEY_ARGUMENT = "idempotency_key"
NESTED_KEY_ARGUMENT = "meta.idempotency-key"
KEY_HEADER = "Idempotency-Key"


class Ledger:
    """Effects as rows in a SQLite file: what ran, whatever the server answered."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS effects"
                " (id INTEGER PRIMARY KEY, tool TEXT, order_id TEXT, cents INTEGER, pid INTEGER)"
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    def write(self, tool: str, order: str, cents: int) -> int:
        """Append an effect; returns how many effects this order has had now."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "INSERT INTO effects (tool, order_id, cents, pid) VALUES (?, ?, ?, ?)",
                (tool, order, cents, os.getpid()),
            )
            (count,) = db.execute(
                "SELECT COUNT(*) FROM effects WHERE order_id = ?", (order,)
            ).fetchone()
            db.execute("COMMIT")
            return int(count)
        finally:
            db.close()


def mcpserver_app(store: SQLiteKeyStore, ledger: Ledger) -> Any:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("real-clients")

    @server.tool()
    @idempotent(store, keys="optional", key_argument=KEY_ARGUMENT, key_header=KEY_HEADER)
    def charge(order: str, cents: int) -> str:
        return f"charged {cents} for {order} (execution {ledger.write('charge', order, cents)})"

    @server.tool()
    @idempotent(store, keys="optional", key_argument=KEY_ARGUMENT)
    def charge_headerless(order: str, cents: int) -> str:
        done = ledger.write("charge_headerless", order, cents)
        return f"charged {cents} for {order} (execution {done})"

    @server.tool()
    @idempotent(store, keys="optional", key_argument=NESTED_KEY_ARGUMENT)
    def charge_nested(order: str, cents: int) -> str:
        done = ledger.write("charge_nested", order, cents)
        return f"charged {cents} for {order} (execution {done})"

    return server


def fastmcp_app(store: SQLiteKeyStore, ledger: Ledger) -> Any:
    from fastmcp import FastMCP

    from idempotency.fastmcp import IdempotencyMiddleware

    server: FastMCP[Any] = FastMCP("real-clients")
    places: list[tuple[list[str], dict[str, Any]]] = [
        (["charge"], {"key_argument": KEY_ARGUMENT, "key_header": KEY_HEADER}),
        (["charge_headerless"], {"key_argument": KEY_ARGUMENT}),
        (["charge_nested"], {"key_argument": NESTED_KEY_ARGUMENT}),
    ]
    for tools, options in places:
        server.add_middleware(IdempotencyMiddleware(store, tools=tools, keys="optional", **options))

    @server.tool
    def charge(order: str, cents: int) -> str:
        return f"charged {cents} for {order} (execution {ledger.write('charge', order, cents)})"

    @server.tool
    def charge_headerless(order: str, cents: int) -> str:
        done = ledger.write("charge_headerless", order, cents)
        return f"charged {cents} for {order} (execution {done})"

    @server.tool
    def charge_nested(order: str, cents: int) -> str:
        done = ledger.write("charge_nested", order, cents)
        return f"charged {cents} for {order} (execution {done})"

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
