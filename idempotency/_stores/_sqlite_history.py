"""The SQLite store's histories and audit stream (rule 20), in the transaction of the transitions.

Two tables beside `records`, created in place when a file is opened (a release before this one
ignores tables it does not know: the schema version stays 1, see `sqlite.py`):

* `history`: one row per record key, its history text (`history.py`), the tool, and when the row
  may go (`forget_at`: the record's expiry, as of its last event; NULL while the record is
  UNKNOWN); never while the record is still stored (a renewal writes no event). It goes with its
  record (rule 24): `purge_expired` deletes both, and a new record under the key starts anew.
* `audit`: every event line in arrival order (`id`), with its record key and tool, capped at
  `AUDIT_MAX_ENTRIES` by `purge_expired`.

`keep` runs inside the writer's transaction right after the records are written (the writer's
`keep` hook): the same COMMIT carries the records and their events, no commit of its own.
"""

from __future__ import annotations

import sqlite3

from . import history as chain
from .audit_key import AuditKey, record_mac
from .history import AuditEntry, Said
from .store import Record

SCHEMA = """
CREATE TABLE IF NOT EXISTS history (
    key TEXT PRIMARY KEY NOT NULL,
    tool TEXT,
    lines TEXT NOT NULL,
    forget_at REAL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS history_by_forget_at ON history (forget_at);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    key TEXT NOT NULL,
    tool TEXT,
    line TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_by_time ON audit (at);
"""
TABLES = ("history", "audit")

#: What the writer hands `keep` per transition: (key, before, after, answer, what was said, when).
Seen = tuple[str, Record | None, Record | None, object, Said, float]

_LOAD_CHUNK = 500
#: Histories a read of `histories_after` returns at most.
HISTORY_PAGE = 1000


def missing(conn: sqlite3.Connection) -> bool:
    """Whether the file lacks the tables (written by a release before histories)."""
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    return not set(TABLES) <= names


def create(conn: sqlite3.Connection) -> None:
    for statement in SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)


def observe(
    key: str, before: Record | None, after: Record | None, answer: object, now: float
) -> Seen:
    """Run by the writer in the caller's context: what `history.saying` said is read there."""
    return key, before, after, answer, chain.said(), now


def keep(conn: sqlite3.Connection, seen: list[Seen], audit_key: AuditKey | None = None) -> None:
    """The events of a batch's transitions, written in its transaction (three statements for
    the batch, whatever its size); MACed and sealed with `audit_key`, if any.

    A key whose first transition in the batch finds no live record (a first claim: every
    guarded call's first execution) starts a new history (`chain.starts_anew`), so its stored
    one is not read (two statements then, for a batch of such keys); it is read after all if a
    later transition of the batch finds a live record with nothing noted yet."""
    first: dict[str, tuple[Record | None, float]] = {}
    for item in seen:
        first.setdefault(item[0], (item[1], item[5]))
    unread = {key for key, (before, now) in first.items() if chain.starts_anew(before, now)}
    texts = _load(conn, [key for key in first if key not in unread])
    rows: dict[str, tuple[str, str | None, str, float | None]] = {}
    audit: list[tuple[float, str, str | None, str]] = []
    for key, before, after, answer, said, now in seen:
        if key in unread and key not in texts and not chain.starts_anew(before, now):
            texts.update(_load(conn, [key]))
            unread.discard(key)
        mac = record_mac(audit_key, key)
        text, added = chain.note(texts.get(key, ""), before, after, answer, now, said, mac)
        if not added:
            continue
        texts[key] = text
        record = after or before
        assert record is not None
        forget = record.expires_at
        rows[key] = (key, record.tool, text, forget)
        audit.extend((now, key, record.tool, line) for line in added)
    if rows:
        conn.executemany(
            "INSERT OR REPLACE INTO history (key, tool, lines, forget_at) VALUES (?,?,?,?)",
            list(rows.values()),
        )
        conn.executemany("INSERT INTO audit (at, key, tool, line) VALUES (?,?,?,?)", audit)


def purged(
    conn: sqlite3.Connection, gone: list[Record], now: float, audit_key: AuditKey | None = None
) -> None:
    """Records `purge_expired` deleted: their histories go with them (rule 24), a purged
    event each in the audit table; histories of records gone otherwise and audit entries past
    the cap go too (same transaction)."""
    texts = _load(conn, [record.key for record in gone])
    audit = []
    for record in gone:
        mac = record_mac(audit_key, record.key)
        line = chain.purged(texts.get(record.key, ""), record, now, mac)
        audit.append((now, record.key, record.tool, line))
    conn.executemany("DELETE FROM history WHERE key = ?", [(record.key,) for record in gone])
    conn.executemany("INSERT INTO audit (at, key, tool, line) VALUES (?,?,?,?)", audit)
    # A record still stored keeps its history whatever `forget_at` says: a renewal moves the
    # record's expiry without an event, so without writing the row (its own statement per
    # renewal).
    conn.execute(
        "DELETE FROM history WHERE forget_at <= ?"
        " AND NOT EXISTS (SELECT 1 FROM records WHERE records.key = history.key)",
        (now,),
    )
    conn.execute(
        "DELETE FROM audit WHERE id <= (SELECT max(id) FROM audit) - ?",
        (chain.AUDIT_MAX_ENTRIES,),
    )


def history(conn: sqlite3.Connection, key: str) -> str | None:
    if missing(conn):
        return None
    row = conn.execute("SELECT lines FROM history WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def histories_after(conn: sqlite3.Connection, after: str) -> list[tuple[str, str]]:
    """The next `HISTORY_PAGE` histories by key, from the first key past `after`."""
    if missing(conn):
        return []
    rows = conn.execute(
        "SELECT key, lines FROM history WHERE key > ? ORDER BY key LIMIT ?", (after, HISTORY_PAGE)
    )
    return [(str(key), str(lines)) for key, lines in rows]


def audit(conn: sqlite3.Connection, since: float | None, limit: int) -> list[AuditEntry]:
    if missing(conn):
        return []
    rows = conn.execute(
        "SELECT id, key, tool, line FROM audit WHERE at >= ? ORDER BY id LIMIT ?",
        (float("-inf") if since is None else since, limit),
    )
    return [chain.entry(str(id), str(key), tool, str(line)) for id, key, tool, line in rows]


def _load(conn: sqlite3.Connection, keys: list[str]) -> dict[str, str]:
    texts: dict[str, str] = {}
    for start in range(0, len(keys), _LOAD_CHUNK):
        chunk = keys[start : start + _LOAD_CHUNK]
        sql = f"SELECT key, lines FROM history WHERE key IN ({','.join('?' * len(chunk))})"
        texts.update((str(k), str(t)) for k, t in conn.execute(sql, chunk))
    return texts
