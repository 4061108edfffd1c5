"""A listener on a free loopback port, for the tests' stand-in servers and relays (a lossy
Redis proxy, a stand-in Sentinel, a connection-counting TCP relay, a raw HTTP/1.1 server)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc


@asynccontextmanager
async def serving(
    handler: Callable[[anyio.abc.SocketStream], Awaitable[None]],
) -> AsyncIterator[int]:
    """A listener on a free loopback port running `handler` for each connection; yields the
    port, stops serving on exit."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handler)
        try:
            yield listener.extra(anyio.abc.SocketAttribute.local_port)
        finally:
            tg.cancel_scope.cancel()
