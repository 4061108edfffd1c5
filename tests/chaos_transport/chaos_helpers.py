"""Shared pieces for the chaos transport tests: a counting server, a loopback HTTP server."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from mcp.client.stdio import StdioServerParameters
from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, TextContent

ERAS = ["modern", "legacy"]
"""`Client(mode=...)` per era: "auto" negotiates 2026-07-28 with these servers."""

MODE = {"modern": "auto", "legacy": "legacy"}

EXPECTED_TIMEOUT = 0.1
"""Read timeout for calls whose answer the chaos withholds: they time out whatever the value."""

WAIT = 5.0
"""Upper bound on waits that end as soon as the awaited thing happens."""

STDIO_SERVER = Path(__file__).with_name("chaos_stdio_server.py")


def text(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


class CountingServer:
    """An MCPServer whose `hit` tool counts its executions (the effect the tests look for)."""

    def __init__(self) -> None:
        self.server = MCPServer("chaos-counting")
        self.executions = 0
        self.notes: list[str] = []
        self.others = 0
        self._waiters: list[tuple[int, anyio.Event]] = []

        @self.server.tool()
        async def hit(note: str = "") -> str:
            self.executions += 1
            self.notes.append(note)
            for target, event in self._waiters:
                if self.executions >= target:
                    event.set()
            return str(self.executions)

        @self.server.tool()
        async def other() -> str:
            self.others += 1
            return "other"

    async def executed(self, count: int) -> None:
        """Return once `hit` has run `count` times (in-process servers only: same event loop)."""
        if self.executions >= count:
            return
        event = anyio.Event()
        self._waiters.append((count, event))
        with anyio.fail_after(WAIT):
            await event.wait()


def stdio_params() -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(STDIO_SERVER)])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class HttpServer:
    counting: CountingServer
    url: str


@contextmanager
def http_server() -> Iterator[HttpServer]:
    """A CountingServer over streamable HTTP on 127.0.0.1, served by uvicorn in its own thread."""
    counting = CountingServer()
    with serve_in_thread(counting.server.streamable_http_app) as url:
        yield HttpServer(counting, url)


@contextmanager
def serve_in_thread(app: Callable[[], Any]) -> Iterator[str]:
    """The ASGI app `app()` builds, served by uvicorn on 127.0.0.1 in its own thread; yields its
    MCP endpoint's URL.

    A thread with its own asyncio loop lets trio-backed clients talk to it too; `app` is a
    factory, so the app (and the anyio primitives it makes) is built in the server's own asyncio
    thread, not in the test's event loop, which may be trio.
    """
    port = free_port()
    config = uvicorn.Config(
        app,
        factory=True,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.005)  # a startup poll, not synchronisation of the code under test
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        thread.join(WAIT)
