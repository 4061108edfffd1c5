"""An upstream for the front's tests, with an effect ledger: `python gated_server.py LEDGER` (stdio)
or `python gated_server.py LEDGER --headers FILE` (streamable HTTP on a free loopback port,
printing `gated server at URL` on stdout once it listens, and appending the headers of every
request it receives to FILE, one JSON object a line).

- `write(text)` appends `text` to LEDGER (fsynced before it answers: what is counted happened);
- `hold(name)` appends `started NAME`, then waits until `release()` is called: a call that stays
  in flight for as long as a test needs;
- `release()` lets every held call finish;
- `peek()` is read-only (passed through by the proxy, unguarded).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from fastmcp import FastMCP
from mcp_types import ToolAnnotations
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

LEDGER = Path(sys.argv[1])
server = FastMCP("gated")
released = anyio.Event()


def _append(line: str) -> None:
    with LEDGER.open("a") as ledger:
        ledger.write(line + "\n")
        ledger.flush()
        os.fsync(ledger.fileno())


@server.tool
def write(text: str) -> str:
    """Append `text` to the ledger."""
    _append(text)
    return f"wrote {text}"


@server.tool
async def hold(name: str) -> str:
    """Append `started NAME` to the ledger, then wait for `release`."""
    _append(f"started {name}")
    await released.wait()
    return f"held {name}"


@server.tool
def release() -> str:
    """Let every held call finish."""
    released.set()
    return "released"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def peek() -> str:
    """Read-only: how many lines the ledger has."""
    return str(len(LEDGER.read_text().splitlines()) if LEDGER.exists() else 0)


class HeaderLog:
    """Appends each HTTP request's headers to a file: what the upstream was sent."""

    def __init__(self, app: ASGIApp, path: str) -> None:
        self.app = app
        self.path = Path(path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers: dict[str, Any] = {}
            for name, value in scope["headers"]:
                headers.setdefault(name.decode().lower(), []).append(value.decode())
            with self.path.open("a") as log:
                log.write(json.dumps(headers) + "\n")
        await self.app(scope, receive, send)


async def serve_http(headers: str) -> None:
    app = server.http_app(middleware=[Middleware(HeaderLog, path=headers)])
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    print(f"gated server at http://127.0.0.1:{port}/mcp", flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    with sock:
        await uvicorn.Server(config).serve(sockets=[sock])


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[2] == "--headers":
        anyio.run(serve_http, sys.argv[3])
    else:
        server.run(transport="stdio", show_banner=False)
