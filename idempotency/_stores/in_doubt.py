"""Records in doubt: UNKNOWN, and IN_PROGRESS under a lease that ran out (rule 25).

An IN_PROGRESS record whose lease ran out lost its holder (the worker died or hung): the store
keeps it as it is until the next claim turns it UNKNOWN (or takes it over), which may never
come. For an operator, and for the alert, it is in doubt already: `in_doubt_records` lists both
kinds, oldest first, the way `mcp-once keys list --state unknown`, `keys reconcile` and the
`mcp_once_records_in_doubt` gauge see them. Neither kind ever expires, so each stays listed
until it is completed, settled or reconciled.

Whether a lease ran out is judged on the caller's clock (`now`), against the deadline the store
set on its own: a reader's clock, not the store's, as the store's clock is not the reader's to
read. Both stores of the listing are read through `list_records`, which the stores answer from
their in-doubt index where they keep one (Redis off a cluster; SQLite's index on state).
"""

from __future__ import annotations

import time

from .store import KeyStore, Record, RecordState


def lease_ran_out(record: Record, now: float) -> bool:
    """Whether `record` is IN_PROGRESS under a lease that ran out by `now`: its holder is gone."""
    return (
        record.state is RecordState.IN_PROGRESS
        and record.lease_deadline is not None
        and record.lease_deadline <= now
    )


async def in_doubt_records(
    store: KeyStore, *, tool: str | None = None, limit: int = 100, now: float | None = None
) -> list[Record]:
    """The records of `store` in doubt (UNKNOWN, or IN_PROGRESS under a lease that ran out by
    `now`, this machine's clock by default), oldest first, at most `limit` of them; only
    `tool`'s, if given (as `list_records` filters)."""
    when = time.time() if now is None else now
    running = await store.list_records(state=RecordState.IN_PROGRESS, tool=tool, limit=limit)
    found = await store.list_records(state=RecordState.UNKNOWN, tool=tool, limit=limit)
    found += [record for record in running if lease_ran_out(record, when)]
    found.sort(key=lambda record: (record.created_at, record.key))
    return found[:limit]
