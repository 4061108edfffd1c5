"""`SQLiteKeyStore`: the embedded durable default for one host.

Records live in one SQLite file, so they survive a restart and are shared by every process on the
machine that opens the same path. Each transition reads the row, applies the pure rule from
`transitions.py` and writes the answer back inside a `BEGIN IMMEDIATE` transaction: SQLite's write
lock is what makes claim atomic across processes, and the rule is the same one every backend obeys.

The stdlib driver blocks, so every statement runs on the store's own writer thread
(`_sqlite_writer.py`), which owns the one connection and commits transitions that queue up
concurrently in one transaction (group commit): one fsync for the batch, every caller answered
after it. Not for network filesystems: WAL needs shared memory between the processes, which means
one host.
"""

from __future__ import annotations

import functools
import math
import os
import secrets
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, TypeVar

import anyio

from . import _sqlite_history as trail
from . import _sqlite_mark as marks
from . import audit_key as audit_keys
from . import history as chain
from . import transitions as rules
from ._sqlite_writer import Writer
from .audit_key import AuditKey
from .history import AuditEntry
from .mark import Marking, StoreMark
from .memory import DEFAULT_ORPHAN_RETENTION
from .store import (
    DEFAULT_MAX_KEY_BYTES,
    DEFAULT_MAX_RESULT_BYTES,
    FENCE_MEMORY,
    NEVER_EXPIRES,
    ClaimOutcome,
    Clock,
    CorruptRecord,
    Limits,
    Record,
    RecordState,
    StoreUnavailable,
    check_list_limit,
    pass_over,
    tool_label,
)
from .url_options import Parser, boolean, integer, number, take_options

T = TypeVar("T")


#: Seconds a writer waits for another process's write lock before the store counts as unavailable.
DEFAULT_BUSY_TIMEOUT = 5.0
#: The options of `from_url` a URL's query may carry, each with its parser.
URL_OPTIONS: dict[str, Parser] = {
    "max_key_bytes": integer,
    "max_result_bytes": integer,
    "orphan_retention": number,
    "busy_timeout": number,
    "synchronous": str,  # checked by the constructor: "full" or "normal"
    "history": boolean,
    "audit_key": str,  # checked by the constructor, which never quotes it
    "audit_key_file": str,
}

#: "MCO1" in the file header: marks the file as ours, so a foreign database is refused, not used.
APPLICATION_ID = 0x4D434F31
#: Bumped on any incompatible schema change; a file from a newer release is refused, not guessed at.
#: Additions an older release does not notice stay version 1 and are made in place when a file
#: is opened (`_ADDED_COLUMNS`): every statement names its columns, so a process of the previous
#: release sharing the file keeps working beside this one (a row it rewrites loses the column's
#: value, which is why an added column may only hold what a listing shows).
SCHEMA_VERSION = 1
#: Columns added to schema version 1 after its first release, with their declarations: a file
#: written before is given them in place (`ALTER TABLE ... ADD COLUMN`: no row is rewritten).
#: `tool`: the tool's name, for `mcp-once keys list` (NULL in rows the previous release wrote).
#: `delivered`: 1 when a completed record's answer reached its caller (`Record.delivered`);
#: NULL reads as not delivered, which is what every row of a release before it means: a row
#: such a release rewrites loses nothing it could have merged.
_ADDED_COLUMNS = {"tool": "TEXT", "delivered": "INTEGER"}
#: Indexes added after the first release, made in place as the columns are (an older release
#: ignores them): `records_by_created` lets an unfiltered listing read its first rows in order
#: instead of sorting every row (adding it to a file of a million records takes seconds, once).
_ADDED_INDEXES = {"records_by_created": "records (created_at)"}

#: `wait()` polls because other processes cannot signal us; the delay doubles up to the cap, which
#: bounds how late a cross-process completion is noticed. Same-process completions wake at once.
_POLL_FIRST = 0.005
_POLL_MAX = 0.1

_COLUMNS = (
    "key, state, fingerprint, fence, attempts, token, created_at, updated_at,"
    " lease_deadline, completed_at, expires_at, result, tool, delivered"
)

# Columns are deliberately unconstrained beyond the key: every row is validated in one place when
# read (`_decode`), so damage from any source (a manual edit, another tool) surfaces as
# CorruptRecord naming the key, instead of a constraint error on some later unrelated write.
_SCHEMA = f"""
CREATE TABLE records (
    key TEXT PRIMARY KEY NOT NULL,
    state TEXT,
    fingerprint TEXT,
    fence INTEGER,
    attempts INTEGER,
    token TEXT,
    created_at REAL,
    updated_at REAL,
    lease_deadline REAL,
    completed_at REAL,
    expires_at REAL,
    result BLOB,
    tool TEXT,
    delivered INTEGER
) WITHOUT ROWID;
CREATE INDEX records_by_expiry ON records (expires_at);
CREATE INDEX records_by_state ON records (state, created_at);
CREATE INDEX records_by_created ON records (created_at);
PRAGMA application_id = {APPLICATION_ID};
PRAGMA user_version = {SCHEMA_VERSION};
"""

#: The last fence of each record `purge_expired` removed, and when it expired: a claim of its
#: key numbers the new execution above it for `FENCE_MEMORY` after that (rule 25). A table made
#: in place, as the histories' are: a release before this one ignores it.
_FENCES = """
CREATE TABLE IF NOT EXISTS fences (
    key TEXT PRIMARY KEY NOT NULL,
    fence INTEGER NOT NULL,
    expired_at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS fences_by_expiry ON fences (expired_at);
"""

_SELECT_ONE = f"SELECT {_COLUMNS} FROM records WHERE key = ?"
#: Purge reads a placeholder instead of the result: validity needs its type, not its bytes.
_PURGE_CANDIDATES = (
    "SELECT key, state, fingerprint, fence, attempts, token, created_at, updated_at,"
    " lease_deadline, completed_at, expires_at,"
    " CASE typeof(result) WHEN 'null' THEN NULL WHEN 'blob' THEN x'' ELSE 0 END, tool, delivered"
    " FROM records WHERE expires_at <= ? AND (expires_at, key) > (?, ?)"
    " ORDER BY expires_at, key LIMIT ?"
)
_PURGE_BATCH = 500
_EXPIRES_AT = 10
_UPSERT = f"INSERT OR REPLACE INTO records ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"

Row = tuple[object, ...]


#: `synchronous=` values: the SQLite pragma each one sets.
Synchronous = Literal["full", "normal"]
_SYNCHRONOUS: dict[str, str] = {"full": "FULL", "normal": "NORMAL"}


class SQLiteKeyStore:
    """Records in one SQLite file (WAL). Safe across tasks and processes on one host.

    Every transition runs in a `BEGIN IMMEDIATE` transaction on the store's writer thread.
    A transition that finds the writer idle commits alone, at once; transitions that queue up
    while a commit runs are committed together in one transaction (group commit), and each
    caller is answered only after that commit returned. A member of a batch that fails is
    answered with its own error and the others commit; a batch that fails as a whole is rerun
    member by member.

    `synchronous`: `"full"` (the default) syncs every commit to disk before any caller is
    answered, so an acknowledged claim or completion survives a power loss. `"normal"` skips
    that sync: it survives process crashes, not power loss: a power loss can roll back a claim
    whose tool already ran, and the retry then runs the effect twice. Opt in only where that is
    acceptable.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock = time.time,
        max_key_bytes: int = DEFAULT_MAX_KEY_BYTES,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        orphan_retention: float = DEFAULT_ORPHAN_RETENTION,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        synchronous: Synchronous = "full",
        history: bool = True,
        audit_key: str | bytes | AuditKey | None = None,
        audit_key_file: str | os.PathLike[str] | None = None,
    ) -> None:
        """`history`: keep each record's history and the audit stream (rule 20; tables
        `history` and `audit`, written in the transitions' own transactions). On by default;
        off only to measure what it costs. `audit_key` (or `audit_key_file`, else
        `$MCP_ONCE_AUDIT_KEY` or `$MCP_ONCE_AUDIT_KEY_FILE`): MAC and seal the histories
        (`audit_key.py`)."""
        if not os.fspath(path):
            raise ValueError("the SQLite key store needs a file path")
        if busy_timeout < 0:
            raise ValueError(f"busy_timeout must be >= 0, not {busy_timeout}")
        if synchronous not in tuple(_SYNCHRONOUS):  # a tuple: no hashing, so any value is refused
            raise ValueError(
                f"synchronous must be one of {sorted(_SYNCHRONOUS)}, not {synchronous!r}"
            )
        self.path = Path(path)
        #: The key this store MACs and seals histories with; None: plain digests.
        self.audit_key = audit_keys.resolve(audit_key, audit_key_file)
        self._clock = clock
        self._limits = Limits(max_key_bytes, max_result_bytes)
        self._orphan_retention = orphan_retention
        self._busy_timeout = busy_timeout
        self._synchronous = _SYNCHRONOUS[synchronous]
        #: Queued callers wait in the event loop, not each on a thread of anyio's shared pool
        #: (which the application needs too); the writer thread serves them all.
        self._writer = Writer(
            str(self.path),
            self._open,
            self._unavailable,
            load=_load_many,
            decode=_decode,
            save=_save_many,
            observe=self._observe if history else None,
            keep=functools.partial(trail.keep, audit_key=self.audit_key) if history else None,
        )
        self._history = history
        self._wakeups = _Wakeups()
        #: The file's mark (`mark.py`), written once by this object, before its first claim.
        self._marking = Marking()

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        clock: Clock = time.time,
        max_key_bytes: int = DEFAULT_MAX_KEY_BYTES,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        orphan_retention: float = DEFAULT_ORPHAN_RETENTION,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        synchronous: Synchronous = "full",
        history: bool = True,
        audit_key: str | bytes | AuditKey | None = None,
        audit_key_file: str | os.PathLike[str] | None = None,
    ) -> SQLiteKeyStore:
        """`sqlite:///relative/file.db` or `sqlite:////absolute/file.db` (the SQLAlchemy and
        dj-database-url convention: three slashes, then the path as written).

        The keyword options but `clock` may be written in the query instead
        (`sqlite:///keys.db?busy_timeout=10`), so one configuration string carries them; a URL
        option wins over the keyword, and any other query option is a `ValueError` naming it."""
        url, settings = take_options(url, URL_OPTIONS, locals())
        return cls(sqlite_path_from_url(url), clock=clock, **settings)

    def __repr__(self) -> str:
        return f"SQLiteKeyStore({str(self.path)!r})"

    # -- transitions -------------------------------------------------------------------------

    async def claim(
        self,
        key: str,
        fingerprint: str,
        *,
        lease: float,
        takeover: bool,
        tool: str | None = None,
        resend_only: bool = False,
    ) -> ClaimOutcome:
        self._limits.check_key(key)
        if not self._marking.done:
            await self._marking(self._write_mark, str(self.path))
        token = secrets.token_hex(16)
        label = tool_label(tool)

        def decide(record: Record | None) -> tuple[Record | None, ClaimOutcome]:
            return rules.claim(
                record,
                key,
                fingerprint,
                now=self._clock(),
                lease=lease,
                takeover=takeover,
                token=token,
                tool=label,
                resend_only=resend_only,
            )

        return await self._transition(key, decide)

    async def renew(self, key: str, token: str, *, lease: float) -> bool:
        def decide(record: Record | None) -> tuple[Record | None, bool]:
            new = rules.renew(record, token, now=self._clock(), lease=lease)
            return new, new is not None

        # A renewal changes nothing a waiter looks for, so it wakes no one.
        return await self._transition(key, decide, wake=False)

    async def complete(
        self, key: str, token: str, result: bytes, *, retention: float, delivered: bool = False
    ) -> bool:
        self._limits.check_result(result)

        def decide(record: Record | None) -> tuple[Record | None, bool]:
            new = rules.complete(
                record, token, result, now=self._clock(), retention=retention, delivered=delivered
            )
            return new, new is not None

        return await self._transition(key, decide)

    async def abandon(self, key: str, fence: int) -> bool:
        def decide(record: Record | None) -> tuple[Record | None, bool]:
            new = rules.abandon(record, fence, now=self._clock())
            return new, new is not None

        # Nothing a waiter looks for changes (the record stays COMPLETED): it wakes no one.
        return await self._transition(key, decide, wake=False)

    async def release(self, key: str, token: str) -> bool:
        def decide(record: Record | None) -> tuple[Record | None, bool]:
            new = rules.release(record, token, now=self._clock(), retention=self._orphan_retention)
            return new, new is not None

        return await self._transition(key, decide)

    async def settle(
        self, key: str, *, result: bytes | None, retention: float, replacing: int | None = None
    ) -> bool:
        if result is not None:
            self._limits.check_result(result)

        def decide(record: Record | None) -> tuple[Record | None, bool]:
            now = self._clock()
            new = rules.settle(record, result, now=now, retention=retention, replacing=replacing)
            return new, new is not None

        with chain.replacing_settle(replacing):
            return await self._transition(key, decide)

    async def reconcile(
        self, key: str, fingerprint: str, fence: int, *, lease: float
    ) -> ClaimOutcome | None:
        token = secrets.token_hex(16)

        def decide(record: Record | None) -> tuple[Record | None, ClaimOutcome | None]:
            return rules.reconcile(
                record,
                fingerprint,
                fence,
                now=self._clock(),
                token=token,
                lease=lease,
            )

        return await self._transition(key, decide)

    async def leave_unknown(self, key: str, token: str) -> bool:
        def decide(record: Record | None) -> tuple[Record | None, bool]:
            new = rules.leave_unknown(record, token, now=self._clock())
            return new, new is not None

        return await self._transition(key, decide)

    # -- reads -------------------------------------------------------------------------------

    async def wait(self, key: str, *, timeout: float) -> Record | None:
        with self._wakeups.watching(key):
            with anyio.move_on_after(timeout):
                delay = _POLL_FIRST
                while True:
                    # Taken before the read, so a completion landing between the read and the
                    # wait below has already set it: no lost wakeup.
                    changed = self._wakeups.current(key)
                    record = await self.get(key)
                    if record is None or record.state is not RecordState.IN_PROGRESS:
                        return record
                    with anyio.move_on_after(delay):
                        await changed.wait()
                    delay = min(delay * 2, _POLL_MAX)
        return await self.get(key)

    async def get(self, key: str) -> Record | None:
        def read(conn: sqlite3.Connection) -> Record | None:
            now = self._clock()
            return rules.visible(_load(conn, key), now)

        return await self._writer.run(read)

    async def list_records(
        self,
        *,
        state: RecordState | None = None,
        tool: str | None = None,
        limit: int = 100,
        created_before: float | None = None,
    ) -> list[Record]:
        """Oldest first, read along an index in `created_at` order (`records_by_created`, or
        `records_by_state` for one state) and stopped at `limit`: a listing reads about as many
        rows as it returns, plus those the other filters skip."""
        check_list_limit(limit)

        def read(conn: sqlite3.Connection) -> list[Record]:
            now = self._clock()
            sql, args = listing_query(now, state, tool, created_before)
            found: list[Record] = []
            if limit == 0:
                return found
            for row in conn.execute(sql, args):
                key = str(row[0])
                try:
                    record = rules.visible(_decode(key, row[1:]), now)
                except CorruptRecord as exc:
                    pass_over(exc)
                    continue
                if record is not None:
                    found.append(record)
                    if len(found) >= limit:
                        break
            return found

        return await self._writer.run(read)

    async def purge_expired(self) -> int:
        """Deletes expired records in batches, one short write transaction each, so a large
        purge never holds the write lock for long. Unreadable rows are left for an operator."""

        def purge_batch(conn: sqlite3.Connection, after: tuple[object, str]) -> tuple[int, Row]:
            conn.execute("BEGIN IMMEDIATE")
            try:
                now = self._clock()
                rows = conn.execute(_PURGE_CANDIDATES, (now, *after, _PURGE_BATCH)).fetchall()
                gone = []
                for row in rows:
                    try:
                        record = _decode(str(row[0]), row[1:])
                    except CorruptRecord:
                        continue
                    if rules.live(record, now) is None:  # not an in-doubt record: they stay
                        gone.append(record)
                conn.executemany(
                    "DELETE FROM records WHERE key = ?", [(record.key,) for record in gone]
                )
                _remember_fences(conn, gone, now)
                if self._history:
                    trail.purged(conn, gone, now, self.audit_key)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            last = rows[-1] if len(rows) == _PURGE_BATCH else ()
            return len(gone), last

        purged = 0
        after: tuple[object, str] = (float("-inf"), "")
        while True:
            count, last = await self._writer.run(
                functools.partial(purge_batch, after=after), shield=True
            )
            purged += count
            if not last:
                return purged
            after = (last[_EXPIRES_AT], str(last[0]))

    # -- the store's mark (`mark.py`) ------------------------------------------------------

    async def _write_mark(self) -> None:
        # Shielded as the claim after it is: a claim made in a cancelled scope still lands.
        await self._writer.run(lambda conn: marks.write(conn, self._clock()), shield=True)

    async def mark(self) -> StoreMark | None:
        """The file's mark (its `meta` table); None before its first claim."""
        return await self._writer.run(marks.read)

    async def holds_anything(self) -> bool:
        """Whether the file keeps a record (in any state) or a history."""
        return await self._writer.run(lambda conn: marks.holds_anything(conn, trail.missing(conn)))

    # -- history (rule 20) ---------------------------------------------------------------

    def _observe(
        self, key: str, before: Record | None, after: Record | None, answer: object
    ) -> trail.Seen:
        """Run by the writer in the caller's context, inside the write lock (so the clock
        is read as the transition's own is)."""
        return trail.observe(key, before, after, answer, self._clock())

    async def history(self, key: str) -> str | None:
        """The record's history as stored (`history.parse` reads it); None: it has none."""
        return await self._writer.run(lambda conn: trail.history(conn, key))

    async def histories(self) -> list[tuple[str, str]]:
        """Every history kept, (record key, history), sorted by key."""
        return [kept async for kept in self.iter_histories()]

    async def iter_histories(self) -> AsyncIterator[tuple[str, str]]:
        """Every history kept, (record key, history), by key, read a page at a time (each page
        its own short read on the writer thread, so writers are not held up): what `mcp-once
        audit verify` reads, never holding more than a page."""
        after = ""
        while True:
            page = await self._writer.run(functools.partial(trail.histories_after, after=after))
            for kept in page:
                yield kept
            if len(page) < trail.HISTORY_PAGE:
                return
            after = page[-1][0]

    async def audit(self, *, since: float | None = None, limit: int = 1000) -> list[AuditEntry]:
        """The audit stream from `since` (seconds, store clock) on, oldest first."""
        return await self._writer.run(lambda conn: trail.audit(conn, since, limit))

    async def aclose(self) -> None:
        """Finishes and answers everything already queued, then closes the connection."""
        await self._writer.aclose()

    # -- machinery ---------------------------------------------------------------------------

    async def _transition(
        self,
        key: str,
        decide: Callable[[Record | None], tuple[Record | None, T]],
        *,
        wake: bool = True,
    ) -> T:
        # `decide` reads the clock when the writer runs it, inside the write lock, so that time
        # order matches commit order across processes.
        # Shielded by the writer: once queued, the transition commits and its answer (a
        # claim's token above all) reaches the caller; a cancelled claim whose token is lost
        # would block the key until its lease expires and then turn it UNKNOWN.
        changed, answer = await self._writer.transition(key, decide)
        if changed and wake:
            self._wakeups.notify(key)
        return answer

    def _open(self) -> sqlite3.Connection:
        where = str(self.path)
        if where != ":memory:":
            try:
                # Create it readable by its owner only: stored results may be private.
                os.close(os.open(where, os.O_RDWR | os.O_CREAT, 0o600))
            except FileNotFoundError as exc:
                raise StoreUnavailable(
                    f"cannot open the SQLite key store at {where}:"
                    f" the directory {self.path.parent} does not exist"
                ) from exc
            except IsADirectoryError as exc:
                raise StoreUnavailable(
                    f"cannot open the SQLite key store at {where}: it is a directory, not a file"
                ) from exc
            except PermissionError as exc:
                raise StoreUnavailable(
                    f"cannot open the SQLite key store at {where}: permission denied"
                ) from exc
            except OSError as exc:
                raise StoreUnavailable(
                    f"cannot open the SQLite key store at {where}: {exc.strerror or exc}"
                ) from exc
        try:
            conn = sqlite3.connect(
                where,
                timeout=self._busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open the SQLite key store at {where}: {exc}") from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            # First make sure the file is ours: switching a foreign database to WAL would
            # already rewrite its header.
            _ensure_schema(conn, where)
            # WAL: readers never block the writer, and commits append instead of rewriting.
            _to_wal(conn, self._busy_timeout)
            # FULL (the default): every acknowledged transition is on disk before we answer.
            # With NORMAL (opt-in) a power loss may roll back the last commits, forgetting a
            # claim or a completion whose effect already happened: the next retry would run
            # the tool a second time.
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.DatabaseError):
                raise StoreUnavailable(
                    f"cannot use {where} as the SQLite key store: {exc}"
                ) from exc
            raise
        return conn

    def _unavailable(self, exc: sqlite3.Error) -> StoreUnavailable:
        message = str(exc)
        if isinstance(exc, sqlite3.OperationalError) and "locked" in message:
            return StoreUnavailable(
                f"the SQLite key store at {self.path} stayed locked by another writer for more"
                f" than {self._busy_timeout}s"
            )
        return StoreUnavailable(f"the SQLite key store at {self.path} failed: {message}")


def listing_query(
    now: float, state: RecordState | None, tool: str | None, created_before: float | None
) -> tuple[str, list[object]]:
    """`list_records`' statement and its arguments: live rows passing the filters, oldest first,
    in an order an index gives (`records_by_created`; `records_by_state` for one state), so that
    reading its first rows does not sort them all (`tests/store/test_sqlite_store.py` reads its
    plan)."""
    sql = (
        f"SELECT {_COLUMNS} FROM records WHERE state IS NOT ?"
        " AND (state = ? OR expires_at IS NULL OR expires_at > ?)"
    )
    args: list[object] = [RecordState.RELEASED.value, RecordState.IN_PROGRESS.value, now]
    if state is not None:
        sql += " AND state = ?"
        args.append(state.value)
    if tool is not None:
        sql += " AND tool IS ?"
        args.append(tool_label(tool))
    if created_before is not None:
        sql += " AND created_at <= ?"
        args.append(created_before)
    return sql + " ORDER BY created_at, key", args


def sqlite_path_from_url(url: str) -> str:
    """The file path in a `sqlite:///…` URL (three slashes, then the path as written)."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        raise ValueError(
            f"not an SQLite URL: {url!r}; expected sqlite:///relative/path.db"
            " or sqlite:////absolute/path.db"
        )
    path = url[len(prefix) :]
    if not path:
        raise ValueError(f"the SQLite URL {url!r} names no file")
    if "?" in path or "#" in path:
        option = path.partition("?")[2].partition("=")[0]
        raise ValueError(
            f"unknown key store URL option {option!r} in {url!r}: the SQLite store's are"
            f" {', '.join(URL_OPTIONS)}"
            if option
            else f"the SQLite URL {url!r} has an empty query or a fragment"
        )
    return path


def _ensure_schema(conn: sqlite3.Connection, where: str) -> None:
    if (
        _schema_state(conn, where) == "ours"
        and not _missing_columns(conn)
        and not _missing_indexes(conn)
        and not trail.missing(conn)
        and _has_fences(conn)
        and not marks.missing(conn)
    ):
        return
    # An empty file gets the schema, a file of an earlier release the columns added since: under
    # the write lock, re-checking in case another process got there first.
    conn.execute("BEGIN IMMEDIATE")
    try:
        if _schema_state(conn, where) == "empty":
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
        for column in _missing_columns(conn):
            conn.execute(f"ALTER TABLE records ADD COLUMN {column} {_ADDED_COLUMNS[column]}")
        for index in _missing_indexes(conn):
            conn.execute(f"CREATE INDEX {index} ON {_ADDED_INDEXES[index]}")
        # Tables added since, made in place: a release before ignores tables it does not know.
        trail.create(conn)
        for statement in _FENCES.split(";"):
            if statement.strip():
                conn.execute(statement)
        marks.create(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _has_fences(conn: sqlite3.Connection) -> bool:
    found = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='fences'")
    return found.fetchone() is not None


def _remember_fences(conn: sqlite3.Connection, gone: list[Record], now: float) -> None:
    """Keep the last fence of each record `purge_expired` removes (and forget those kept past
    their time), in its transaction."""
    kept = [(r.key, r.fence, r.expires_at) for r in gone]
    conn.executemany("INSERT OR REPLACE INTO fences (key, fence, expired_at) VALUES (?,?,?)", kept)
    conn.execute("DELETE FROM fences WHERE expired_at <= ?", (now - FENCE_MEMORY,))


def _missing_columns(conn: sqlite3.Connection) -> list[str]:
    """The added columns a file of ours does not have yet (it was written by an earlier release)."""
    present = {row[1] for row in conn.execute("PRAGMA table_info(records)")}
    return [column for column in _ADDED_COLUMNS if column not in present]


def _missing_indexes(conn: sqlite3.Connection) -> list[str]:
    """The added indexes a file of ours does not have yet (an earlier release wrote it)."""
    present = {row[1] for row in conn.execute("PRAGMA index_list(records)")}
    return [index for index in _ADDED_INDEXES if index not in present]


def _to_wal(conn: sqlite3.Connection, busy_timeout: float) -> None:
    """Switch the file to WAL (a no-op once it is). The switch needs the file to itself, and
    SQLite answers "locked" at once, without its busy handler, when another connection holds a
    lock that could deadlock with it (a second process creating the schema of the same new
    file): so the switch is tried again until `busy_timeout` has passed, as a lock wait would."""
    deadline = time.monotonic() + busy_timeout
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(0.005)  # the writer thread's lock wait, as SQLite's busy handler sleeps


def _schema_state(conn: sqlite3.Connection, where: str) -> str:
    """'ours' or 'empty'; anything else is refused with a reason an operator can act on.

    Its three reads are one snapshot (a read transaction, unless the caller's is open): read one
    by one, another process creating the schema of the same new file in between would make it
    look like someone else's database (no application id yet, but tables)."""
    if conn.in_transaction:
        return _judge_schema(conn, where)
    conn.execute("BEGIN")
    try:
        return _judge_schema(conn, where)
    finally:
        conn.execute("COMMIT")


def _judge_schema(conn: sqlite3.Connection, where: str) -> str:
    application_id = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if application_id == APPLICATION_ID:
        if version == SCHEMA_VERSION:
            return "ours"
        raise StoreUnavailable(
            f"the SQLite key store at {where} has schema version {version}; this release of"
            f" mcp-once reads only version {SCHEMA_VERSION} (written by another release?)"
        )
    tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    if application_id == 0 and version == 0 and tables == 0:
        return "empty"
    raise StoreUnavailable(
        f"{where} is an SQLite database but not an mcp-once key store"
        f" (application_id={application_id}, user_version={version}, {tables} schema objects);"
        " refusing to use it"
    )


def _load(conn: sqlite3.Connection, key: str) -> Record | None:
    row = conn.execute(_SELECT_ONE, (key,)).fetchone()
    if row is None:
        return None
    return _decode(key, row[1:])


#: Keys read per statement: under SQLite's oldest limit on bound parameters (999).
_LOAD_CHUNK = 500


def _load_many(conn: sqlite3.Connection, keys: list[str]) -> dict[str, Row | Record]:
    """The rows of those of `keys` that have one, undecoded (a corrupt one fails only the
    transitions on its key); for a key without one, what is kept of its purged record
    (`transitions.forgotten`: its last fence, and when it expired)."""
    rows: dict[str, Row | Record] = {}
    for start in range(0, len(keys), _LOAD_CHUNK):
        chunk = keys[start : start + _LOAD_CHUNK]
        sql = f"SELECT {_COLUMNS} FROM records WHERE key IN ({','.join('?' * len(chunk))})"
        for row in conn.execute(sql, chunk):
            rows[str(row[0])] = row[1:]
    absent = [key for key in keys if key not in rows]
    for start in range(0, len(absent), _LOAD_CHUNK):
        chunk = absent[start : start + _LOAD_CHUNK]
        marks = ",".join("?" * len(chunk))
        sql = f"SELECT key, fence, expired_at FROM fences WHERE key IN ({marks})"
        for key, fence, expired_at in conn.execute(sql, chunk):
            rows[str(key)] = rules.forgotten(str(key), int(fence), float(expired_at))
    return rows


def _save_many(conn: sqlite3.Connection, records: list[Record]) -> None:
    conn.executemany(_UPSERT, [_encode(record) for record in records])


def _encode(record: Record) -> Row:
    return (
        record.key,
        record.state.value,
        record.fingerprint,
        record.fence,
        record.attempts,
        record.token,
        record.created_at,
        record.updated_at,
        record.lease_deadline,
        record.completed_at,
        # What the previous release needs to read an IN_PROGRESS record (`NEVER_EXPIRES`).
        NEVER_EXPIRES if record.state is RecordState.IN_PROGRESS else record.expires_at,
        record.result,
        record.tool,
        1 if record.delivered else None,
    )


def _decode(key: str, row: Row) -> Record:
    """The row as a Record, or CorruptRecord saying which field is wrong.

    Written for the common case (every batch member on the writer thread decodes its row): one
    pass, exact-type checks first, the general conversion (`_time`) only for what SQLite did
    not hand back as a finite float."""
    (
        state,
        fingerprint,
        fence,
        attempts,
        token,
        created_at,
        updated_at,
        lease_deadline,
        completed_at,
        expires_at,
        result,
        tool,
        delivered,
    ) = row
    record_state = _STATES.get(state) if isinstance(state, str) else None
    if record_state is None:
        raise CorruptRecord(key, f"unknown state {state!r}")
    if not isinstance(fingerprint, str) or not fingerprint:
        raise CorruptRecord(key, f"fingerprint is {fingerprint!r}, not a non-empty string")
    if type(fence) is not int or fence < 1:
        raise CorruptRecord(key, f"fence is {fence!r}, not a positive integer")
    if type(attempts) is not int or attempts < 1:
        raise CorruptRecord(key, f"attempts is {attempts!r}, not a positive integer")
    if token is not None and not isinstance(token, str):
        raise CorruptRecord(key, f"token is a {type(token).__name__}, not a string")
    if result is not None and not isinstance(result, bytes):
        raise CorruptRecord(key, f"result is a {type(result).__name__}, not bytes")
    if tool is not None and not isinstance(tool, str):
        raise CorruptRecord(key, f"tool is a {type(tool).__name__}, not a string")
    created = _time(created_at, "created_at", key)
    updated = _time(updated_at, "updated_at", key)
    lease = _time(lease_deadline, "lease_deadline", key)
    completed = _time(completed_at, "completed_at", key)
    expires = _time(expires_at, "expires_at", key)
    if created is None:
        raise CorruptRecord(key, "created_at is missing")
    if updated is None:
        raise CorruptRecord(key, "updated_at is missing")
    if record_state is RecordState.IN_PROGRESS and (token is None or lease is None):
        raise CorruptRecord(key, "an in-progress record without a token or a lease deadline")
    if record_state is RecordState.COMPLETED and (result is None or completed is None):
        raise CorruptRecord(key, "a completed record without a result or a completion time")
    if record_state is RecordState.IN_PROGRESS:
        expires = None  # kept until it ends (rule 25): whatever expiry an older release wrote
    elif record_state is not RecordState.UNKNOWN and expires is None:
        raise CorruptRecord(key, f"a {record_state.value} record without an expiry")
    return Record(
        key,
        record_state,
        fingerprint,
        fence,
        attempts,
        token,
        created,
        updated,
        lease,
        completed,
        expires,
        result,
        tool or None,
        delivered == 1,
    )


_STATES = {state.value: state for state in RecordState}


def _time(value: object, name: str, key: str) -> float | None:
    if value is None or (type(value) is float and value - value == 0.0):  # finite: not inf, nan
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise CorruptRecord(key, f"{name} is {value!r}, not a time")


class _Wakeups:
    """One event per key somebody in this process is waiting on; set by this process's writes.

    Counting the watchers lets the event go when the last waiter leaves, so keys completed by
    other processes (which never notify us) do not pile up here.
    """

    def __init__(self) -> None:
        self._events: dict[str, anyio.Event] = {}
        self._watchers: dict[str, int] = {}

    def current(self, key: str) -> anyio.Event:
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = anyio.Event()
        return event

    def notify(self, key: str) -> None:
        event = self._events.pop(key, None)
        if event is not None:
            event.set()

    @contextmanager
    def watching(self, key: str) -> Iterator[None]:
        self._watchers[key] = self._watchers.get(key, 0) + 1
        try:
            yield
        finally:
            left = self._watchers[key] - 1
            if left:
                self._watchers[key] = left
            else:
                del self._watchers[key]
                self._events.pop(key, None)
