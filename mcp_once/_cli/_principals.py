"""Whose a record is, as `keys list` and `keys show` say it: the authenticated principal that last
claimed it, by the digest its history keeps (`principal` on the claimed event; never the principal
or its token), or None: claimed without authentication, or the history does not say.

A record does not hold its principal (its key is a digest of scope, tool and key); its history
does, one line per claim. `mcp-once proxy --auth-tokens` prints each principal's digest at start,
and `idempotency.principal_digest(token)` computes one, to match against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from idempotency import AuditedStore, KeyStore, Record, parse_history


async def principal_of(store: KeyStore, key: str, history: str | None = None) -> str | None:
    """The principal digest of the last claim of record `key`, or None; `history`: its history
    when it was read with the record (`Record.history`), else it is read."""
    if history is None:
        if not isinstance(store, AuditedStore):
            return None
        history = await store.history(key)
    try:
        events = parse_history(history)
    except ValueError:  # a damaged history: `mcp-once audit verify` reports it
        return None
    claims = [event for event in events if event.kind == "claimed"]
    return claims[-1].details.get("principal") if claims else None


async def add_principals(
    store: KeyStore, rows: Sequence[dict[str, Any]], records: Sequence[Record] = ()
) -> None:
    """Give each described record (`keys`' rows) its `principal`, from the histories of
    `records` read with them where they were (Redis: the listing's MGET), else read."""
    known = {record.key: record.history for record in records}
    for row in rows:
        row["principal"] = await principal_of(store, row["key"], known.get(row["key"]))
