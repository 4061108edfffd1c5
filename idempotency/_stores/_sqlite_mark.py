"""The SQLite store's mark (`mark.py`): the table `meta`, one row per field (`format`,
`created`), made in place when a file is opened (a release before it ignores tables it does not
know, as with the history tables: the schema version stays 1), its rows written once per store
object, before its first claim, in a statement of their own."""

from __future__ import annotations

import sqlite3

from .mark import STORE_FORMAT, StoreMark
from .store import CorruptRecord

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL)"
    " WITHOUT ROWID"
)


def missing(conn: sqlite3.Connection) -> bool:
    """Whether the file lacks the table (written by a release before marks, or just made)."""
    found = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'")
    return found.fetchone() is None


def create(conn: sqlite3.Connection) -> None:
    conn.execute(SCHEMA)


def write(conn: sqlite3.Connection, now: float) -> None:
    """Mark the file, unless it is marked already (then the first mark stays as it was)."""
    conn.execute(
        "INSERT OR IGNORE INTO meta (name, value) VALUES ('format', ?), ('created', ?)",
        (str(STORE_FORMAT), repr(now)),
    )


def read(conn: sqlite3.Connection) -> StoreMark | None:
    if missing(conn):
        return None
    fields = dict(conn.execute("SELECT name, value FROM meta"))
    if not fields:
        return None
    try:
        return StoreMark(int(fields["format"]), float(fields["created"]))
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptRecord("meta", f"the store's mark is unreadable: {fields!r}") from exc


def holds_anything(conn: sqlite3.Connection, history_tables_missing: bool) -> bool:
    if conn.execute("SELECT 1 FROM records LIMIT 1").fetchone() is not None:
        return True
    if history_tables_missing:
        return False
    return conn.execute("SELECT 1 FROM history LIMIT 1").fetchone() is not None
