"""A store's connection on one event loop: opened on first use, replaced when it dies.

Why: a connection that died while idle (Redis restarted, a proxy dropped it) must not fail the
next call made on it. The transport notices the close as soon as the kernel reports it and marks
the wire dead, so the next call finds it dead and opens a new one; a call already in flight when
the connection died is re-sent by the store if re-sending is safe (see `store.py`). Many
callers finding the connection dead at once share one connection attempt, and all of them learn
its outcome: one connect storm per outage would itself look like an outage.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from .endpoint import Endpoint
from .transport import open_wire
from .wire import (
    ConnectionLost,
    PushHandler,
    ReplyError,
    ReplyTimeout,
    Traffic,
    Unreachable,
    Wire,
    Wiring,
)


class Link:
    """The current connection to one Redis for one purpose (commands, pub/sub, durable writes)."""

    def __init__(
        self,
        endpoint: Endpoint,
        traffic: Traffic,
        *,
        push: PushHandler | None = None,
        on_dead: Callable[[Wire], None] | None = None,
    ) -> None:
        self._endpoint = endpoint
        self._traffic = traffic
        self._push = push
        self._on_dead = on_dead
        #: The connection last opened, usable while its `dead` is None (`live`, `wire`).
        self.current: Wire | None = None
        self._connecting: anyio.Event | None = None
        self._failure: BaseException | None = None
        self._closed = False

    def live(self) -> Wire | None:
        """The connection if it is usable now, without connecting."""
        wire = self.current
        return wire if wire is not None and wire.dead is None else None

    async def wire(self) -> Wire:
        """A usable connection: the current one, or a new one. Raises `Unreachable`."""
        while True:
            wire = self.current
            if wire is not None and wire.dead is None:
                return wire
            if self._closed:
                raise Unreachable("the key store was closed")
            if self._connecting is None:
                return await self._connect()
            connecting = self._connecting
            await connecting.wait()
            failure = self._failure
            if failure is not None and self.live() is None:
                raise Unreachable(str(failure)) from failure

    async def call(self, chunk: bytes, count: int = 1) -> object:
        """Send `chunk` (`count` commands) and return the reply (a list for several)."""
        wire = self.current
        if wire is None or wire.dead is not None:
            wire = await self.wire()
        return await wire.request(chunk, count)

    def drop(self) -> None:
        """Give the current connection up (the next call opens a new one)."""
        wire = self.current
        if wire is not None:
            wire.close()

    def close(self) -> None:
        self._closed = True
        self.drop()

    async def _connect(self) -> Wire:
        self._connecting = connecting = anyio.Event()
        self._failure = None
        try:
            wire = await self._open()
        except Exception as exc:  # a cancelled attempt is no failure: the next caller tries
            self._failure = exc
            raise
        else:
            self.current = wire
            return wire
        finally:
            self._connecting = None
            connecting.set()

    async def _open(self) -> Wire:
        endpoint = self._endpoint
        wiring = Wiring(endpoint.timeout, self._traffic, self._push, self._on_dead)
        wire = await open_wire(
            await endpoint.locate(), wiring, connect_timeout=endpoint.connect_timeout
        )
        try:
            setup = await endpoint.handshake()
            if setup:
                replies = await wire.request(b"".join(setup), len(setup))
                # One command's reply comes alone (and ROLE's is itself a list).
                answers = replies if len(setup) > 1 else [replies]
                refused = [r for r in answers if isinstance(r, ReplyError)]
                if refused:
                    raise Unreachable(f"Redis refused the connection setup: {refused[0]}")
                misplaced = endpoint.misplaced(answers)
                if misplaced is not None:
                    raise Unreachable(misplaced)
        except (ConnectionLost, ReplyTimeout) as exc:
            wire.close()
            raise Unreachable(f"the connection to Redis failed during setup: {exc}") from exc
        except BaseException:
            wire.close()
            raise
        if self._closed:
            wire.close()
            raise Unreachable("the key store was closed")
        return wire
