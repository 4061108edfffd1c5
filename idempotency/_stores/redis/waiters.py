"""Waiting for records to change: every waiter of a store on one event loop shares ONE subscriber
connection.

Why: a duplicate that waits for a running attempt (rule 5) used to hold a pub/sub connection of
its own, so fifty waiters used up the connection pool and unrelated calls failed with
STORE_UNAVAILABLE while Redis was healthy. Here a table maps each record's channel (its key name,
where complete/release/settle PUBLISH) to the waiters watching it. The first waiter of a channel
subscribes, and the rest share that subscription; the last one to leave unsubscribes. A message
wakes every waiter of its channel, and each re-reads the record.

A waiter re-reads only once its subscription is confirmed: a change landing after that read cannot
slip by unannounced. If the subscriber connection dies, every waiter is woken. Each re-subscribes
on the next connection (the first waiter of a channel sends SUBSCRIBE, the others join it) and
re-reads. The store's bounded re-read (`RedisKeyStore.wait`) also covers a message lost any other
way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from .endpoint import Endpoint
from .link import Link
from .wire import ReplyError, Traffic, Wire, command


class Watch:
    """One waiter's view of one channel."""

    __slots__ = ("_channel", "_event", "_owner")

    def __init__(self, owner: Waiters, channel: bytes) -> None:
        self._owner = owner
        self._channel = channel
        self._event = anyio.Event()

    def wake(self) -> None:
        self._event.set()

    async def changed(self, timeout: float) -> None:
        """Return when the channel announced a change, the subscription had to be renewed, or
        `timeout` seconds passed: the caller re-reads the record either way."""
        with anyio.move_on_after(timeout):
            await self._event.wait()
        if self._event.is_set():
            self._event = anyio.Event()
        await self._owner._subscribed(self._channel)


class _Channel:
    __slots__ = ("confirming", "watches", "wire")

    def __init__(self) -> None:
        self.watches: set[Watch] = set()
        #: The connection on which the subscription is confirmed; None: not subscribed (yet).
        self.wire: Wire | None = None
        #: Set when a SUBSCRIBE in flight is answered (or failed).
        self.confirming: anyio.Event | None = None


class Waiters:
    """The waiters of one store on one event loop, and their subscriber connection."""

    def __init__(self, endpoint: Endpoint, traffic: Traffic) -> None:
        #: The subscriber connection (in subscribed mode: SUBSCRIBE and UNSUBSCRIBE only).
        self.link = Link(endpoint, traffic, push=self._message, on_dead=self._lost)
        self._channels: dict[bytes, _Channel] = {}

    @asynccontextmanager
    async def watching(self, channel: bytes) -> AsyncIterator[Watch]:
        """Watch `channel`; entered once the subscription is confirmed."""
        watch = Watch(self, channel)
        entry = self._channels.get(channel)
        if entry is None:
            entry = self._channels[channel] = _Channel()
        entry.watches.add(watch)
        try:
            await self._subscribed(channel)
            yield watch
        finally:
            entry.watches.discard(watch)
            if not entry.watches and self._channels.get(channel) is entry:
                del self._channels[channel]
                # Also when a SUBSCRIBE is still in flight: Redis answers in order, so the
                # channel ends unsubscribed either way.
                wire = self.link.live()
                if wire is not None:
                    with anyio.CancelScope(shield=True):
                        await wire.post(command(b"UNSUBSCRIBE", channel))

    async def _subscribed(self, channel: bytes) -> None:
        """Until `channel` is subscribed on the live connection (at once if it is)."""
        while True:
            entry = self._channels.get(channel)
            if entry is None:
                return
            live = self.link.live()
            if live is not None and entry.wire is live:
                return
            if entry.confirming is not None:
                await entry.confirming.wait()  # then look again: it may have failed
                continue
            await self._subscribe(channel, entry)

    async def _subscribe(self, channel: bytes, entry: _Channel) -> None:
        entry.confirming = confirming = anyio.Event()
        try:
            wire = await self.link.wire()
            reply = await wire.request(command(b"SUBSCRIBE", channel))
            if isinstance(reply, ReplyError):
                raise reply
            if wire.dead is None:
                entry.wire = wire
        finally:
            entry.confirming = None
            confirming.set()

    def _message(self, reply: object) -> bool:
        if not (isinstance(reply, list) and len(reply) == 3 and reply[0] == b"message"):
            return False
        entry = self._channels.get(reply[1])
        if entry is not None:
            for watch in entry.watches:
                watch.wake()
        return True

    def _lost(self, wire: Wire) -> None:
        for entry in self._channels.values():
            if entry.wire is wire:
                entry.wire = None
                for watch in entry.watches:
                    watch.wake()
