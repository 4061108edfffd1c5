"""The ledger: where chaos-workload tools write their effects, outside the idempotency layer.

The invariant checker must not trust the thing it checks. The key store and the replay marker
are mcp-once's own account of what ran; the ledger is the tool's: a row written by the tool body
itself, in the same step as its "effect", in a SQLite file any process can open (stdio and HTTP
servers run in other processes, and a killed server's rows survive it). Each row carries the
logical call id (a tool argument, so it is identical on every attempt), the tool, the result the
execution produced, and the key and attempt number the request carried, so the checker can tell
a retry that ran the tool again from a copy the network duplicated.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import anyio

__all__ = ["Effect", "Ledger"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    result TEXT NOT NULL,
    key TEXT,
    attempt INTEGER,
    pid INTEGER NOT NULL,
    at REAL NOT NULL,
    record TEXT
);
CREATE INDEX IF NOT EXISTS effects_by_call ON effects (call_id);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    call_id TEXT,
    pid INTEGER NOT NULL,
    at REAL NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Effect:
    """One execution of a tool's effect, as the tool itself recorded it."""

    seq: int
    call_id: str
    tool: str
    result: str
    #: The idempotency key and attempt number the request carried (None without mcp-once).
    key: str | None
    attempt: int | None
    pid: int


class Ledger:
    """An append-only effect log in one SQLite file, shared by every process of a run.

    Writes are synchronous and tiny (one row, one transaction): a tool records its effect in the
    same step as it happens, with nothing to cancel in between.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        with self._connect() as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)

    def __repr__(self) -> str:
        return f"Ledger({str(self.path)!r})"

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    def _write(self, sql: str, values: tuple[object, ...]) -> None:
        with self._lock:
            conn = self._connect()
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(sql, values)
                conn.execute("COMMIT")
            finally:
                conn.close()

    # -- written by tools (and servers) --------------------------------------------------------

    def record(
        self,
        call_id: str,
        tool: str,
        result: str,
        *,
        key: str | None = None,
        attempt: int | None = None,
        record: str | None = None,
    ) -> None:
        """Record one execution of `tool`'s effect for logical call `call_id`; `record` is the
        downstream key it was made under (`current_claim().downstream_key`), as a payment
        provider keeps an idempotency key: what a reconciler looks the effect up by."""
        self._write(
            "INSERT INTO effects (call_id, tool, result, key, attempt, pid, at, record)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (call_id, tool, result, key, attempt, os.getpid(), time.time(), record),
        )

    def made_under(self, record: str, tool: str) -> str | None:
        """The result of the first `tool` effect made under `record`, or None: the lookup a
        system of record answers a reconciler with (rule 19)."""
        conn = self._connect()
        try:
            row = conn.execute(
                "SELECT result FROM effects WHERE record = ? AND tool = ? ORDER BY seq LIMIT 1",
                (record, tool),
            ).fetchone()
        finally:
            conn.close()
        return None if row is None else str(row[0])

    def event(self, kind: str, call_id: str | None = None) -> None:
        """Note something a process did (`server_up`, `started`, `finished`) for tests to see."""
        self._write(
            "INSERT INTO events (kind, call_id, pid, at) VALUES (?, ?, ?, ?)",
            (kind, call_id, os.getpid(), time.time()),
        )

    # -- read by the checker -------------------------------------------------------------------

    def effects(self) -> list[Effect]:
        conn = self._connect()
        try:
            rows = conn.execute(
                "SELECT seq, call_id, tool, result, key, attempt, pid FROM effects ORDER BY seq"
            ).fetchall()
        finally:
            conn.close()
        return [Effect(*row) for row in rows]

    def by_call(self) -> dict[str, list[Effect]]:
        grouped: dict[str, list[Effect]] = defaultdict(list)
        for effect in self.effects():
            grouped[effect.call_id].append(effect)
        return dict(grouped)

    def events(self, kind: str | None = None) -> list[tuple[str, str | None, int]]:
        """(kind, call_id, pid) of every event, oldest first, optionally of one kind."""
        conn = self._connect()
        try:
            if kind is None:
                rows = conn.execute("SELECT kind, call_id, pid FROM events ORDER BY seq").fetchall()
            else:
                rows = conn.execute(
                    "SELECT kind, call_id, pid FROM events WHERE kind = ? ORDER BY seq", (kind,)
                ).fetchall()
        finally:
            conn.close()
        return [(str(k), c, int(p)) for k, c, p in rows]

    async def next_event(
        self, kind: str, *, pid: int | None = None, timeout: float = 30.0
    ) -> tuple[str, str | None, int]:
        """The first `kind` event written after this call (by process `pid`, or any), waited for
        at most `timeout` seconds: another process's progress (a tool mid-run is `started`)."""
        seen = len(self.events(kind))
        with anyio.fail_after(timeout):
            while True:
                for event in self.events(kind)[seen:]:
                    if pid in (None, event[2]):
                        return event
                # Another process writes it: a bounded poll of the shared file is the only signal.
                await anyio.sleep(0.02)

    def balance(self, account: str) -> int:
        """Cents paid to `account` so far: what the read-only tool reports."""
        conn = self._connect()
        try:
            rows = conn.execute(
                "SELECT result FROM effects WHERE tool = 'pay' AND result LIKE ?",
                (f"% to {account}",),
            ).fetchall()
        finally:
            conn.close()
        total = 0
        for (result,) in rows:
            parts = str(result).split()
            total += int(parts[2])  # "receipt <id> <cents> to <account>"
        return total
