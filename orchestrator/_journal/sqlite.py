"""`SQLiteJournal`: the embedded default. Runs live in one SQLite file, so a restarted process
finds its run again, and every process on the machine that opens the same path sees the same
runs; `BEGIN IMMEDIATE` takes SQLite's write lock before a head row is read, which is what makes
`acquire` and the fence check atomic across processes.

Durability: WAL with `synchronous=FULL`, and each write commits before its method returns, so an
intent is on disk before the call it records is sent (a SIGKILL or a power loss right after
`record_intent` returned cannot lose it). The stdlib driver blocks, so statements run in a
worker thread, one at a time per journal. One host only: WAL needs shared memory.

Layout (measured at about 130 bytes per entry, see the tests): a `runs` row per run (the head:
fence, holder, lease, counters, the holder's proof of life) with an integer id, and an `entries`
row per call keyed by (that id, position) in a WITHOUT ROWID table, so the run id is not
repeated in every entry.

The proof of life (`alive`) came after the first release of the layout: a file without its two
columns gains them on open, in place, and keeps version 1, so older releases keep working on it.
They do not write a proof; `alive_fence` names the fence that wrote one, so a proof left behind
by a newer holder is never read as that of an older release's holder that acquired since.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread

from . import lease as rules
from .entry import Entry, check_intent, nothing_to_mark, recorded_before
from .errors import JournalUnavailable
from .journal import DEFAULT_RETENTION, Clock, RunSummary

T = TypeVar("T")
logger = logging.getLogger("orchestrator.journal")

#: Seconds a writer waits for another process's write lock before the journal is unavailable.
DEFAULT_BUSY_TIMEOUT = 5.0
#: "MCJ1" in the file header: marks the file as a journal, so a foreign database (or the
#: server's key store) is refused, not written into.
APPLICATION_ID = 0x4D434A31
SCHEMA_VERSION = 1
#: Runs forgotten per sweep transaction: a large sweep never holds the write lock for long.
_SWEEP_BATCH = 200

_SCHEMA = f"""
CREATE TABLE runs (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL,
    fence INTEGER NOT NULL,
    holder TEXT,
    lease_deadline REAL,
    calls INTEGER NOT NULL,
    dangling INTEGER NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    finished_at REAL,
    alive TEXT,
    alive_fence INTEGER
);
CREATE INDEX runs_by_finish ON runs (finished_at) WHERE finished_at IS NOT NULL;
CREATE TABLE entries (
    run INTEGER NOT NULL,
    position INTEGER NOT NULL,
    done INTEGER NOT NULL,
    at REAL NOT NULL,
    server TEXT NOT NULL,
    tool TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    key TEXT NOT NULL,
    PRIMARY KEY (run, position)
) WITHOUT ROWID;
PRAGMA application_id = {APPLICATION_ID};
PRAGMA user_version = {SCHEMA_VERSION};
"""

_HEAD = (
    "SELECT id, run_id, state, fence, holder, lease_deadline, calls, dangling, created_at,"
    " updated_at, finished_at, alive, alive_fence FROM runs"
)
#: Columns added after the first release of the layout (see the module doc).
_ADDED = {"alive": "TEXT", "alive_fence": "INTEGER"}
_ENTRY = "SELECT position, server, tool, fingerprint, key, done, at FROM entries"


class SQLiteJournal:
    """Runs in one SQLite file (WAL, synchronous=FULL); safe across tasks and processes on one
    host. The file and its directory are created on first use."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock = time.time,
        retention: float = DEFAULT_RETENTION,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    ) -> None:
        if not os.fspath(path):
            raise ValueError("the SQLite journal needs a file path")
        if busy_timeout < 0:
            raise ValueError(f"busy_timeout must be >= 0, not {busy_timeout}")
        self.path = Path(path)
        self.retention = retention
        self._clock = clock
        self._busy_timeout = busy_timeout
        self._lock = threading.Lock()
        self._limiter: anyio.CapacityLimiter | None = None
        self._connection: sqlite3.Connection | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"SQLiteJournal({str(self.path)!r})"

    # -- the lease --------------------------------------------------------------------------

    async def acquire(
        self,
        run_id: str,
        holder: str,
        lease: float,
        *,
        alive: str | None = None,
        dead: int | None = None,
    ) -> int:
        rules.check_run_id(run_id)
        rules.check_holder(holder)
        rules.check_lease(lease)

        def write(conn: sqlite3.Connection, now: float) -> int:
            row_id, head = _head(conn, run_id)
            new = rules.acquired(head, run_id, holder, lease, now, alive=alive, dead=dead)
            _save_head(conn, row_id, new)
            return new.fence

        fence = await self._write(write)
        logger.debug("run %r acquired by %r with fence %d", run_id, holder, fence)
        return fence

    async def renew(self, run_id: str, fence: int, lease: float) -> None:
        rules.check_lease(lease)

        def write(conn: sqlite3.Connection, now: float) -> None:
            row_id, head = _head(conn, run_id)
            _save_head(conn, row_id, rules.renewed(rules.held(head, run_id, fence), lease, now))

        await self._write(write)

    async def release(self, run_id: str, fence: int) -> bool:
        def write(conn: sqlite3.Connection, now: float) -> bool:
            row_id, head = _head(conn, run_id)
            if head is None or head.fence != fence or head.holder is None:
                return False
            _save_head(conn, row_id, rules.released(head, now))
            return True

        return await self._write(write)

    async def finish(self, run_id: str, fence: int) -> None:
        def write(conn: sqlite3.Connection, now: float) -> None:
            row_id, head = _head(conn, run_id)
            _save_head(conn, row_id, rules.finished(rules.held(head, run_id, fence), now))

        await self._write(write)

    # -- entries ----------------------------------------------------------------------------

    async def record_intent(self, run_id: str, fence: int, entry: Entry) -> None:
        check_intent(entry)

        def write(conn: sqlite3.Connection, now: float) -> None:
            row_id, head = _head(conn, run_id)
            head = rules.held(head, run_id, fence, writing=True)
            if recorded_before(_entry(conn, row_id, entry.position), entry, run_id):
                return
            conn.execute(
                "INSERT INTO entries (run, position, done, at, server, tool, fingerprint, key)"
                " VALUES (?, ?, 0, ?, ?, ?, ?, ?)",
                (
                    row_id,
                    entry.position,
                    entry.at,
                    entry.server,
                    entry.tool,
                    entry.fingerprint,
                    entry.key,
                ),
            )
            conn.execute(
                "UPDATE runs SET calls = calls + 1, dangling = dangling + 1, updated_at = ?"
                " WHERE id = ?",
                (now, row_id),
            )

        await self._write(write)

    async def mark_done(self, run_id: str, fence: int, position: int) -> None:
        def write(conn: sqlite3.Connection, now: float) -> None:
            row_id, head = _head(conn, run_id)
            rules.held(head, run_id, fence, writing=True)
            existing = _entry(conn, row_id, position)
            if existing is None:
                raise nothing_to_mark(run_id, position)
            if existing.state == "done":
                return
            conn.execute(
                "UPDATE entries SET done = 1 WHERE run = ? AND position = ?", (row_id, position)
            )
            conn.execute(
                "UPDATE runs SET dangling = dangling - 1, updated_at = ? WHERE id = ?",
                (now, row_id),
            )

        await self._write(write)

    async def entries(self, run_id: str) -> list[Entry]:
        def read(conn: sqlite3.Connection) -> list[Entry]:
            rows = conn.execute(
                f"{_ENTRY} WHERE run = (SELECT id FROM runs WHERE run_id = ?) ORDER BY position",
                (run_id,),
            ).fetchall()
            return [_decode_entry(row) for row in rows]

        return await self._run(read)

    # -- the operator's view, and forgetting -------------------------------------------------

    async def run(self, run_id: str) -> RunSummary | None:
        def read(conn: sqlite3.Connection) -> RunSummary | None:
            return _head(conn, run_id)[1]

        return await self._run(read)

    async def runs(self) -> list[RunSummary]:
        def read(conn: sqlite3.Connection) -> list[RunSummary]:
            rows = conn.execute(f"{_HEAD} ORDER BY created_at, run_id").fetchall()
            return [_decode_head(row) for row in rows]

        return await self._run(read)

    async def purge(self, run_id: str, *, force: bool = False) -> bool:
        def write(conn: sqlite3.Connection, now: float) -> bool:
            row_id, head = _head(conn, run_id)
            if head is None or row_id is None:
                return False
            rules.purgeable(head, now, force=force)
            _forget(conn, row_id)
            return True

        return await self._write(write)

    async def sweep(self, now: float | None = None) -> int:
        """Forgets expired finished runs in batches, one short write transaction each."""

        def batch(conn: sqlite3.Connection, clock_now: float) -> int:
            cutoff = (clock_now if now is None else now) - self.retention
            rows = conn.execute(
                "SELECT id FROM runs WHERE finished_at IS NOT NULL AND finished_at <= ?"
                " AND state = 'finished' LIMIT ?",
                (cutoff, _SWEEP_BATCH),
            ).fetchall()
            for (row_id,) in rows:
                _forget(conn, row_id)
            return len(rows)

        total = 0
        while True:
            count = await self._write(batch)
            total += count
            if count < _SWEEP_BATCH:
                break
        if total:
            logger.info("journal sweep forgot %d finished runs", total)
        return total

    async def aclose(self) -> None:
        def close() -> None:
            with self._lock:
                self._closed = True
                if self._connection is not None:
                    self._connection.close()
                    self._connection = None

        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(close)

    # -- machinery --------------------------------------------------------------------------

    async def _write(self, work: Callable[[sqlite3.Connection, float], T]) -> T:
        """`work` in one `BEGIN IMMEDIATE` transaction, committed before this returns.

        Shielded from cancellation: once the transaction starts, its answer (a new fence above
        all) must reach the caller, or the run would stay held by a fence nobody knows.
        """

        def transact(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                # The clock is read under the write lock, so time order is commit order.
                answer = work(conn, self._clock())
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return answer

        return await self._run(transact, shield=True)

    async def _run(self, work: Callable[[sqlite3.Connection], T], *, shield: bool = False) -> T:
        if self._limiter is None:  # made here: a limiter needs a running event loop
            self._limiter = anyio.CapacityLimiter(1)
        with anyio.CancelScope(shield=shield):
            answer = await anyio.to_thread.run_sync(self._locked, work, limiter=self._limiter)
        return answer

    def _locked(self, work: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            if self._closed:
                raise JournalUnavailable(f"the SQLite journal at {self.path} is closed")
            conn = self._connection
            if conn is None:
                conn = self._connection = self._open()
            try:
                return work(conn)
            except sqlite3.Error as exc:
                if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                    raise JournalUnavailable(
                        f"the SQLite journal at {self.path} stayed locked by another writer for"
                        f" more than {self._busy_timeout}s"
                    ) from exc
                raise JournalUnavailable(
                    f"the SQLite journal at {self.path} failed: {exc}"
                ) from exc

    def _open(self) -> sqlite3.Connection:
        where = str(self.path)
        try:
            if where != ":memory:":
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # Readable by its owner only: tool names and run ids may be private.
                os.close(os.open(where, os.O_RDWR | os.O_CREAT, 0o600))
            conn = sqlite3.connect(
                where, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            raise JournalUnavailable(f"cannot open the SQLite journal at {where}: {exc}") from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            _ensure_schema(conn, where)
            _wal(conn, time.monotonic() + self._busy_timeout)
            # FULL: a commit is fsynced before it returns. With NORMAL a power loss may roll
            # back the last intents, and their calls, already sent, would be sent again.
            conn.execute("PRAGMA synchronous = FULL")
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.DatabaseError):
                raise JournalUnavailable(f"cannot use {where} as the journal: {exc}") from exc
            raise
        return conn


def _wal(conn: sqlite3.Connection, until: float) -> None:
    """The journal in WAL mode (a no-op once it is). SQLite answers the switch "locked" at once,
    past its busy handler, while another connection holds a lock that could deadlock with it
    (agents creating one new journal together): tried again until `until`, a lock wait's end."""
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= until:
                raise
            time.sleep(0.005)  # on the journal's own thread, as SQLite's busy handler sleeps
        else:
            return


def _ensure_schema(conn: sqlite3.Connection, where: str) -> None:
    """Creates the schema in an empty file (under the write lock, re-checked, as another
    process may be doing the same); refuses a file that is not a journal of this version."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        application_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if application_id == APPLICATION_ID and version != SCHEMA_VERSION:
            raise JournalUnavailable(
                f"the journal at {where} has schema version {version}; this release reads"
                f" version {SCHEMA_VERSION} only"
            )
        if application_id != APPLICATION_ID:
            objects = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if application_id or version or objects:
                raise JournalUnavailable(
                    f"{where} is an SQLite database but not an mcp-once journal"
                    f" (application_id={application_id}, user_version={version}); refusing it"
                )
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
        columns = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
        for column, kind in _ADDED.items():
            if column not in columns:
                conn.execute(f"ALTER TABLE runs ADD COLUMN {column} {kind}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _head(conn: sqlite3.Connection, run_id: str) -> tuple[int | None, RunSummary | None]:
    row = conn.execute(f"{_HEAD} WHERE run_id = ?", (run_id,)).fetchone()
    if row is None:
        return None, None
    return int(row[0]), _decode_head(row)


def _decode_head(row: tuple[object, ...]) -> RunSummary:
    """The head row as a summary; a damaged row is `JournalUnavailable` naming the run, never a
    guess (a wrong fence or counter would let a stale holder write)."""
    (_, run_id, state, fence, holder, deadline, calls, dangling, created, updated, finished) = row[
        :11
    ]
    alive, alive_fence = row[11:13]
    if state not in ("running", "finished"):
        raise JournalUnavailable(f"run {run_id!r} has an unknown state {state!r}")
    if holder is not None and not isinstance(holder, str):
        raise JournalUnavailable(f"run {run_id!r} has a holder that is not a string")
    return RunSummary(
        run_id=str(run_id),
        state="finished" if state == "finished" else "running",
        calls=_count(calls, run_id),
        dangling=_count(dangling, run_id),
        fence=_count(fence, run_id),
        holder=holder,
        lease_deadline=None if deadline is None else _time(deadline, run_id),
        created_at=_time(created, run_id),
        updated_at=_time(updated, run_id),
        finished_at=None if finished is None else _time(finished, run_id),
        alive=alive if isinstance(alive, str) and alive_fence == fence else None,
    )


def _count(value: object, run_id: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise JournalUnavailable(f"run {run_id!r} has a counter or fence {value!r}, not an integer")


def _time(value: object, run_id: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise JournalUnavailable(f"run {run_id!r} has a time {value!r}, not a number")


def _save_head(conn: sqlite3.Connection, row_id: int | None, head: RunSummary) -> None:
    values = (
        head.state,
        head.fence,
        head.holder,
        head.lease_deadline,
        head.calls,
        head.dangling,
        head.created_at,
        head.updated_at,
        head.finished_at,
        head.alive,
        None if head.alive is None else head.fence,
    )
    if row_id is None:
        conn.execute(
            "INSERT INTO runs (run_id, state, fence, holder, lease_deadline, calls, dangling,"
            " created_at, updated_at, finished_at, alive, alive_fence)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (head.run_id, *values),
        )
    else:
        conn.execute(
            "UPDATE runs SET state = ?, fence = ?, holder = ?, lease_deadline = ?, calls = ?,"
            " dangling = ?, created_at = ?, updated_at = ?, finished_at = ?, alive = ?,"
            " alive_fence = ? WHERE id = ?",
            (*values, row_id),
        )


def _entry(conn: sqlite3.Connection, row_id: int | None, position: int) -> Entry | None:
    row = conn.execute(f"{_ENTRY} WHERE run = ? AND position = ?", (row_id, position)).fetchone()
    return None if row is None else _decode_entry(row)


def _decode_entry(row: tuple[object, ...]) -> Entry:
    position, server, tool, fingerprint, key, done, at = row
    try:
        return Entry(
            position=position,  # type: ignore[arg-type]  # Entry checks every field
            server=server,  # type: ignore[arg-type]
            tool=tool,  # type: ignore[arg-type]
            fingerprint=fingerprint,  # type: ignore[arg-type]
            key=key,  # type: ignore[arg-type]
            state="done" if done else "intent",
            at=at,  # type: ignore[arg-type]
        )
    except (TypeError, ValueError) as exc:
        raise JournalUnavailable(
            f"an unreadable journal entry at position {position!r}: {exc}"
        ) from exc


def _forget(conn: sqlite3.Connection, row_id: int) -> None:
    conn.execute("DELETE FROM entries WHERE run = ?", (row_id,))
    conn.execute("DELETE FROM runs WHERE id = ?", (row_id,))
