"""`mcp-once serve-example`: the example server over streamable HTTP, on any key store.

The store is checked before the port opens: a server that listens while its store is down would
refuse every guarded call (fail closed), which is harder to diagnose than a refusal to start.
"""

from __future__ import annotations

import argparse
import socket
import sys
from typing import Any

import anyio

from ._common import (
    DEFAULT_STORE_URL,
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    add_store_option,
    fail,
    open_or_fail,
    redacted,
    store_problem,
)


def add_parser(commands: Any) -> None:
    serve = commands.add_parser(
        "serve-example",
        help="run the example server (charge, set_shipping_address, list_charges) over HTTP",
        description="Run the example MCP server over streamable HTTP at http://HOST:PORT/mcp.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (%(default)s)")
    serve.add_argument(
        "--port", type=int, default=8000, help="port to listen on; 0 picks a free one (%(default)s)"
    )
    add_store_option(serve)
    serve.set_defaults(run=run)


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, opened here so that a busy port is a clear error, not a log line.

    With TCP_NODELAY, which accepted connections inherit: asyncio sets it itself only on sockets
    whose `proto` reads IPPROTO_TCP, and `create_server` leaves `proto` 0, so without this every
    answer of a server handed this socket waited out Nagle's algorithm against the client's
    delayed ACK (~40 ms per small response on Linux, measured by benchmarks/proxy.py)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        sock = socket.create_server((host, port), family=family[0][0])
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}", EXIT_PROBLEM)


async def serve_on(app: Any, host: str, port: int, what: str, store: str) -> None:
    """Serve the ASGI `app` over HTTP until interrupted, announcing on stderr where, once the
    socket listens (so a script or test reads the port, 0 picking a free one, without polling).

    uvicorn parses HTTP with h11, not httptools (C, ~7 % less CPU per call): httptools answers
    400 to a request whose header value holds a tab, which HTTP allows, where h11 lets the guard
    answer it (a key that is not printable ASCII is -32602, with its reason). Its access log is
    off (at the "warning" level it never printed a line, but each response still built the log
    call): benchmarks/README.md, issue 46, "The --listen front"."""
    import uvicorn  # a dependency of mcp itself; imported here to keep other commands light

    sock = _listen(host, port)
    bound, number = sock.getsockname()[:2]
    shown = f"[{bound}]" if ":" in bound else bound
    print(f"{what} at http://{shown}:{number}/mcp (store: {store})", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", http="h11", access_log=False)
    with sock:
        await uvicorn.Server(config).serve(sockets=[sock])


def _ensure_default_directory(url: str) -> None:
    # The embedded default lives in ./.mcp-once/; any other SQLite path is the user's to create
    # (a typo should not silently create directories).
    if url == DEFAULT_STORE_URL:
        from pathlib import Path

        Path(url.removeprefix("sqlite:///")).parent.mkdir(exist_ok=True)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        fail(f"--port must be between 0 and 65535, not {args.port}", EXIT_USAGE)
    _ensure_default_directory(args.store)
    from ._example_server import build_server  # the MCP SDK: loaded by the command, not `--help`

    store = open_or_fail(args.store)
    server = build_server(store)
    app = server.streamable_http_app(host=args.host)

    async def serve() -> int:
        try:
            problem = await store_problem(store, args.store)
            if problem is not None:
                print(f"mcp-once: {problem}", file=sys.stderr)
                return EXIT_UNREACHABLE
            await serve_on(
                app, args.host, args.port, "mcp-once example server", redacted(args.store)
            )
            return EXIT_OK
        finally:
            with anyio.CancelScope(shield=True):
                await store.aclose()

    try:
        return anyio.run(serve)
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled, after a clean shutdown
        return EXIT_OK


__all__ = ["add_parser", "run", "serve_on"]
