"""A program served by the proxy's stdio front alone, for `test_stdio_front.py`:
`python stdio_front_echo.py BACKEND` (asyncio or trio). Each message read is written back as it
came, after its "handler" printed stray output three ways (print, a write to fd 1, a child
writing to its inherited stdout), which must all miss the wire. Each line that was not a message
is answered with a `test/invalid` notification naming the error and how many threads the process
runs (1: the transport used no worker thread). Exits 0 when its stdin ends."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import anyio
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCNotification

from mcp_once.proxy.stdio_front import stdio_front


async def serve() -> None:
    async with stdio_front() as (read_stream, write_stream), write_stream:
        async for item in read_stream:
            if isinstance(item, Exception):
                params = {"error": type(item).__name__, "threads": threading.active_count()}
                answer = JSONRPCNotification(jsonrpc="2.0", method="test/invalid", params=params)
                await write_stream.send(SessionMessage(answer))
                continue
            print("stray print", flush=True)
            os.write(1, b"stray fd write\n")
            # Blocking on purpose: a thread-free child start (anyio's would add a watcher thread).
            subprocess.run(["echo", "stray child"], check=True)  # noqa: ASYNC221
            await write_stream.send(item)


if __name__ == "__main__":
    anyio.run(serve, backend=sys.argv[1])
