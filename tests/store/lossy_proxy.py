"""A TCP proxy in front of Redis that can lose a reply at an exact point, for the re-send tests.

`cut_reply_to(marker)` arms it: the next client write containing `marker` (a script's SHA) is
forwarded to Redis, Redis's answer is read, and then, instead of that answer, the client gets a
closed connection. The command has run; its caller cannot know. `refuse()` makes it close every
new connection at once (Redis looks unreachable) until `accept()`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
from loopback import serving


class LossyProxy:
    def __init__(self, redis_port: int) -> None:
        self.redis_port = redis_port
        self.port = 0
        self._marker: bytes | None = None
        self._refusing = False
        #: Set when an armed cut has happened (the reply was read from Redis and dropped).
        self.cut = anyio.Event()
        self.connections = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def cut_reply_to(self, marker: bytes) -> None:
        self._marker = marker
        self.cut = anyio.Event()

    def refuse(self) -> None:
        self._refusing = True

    def accept(self) -> None:
        self._refusing = False

    @asynccontextmanager
    async def running(self) -> AsyncIterator[LossyProxy]:
        async with serving(self._serve) as self.port:
            yield self

    async def _serve(self, client: anyio.abc.SocketStream) -> None:
        self.connections += 1
        async with client:
            if self._refusing:
                return
            async with (
                await anyio.connect_tcp("127.0.0.1", self.redis_port) as server,
                anyio.create_task_group() as tg,
            ):
                forwarding = anyio.CancelScope()
                stopped = anyio.Event()

                async def replies() -> None:
                    try:
                        with forwarding:
                            try:
                                async for data in server:
                                    await client.send(data)
                            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                                pass
                            tg.cancel_scope.cancel()  # Redis closed: so does the client's side
                    finally:
                        stopped.set()

                tg.start_soon(replies)
                try:
                    async for data in client:
                        marker = self._marker
                        if marker is not None and marker in data:
                            self._marker = None
                            forwarding.cancel()  # from here on, nothing goes back
                            await stopped.wait()
                            await server.send(data)
                            await server.receive()  # Redis ran it and answered
                            self.cut.set()
                            return  # both connections close: the answer is lost
                        await server.send(data)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass
                forwarding.cancel()
