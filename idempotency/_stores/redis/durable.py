"""Durable writes (`wait_replicas`, `wait_aof`): a script followed by WAIT/WAITAOF on the same
connection, grouped.

Why grouped: WAIT blocks the connection it is sent on until the replicas acknowledge or its
timeout passes, and it confirms every write made earlier on that connection. So durable writes get
a connection of their own, never the store's shared one (a slow replica would stall every
call), and the scripts that queue up while one WAIT is out travel together in the next batch,
followed by ONE WAIT that covers them all: group commit, as databases do with fsync. A replica
that is down costs each batch `wait_timeout`, not each write in turn. Each write is still one
round trip: its script and the WAIT that confirms it leave in one write.

A durable write runs to its answer even if its caller is cancelled: it either is confirmed (or
not) as a whole, and a batch in flight carries other callers' writes too. Every batch is bounded
by the reply timeout, which must exceed `wait_timeout` (the store checks it).
"""

from __future__ import annotations

import anyio

from .link import Link


class _Pending:
    __slots__ = ("chunk", "done", "error", "replies")

    def __init__(self, chunk: bytes) -> None:
        self.chunk = chunk
        #: Set when this write's replies are in, or when it is asked to lead the next batch.
        self.done = anyio.Event()
        self.replies: tuple[object, object] | None = None
        self.error: BaseException | None = None


class GroupCommit:
    """The durable writes of one store on one event loop."""

    def __init__(self, link: Link, wait: bytes) -> None:
        #: A connection of its own: WAIT holds up everything behind it on its connection.
        self.link = link
        #: The WAIT/WAITAOF command that ends every batch.
        self.wait = wait
        self._queue: list[_Pending] = []
        self._busy = False

    async def write(self, chunk: bytes) -> tuple[object, object]:
        """Run `chunk` (one command) and the WAIT after it; returns (its reply, WAIT's reply)."""
        pending = _Pending(chunk)
        with anyio.CancelScope(shield=True):
            self._queue.append(pending)
            if self._busy:
                await pending.done.wait()  # answered, or asked to lead
            if pending.replies is None and pending.error is None:
                await self._lead()
        if pending.error is not None:
            raise pending.error
        assert pending.replies is not None
        return pending.replies

    async def _lead(self) -> None:
        self._busy = True
        batch, self._queue = self._queue, []
        try:
            chunks = [p.chunk for p in batch]
            replies = await self.link.call(b"".join(chunks) + self.wait, len(batch) + 1)
            assert isinstance(replies, list)
            acks = replies[-1]
            for each, reply in zip(batch, replies, strict=False):
                each.replies = (reply, acks)
        except Exception as exc:
            for each in batch:
                each.error = exc
        finally:
            for each in batch:
                each.done.set()
            if self._queue:
                self._queue[0].done.set()  # the oldest waiting write leads the next batch
            else:
                self._busy = False
