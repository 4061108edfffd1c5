"""A real streamable HTTP MCP server on 127.0.0.1 (uvicorn in a thread), with HTTP faults.

The fault middleware answers chosen `tools/call` POSTs itself with a bare HTTP status (no
JSON-RPC body), before the MCP app sees them: what a proxy or load balancer in trouble does.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
import httpx2
import uvicorn
from mcp.server.mcpserver import MCPServer

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class HttpFaults:
    #: (status, headers) answers for successive tools/call POSTs; None lets one through.
    plan: list[tuple[int, dict[str, str]] | None] = field(default_factory=list)
    #: The answer for every tools/call POST once `plan` is used up (None: let it through).
    always: tuple[int, dict[str, str]] | None = None
    tool_posts: int = 0

    def next(self) -> tuple[int, dict[str, str]] | None:
        self.tool_posts += 1
        if self.plan:
            return self.plan.pop(0)
        return self.always


def with_faults(app: App, faults: HttpFaults) -> App:
    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if b'"tools/call"' in body and (fault := faults.next()) is not None:
            status, headers = fault
            raw = [(k.encode(), v.encode()) for k, v in headers.items()]
            await send({"type": "http.response.start", "status": status, "headers": raw})
            await send({"type": "http.response.body", "body": b"unavailable"})
            return
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, replay, send)

    return wrapped


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, ready: threading.Event) -> None:
        super().__init__(config)
        self._ready = ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self._ready.set()


class HttpServer:
    """An MCP server over streamable HTTP, startable and stoppable (same port) from a test."""

    def __init__(self, server: MCPServer, faults: HttpFaults | None = None) -> None:
        self.mcp = server
        self.faults = faults if faults is not None else HttpFaults()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self._uvicorn: _Server | None = None
        self._thread: threading.Thread | None = None
        #: Set while the server accepts connections (cleared before a stop begins).
        self.up = threading.Event()

    async def wait_up(self) -> None:
        if not self.up.is_set():
            await anyio.to_thread.run_sync(self.up.wait, abandon_on_cancel=True)

    def start(self) -> None:
        app = with_faults(self.mcp.streamable_http_app(), self.faults)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="error", lifespan="on"
        )
        ready = threading.Event()
        self._uvicorn = _Server(config, ready)
        self._thread = threading.Thread(target=self._uvicorn.run, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the HTTP test server did not start")
        self.up.set()

    def stop(self) -> None:
        """Stop at once, dropping the connections of requests in flight."""
        self.up.clear()
        if self._uvicorn is None or self._thread is None:
            return
        self._uvicorn.force_exit = True
        self._uvicorn.should_exit = True
        self._thread.join(10)
        self._uvicorn = None
        self._thread = None

    def restart(self) -> None:
        self.stop()
        self.start()


class HoldWhileDown(httpx2.AsyncBaseTransport):
    """Client side: requests made while the test server restarts wait until it is back.

    Keeps restart tests deterministic: without it, how many attempts a restart costs depends on
    how long the server takes to come back.
    """

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        await self._server.wait_up()
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()
