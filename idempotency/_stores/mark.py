"""A store's mark: what a key store writes about itself at its first write (issue 48).

Why: an operator's read of the wrong place must not look like an all-clear. A wrong Redis
database, another `?prefix=`, an empty SQLite file: each holds no records, so `keys list --state
unknown` would print "(0 records)" and `audit verify` "every chain holds". With a mark, an empty
store of ours (marked, nothing in it yet or any more) and a place nothing of ours ever wrote to
(no mark, no record, no history) read differently, and the commands say which.

The mark is written once per store object, before its first claim (every record starts with
one), idempotently: a second process, or a store object opened again, leaves the first mark as
it was. After that a claim pays one attribute test (`Marking`). Reading never writes one:
looking creates nothing. A store written by the release before the mark has records and no
mark; it reads as ours, and its next claim by this release marks it.

The claim never depends on the mark: concurrent first claims do not wait for it, and a mark that
cannot be written (the store failing, on a cluster the node of the mark's slot down) is logged
and not tried again by that store object, so a claim pays for it at most once, and no outage of
the mark's node fails claims of records elsewhere. Any later store object (a restart, another
process) tries again; until one succeeds, the records themselves say the store is ours.

Where it lives: memory, in the store object; SQLite, the `meta` table (made in place in a file
of an earlier release, as the history tables are); Redis, the hash `{prefix}meta` (fields
`format` and `created`, milliseconds of the Redis clock), beside the prefix's audit stream.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .store import StoreError, logger

#: The format a mark names: what the store's layout is, bumped only with a change that a
#: release reading the store must know about before it reads anything else.
STORE_FORMAT = 1


@dataclass(frozen=True, slots=True)
class StoreMark:
    """A store's mark, read back (`MarkedStore.mark`)."""

    #: `STORE_FORMAT` of the release that wrote it.
    format: int
    #: When the store was first written to (seconds since the epoch, the store's clock).
    created_at: float


@runtime_checkable
class MarkedStore(Protocol):
    """A store that marks itself at its first write (every store this package ships; a store of
    one's own need not: the `KeyStore` protocol does not ask for it, and the commands that read
    a store then take its word as it is)."""

    async def mark(self) -> StoreMark | None:
        """The store's mark; None when nothing marked it yet. Never writes one."""
        ...

    async def holds_anything(self) -> bool:
        """Whether the store keeps anything of mcp-once's: a record in any state (an expired
        one not yet purged too), a history, an audit stream entry. What tells a store written
        before marks (records, no mark) from a place that was never a store."""
        ...


class Marking:
    """Whether a store object has marked its store (or tried), and the marking itself: see the
    module doc. `done` is all a claim reads once it is set."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False

    async def __call__(self, write: Callable[[], Awaitable[object]], where: str) -> None:
        """Mark the store with `write`, once; `where` names the store for the log line."""
        if self.done:
            return
        self.done = True  # concurrent first claims go on without it
        try:
            await write()
        except StoreError as exc:
            logger.warning(
                "could not mark the key store %s as mcp-once's (%s); claims go on, and its"
                " next opening tries again",
                where,
                type(exc).__name__,
            )
        except BaseException:
            self.done = False  # cancelled before it could tell: the next claim marks it
            raise
