"""The SQLite key store's writer: one thread per store that owns its connection and commits
concurrent transitions together (group commit).

Why: with `synchronous=FULL` every commit waits for an fsync, and every call through anyio's
shared thread pool pays a thread hop each way. One thread that takes everything queued while it
was busy and commits it in ONE transaction pays one fsync for the whole batch, and still answers
each caller only after that fsync returned: the durability of one commit per transition at the
throughput of one commit per batch.

The rules:

- No waiting to fill a batch beyond the caller's event loop round. A transition wakes the
  writer when the loop has run the tasks that were ready with it (see `_enqueue`); one that is
  alone then is committed in a transaction of its own (the direct path); batches form from what
  queued up in that round and while the previous commit ran.
- Each member's step (the pure rule deciding its new record and answer) runs in its caller's
  context (the context variables copied when it was queued). The batch reads every record it
  needs in one statement and writes every changed record in one more: a member whose step
  fails (a corrupt record) has changed nothing and is answered with its own error, the others
  commit; a statement that fails fails the batch as a whole (below).
- A batch that fails as a whole after BEGIN (a statement failed, SQLite rolled the transaction
  back, or COMMIT failed) is rolled back, leaving nothing on disk: every member is then run
  again alone, in a transaction of its own, and answered exactly as a lone transition is. If
  BEGIN itself fails (another process held the write lock past the busy timeout), nothing ran,
  and each member gets the error it would have got alone, without waiting out the timeout once
  per member.
- Answers reach each caller's event loop (asyncio or trio, posted thread-safely) only after the
  COMMIT returned; a caller waiting for a transition is shielded from cancellation, so a queued
  write is always committed and its answer (a claim's token) always delivered.
- Other work (reads, purge batches) runs on the same thread, alone, after the batch.
- Closing drains: everything queued before `aclose()` is done and answered, then the connection
  is closed. The thread exits after `_LINGER` idle seconds and starts again with the next job,
  so an idle or forgotten store holds no thread. An unexpected error in the writer itself is
  the answer of every caller it left unanswered; the writer goes on serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

import anyio

from .._system_task import current_loop
from .store import Record, StoreUnavailable

T = TypeVar("T")

#: Seconds an idle writer thread waits for work before it exits.
_LINGER = 5.0

Work = Callable[[sqlite3.Connection], T]
#: A transition's decision: the record as it is now (None: none) to (its new value or None to
#: leave it as it is, the caller's answer). Pure apart from reading the clock.
Step = Callable[[Record | None], tuple[Record | None, T]]
#: The store's side of a batch: the rows of some keys (those that exist; a Record where the
#: store has one already, such as what it remembers of a purged record), a row as a Record (or
#: CorruptRecord), and writing Records back.
Load = Callable[[sqlite3.Connection, list[str]], dict[str, tuple[object, ...] | Record]]
Decode = Callable[[str, tuple[object, ...]], Record]
Save = Callable[[sqlite3.Connection, list[Record]], None]
#: What a transition leaves besides its record (its history events): `observe` runs in the
#: caller's context after the step, with (key, record before, record after, answer); `keep`
#: writes what the batch observed, in the batch's transaction, after the records.
Observe = Callable[[str, Record | None, Record | None, Any], Any]
Keep = Callable[[sqlite3.Connection, list[Any]], None]


class _Job(Generic[T]):
    """One queued piece of work and where its answer goes.

    The caller waits on the cheapest thing its event loop offers (an asyncio future, a trio
    event), not an `anyio.Event`: at thousands of transitions a second, per-job construction
    and backend look-ups are a measurable share of a transition."""

    __slots__ = ("answered", "context", "done", "error", "key", "kind", "loop", "value", "work")

    def __init__(self, work: Any, kind: str, key: str = "") -> None:
        #: A `Work` (kind "alone"), a `Step` (kind "transition", on `key`), or None ("close").
        self.work = work
        self.kind = kind
        self.key = key
        self.context = contextvars.copy_context()
        self.loop = current_loop()
        self.done: asyncio.Future[None] | Any = (
            self.loop.create_future()
            if isinstance(self.loop, asyncio.AbstractEventLoop)
            else _trio_event()
        )
        self.value: T | None = None
        self.error: BaseException | None = None
        self.answered = False

    def run(self, conn: sqlite3.Connection) -> None:
        self.value = self.context.run(self.work, conn)

    async def wait(self) -> None:
        if isinstance(self.done, asyncio.Future):
            await self.done
        else:
            await self.done.wait()


def _trio_event() -> Any:
    import trio

    return trio.Event()


class Writer:
    """The thread that runs a store's statements; see the module docstring."""

    def __init__(
        self,
        name: str,
        connect: Callable[[], sqlite3.Connection],
        failure: Callable[[sqlite3.Error], BaseException],
        *,
        load: Load,
        decode: Decode,
        save: Save,
        observe: Observe | None = None,
        keep: Keep | None = None,
    ) -> None:
        self._name = name
        self._observe = observe
        self._keep = keep
        self._connect = connect
        self._failure_of = failure
        self._load = load
        self._decode = decode
        self._save = save
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[_Job[Any]] = []
        #: Whether the queue may be taken: an event loop ended the round that queued its
        #: transitions (`_flush`), or other work asked for the writer at once.
        self._go = False
        #: The event loops whose end-of-round `_flush` is scheduled (the loops themselves, not
        #: their ids: a loop that died before its flush ran must not lend its id to a new one).
        self._flushing: set[object] = set()
        self._thread: threading.Thread | None = None
        self._closed = False
        #: Touched by the writer thread only (and by `aclose` once no thread runs).
        self._conn: sqlite3.Connection | None = None
        #: For tests and benchmarks: transitions committed, and the COMMITs that carried them.
        self.transitions = 0
        self.commits = 0

    async def transition(self, key: str, step: Step[T]) -> tuple[bool, T]:
        """`step` applied to the record of `key` inside a write transaction shared with
        whatever else is queued: (whether it wrote, its answer), after that transaction's
        COMMIT returned. Shielded: see the module docstring."""
        return cast(tuple[bool, T], await self._submit(_Job(step, "transition", key), shield=True))

    async def run(self, work: Work[T], *, shield: bool = False) -> T:
        """`work` alone on the writer thread, outside any transaction it does not open itself."""
        return await self._submit(_Job(work, "alone"), shield=shield)

    async def aclose(self) -> None:
        """Drain the queue, then close the connection; later calls find the store closed."""
        job: _Job[None] = _Job(None, "close")
        with self._cond:
            if self._closed:
                return
            self._closed = True
            if self._thread is None and self._conn is None and not self._queue:
                return
            self._enqueue(job, at_once=True)
        with anyio.CancelScope(shield=True):
            await job.wait()

    async def _submit(self, job: _Job[T], *, shield: bool) -> T:
        with self._cond:
            if self._closed:
                raise StoreUnavailable(f"the SQLite key store at {self._name} is closed")
            self._enqueue(job, at_once=job.kind != "transition")
        with anyio.CancelScope(shield=shield):
            await job.wait()
        if job.error is not None:
            raise job.error
        return cast(T, job.value)

    def _enqueue(self, job: _Job[Any], *, at_once: bool) -> None:
        """Under `_cond`: queue the job and make sure the writer will take it.

        A transition wakes the writer only once its event loop has run every task that was
        ready with it (`_flush`, scheduled once per loop and round), not at once: woken at
        once, the writer would take the queue the first time the loop let go of the GIL (any
        system call of any task) and commit a batch of one while the rest of the round queues
        behind it, paying an fsync each. A lone transition waits one loop iteration more."""
        self._queue.append(job)
        if at_once:
            self._wake()
            return
        loop = job.loop
        if loop not in self._flushing:
            self._flushing.add(loop)
            if isinstance(loop, asyncio.AbstractEventLoop):
                loop.call_soon(self._flush, loop)
            else:
                cast(Any, loop).run_sync_soon(self._flush, loop)

    def _flush(self, loop: object) -> None:
        """On an event loop, after the round that queued its transitions."""
        with self._cond:
            self._flushing.discard(loop)
            self._wake()

    def _wake(self) -> None:
        """Under `_cond`: let the writer take the queue, starting its thread if none runs."""
        self._go = True
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._serve, name=f"mcp-once SQLite writer {self._name}", daemon=True
            )
            self._thread.start()
        else:
            self._cond.notify()

    # -- the writer thread -------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not (self._go and self._queue):
                    if self._closed and not self._queue:
                        self._thread = None
                        return
                    if not self._cond.wait(_LINGER):
                        if not self._queue:
                            self._thread = None
                            return
                        # Queued, but its loop never ended the round (it stopped): take it.
                        self._go = True
                jobs, self._queue, self._go = self._queue, [], False
            try:
                self._handle(jobs)
            except Exception as exc:
                # A bug here must neither leave callers waiting forever nor stop the writer:
                # every caller not yet answered gets the error, and the writer goes on.
                for job in jobs:
                    if not job.answered:
                        job.error = exc
                self._answer(jobs)
                if self._conn is not None:
                    self._rollback(self._conn)

    def _handle(self, jobs: list[_Job[Any]]) -> None:
        members = [job for job in jobs if job.kind == "transition"]
        if members:
            self._commit(members)
            self._answer(members)
        for job in jobs:
            if job.kind == "alone":
                conn = self._connection(job)
                if conn is not None:
                    self._guarded(job, job.run, conn)
            elif job.kind == "close" and self._conn is not None:
                conn, self._conn = self._conn, None
                self._guarded(job, lambda c: c.close(), conn)
            if job.kind != "transition":
                self._answer([job])

    def _commit(self, members: list[_Job[Any]]) -> None:
        conn: sqlite3.Connection | None = None
        while conn is None and members:
            conn = self._connection(members[0])
            if conn is None:
                members = members[1:]
        if conn is None:
            return
        if len(members) == 1:
            self._alone(members[0], conn)
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
        except Exception as exc:
            for job in members:
                job.error = self._failure(exc)
            return
        try:
            self._apply(conn, members)
            conn.execute("COMMIT")
        except Exception:
            self._rollback(conn)
            for job in members:
                job.value = job.error = None
                self._alone(job, conn)
            return
        self.commits += 1
        self.transitions += sum(job.error is None for job in members)

    def _alone(self, job: _Job[Any], conn: sqlite3.Connection) -> None:
        """One transition in a transaction of its own: what every transition was before group
        commit, and what each member of a batch that failed as a whole gets."""
        try:
            conn.execute("BEGIN IMMEDIATE")
            self._apply(conn, [job])
            if job.error is not None:
                self._rollback(conn)
                return
            conn.execute("COMMIT")
        except Exception as exc:
            self._rollback(conn)
            job.value, job.error = None, self._failure(exc)
            return
        self.commits += 1
        self.transitions += 1

    def _apply(self, conn: sqlite3.Connection, members: list[_Job[Any]]) -> None:
        """The members' steps, in order, with one read of every key before and one write of
        every changed record after (not two statements per member: at 16 callers these were
        a third of the writer's time). A member that fails in its own step (a corrupt record,
        an error of its rule) is answered with its error and has changed nothing; a failing
        statement raises, and the caller reruns every member alone."""
        found: dict[str, tuple[object, ...] | Record | None] = dict(
            self._load(conn, list(dict.fromkeys(job.key for job in members)))
        )
        changed: dict[str, Record] = {}
        seen: list[Any] = []
        for job in members:
            current = found.get(job.key)
            try:
                record = self._decode(job.key, current) if isinstance(current, tuple) else current
                new, answer = job.context.run(job.work, record)
            except Exception as exc:
                job.value, job.error = None, self._failure(exc)
                continue
            job.value = (new is not None, answer)
            if self._observe is not None:
                seen.append(job.context.run(self._observe, job.key, record, new, answer))
            if new is not None:
                # A later member on the same key sees this one's record, as it would in order.
                found[job.key] = changed[job.key] = new
        if changed:
            self._save(conn, list(changed.values()))
        if seen and self._keep is not None:
            self._keep(conn, seen)

    def _connection(self, job: _Job[Any]) -> sqlite3.Connection | None:
        """The open connection, opening it if needed; None with `job` failed if it cannot be
        opened (the next job tries again: the directory may appear, the lock go away)."""
        if self._conn is None:
            try:
                self._conn = self._connect()
            except Exception as exc:
                job.error = self._failure(exc)
                self._answer([job])
        return self._conn

    def _guarded(
        self, job: _Job[Any], work: Callable[[sqlite3.Connection], object], conn: sqlite3.Connection
    ) -> None:
        try:
            work(conn)
        except Exception as exc:
            job.value, job.error = None, self._failure(exc)

    def _failure(self, exc: Exception) -> BaseException:
        """What the caller sees: SQLite's errors as the store's, anything else as raised."""
        if not isinstance(exc, sqlite3.Error):
            return exc
        failure = self._failure_of(exc)
        failure.__cause__ = exc
        return failure

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")

    @staticmethod
    def _answer(jobs: list[_Job[Any]]) -> None:
        """Wake each waiting caller: one thread-safe call per event loop, not per job."""
        by_loop: dict[int, list[_Job[Any]]] = {}
        for job in jobs:
            if not job.answered:
                job.answered = True
                by_loop.setdefault(id(job.loop), []).append(job)
        for group in by_loop.values():
            loop = group[0].loop
            post = (
                loop.call_soon_threadsafe
                if isinstance(loop, asyncio.AbstractEventLoop)
                else cast(Any, loop).run_sync_soon
            )
            # A finished event loop has nobody left waiting.
            with contextlib.suppress(RuntimeError):
                post(_wake_all, [job.done for job in group])


def _wake_all(waiters: list[Any]) -> None:
    for done in waiters:
        if isinstance(done, asyncio.Future):
            if not done.done():  # a caller cancelled by asyncio itself (not by anyio) left
                done.set_result(None)
        else:
            done.set()
