"""The SQLite store's group commit (`_sqlite_writer.py`), on real files and real threads, under
asyncio and trio: queued transitions commit in one transaction, each answered after it; a member
that fails is answered as a lone transition would be and loses no one else's write; a waiting
caller that is cancelled still gets its write and its answer; closing drains the queue; an
acknowledged claim survives a SIGKILL of the process, on the direct and the batched path.

Batches are formed deterministically: the store's clock, read inside each transaction on the
writer thread, can be told to hold the next reading until the test releases it, so the writer
sits inside a transaction while the test queues the next batch behind it.
"""

from __future__ import annotations

import contextvars
import os
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from anyio.abc import TaskGroup
from anyio.streams.buffered import BufferedByteReceiveStream
from fake_clock import FakeClock

from idempotency import (
    ClaimOutcome,
    ClaimStatus,
    CorruptRecord,
    RecordState,
    SQLiteKeyStore,
    StoreUnavailable,
)
from idempotency._stores import _sqlite_writer

#: Bounds every wait on the writer thread, so a broken writer fails the test instead of hanging.
BOUND = 30.0
BACKENDS = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
pytestmark = pytest.mark.anyio


class HeldClock(FakeClock):
    """A fake clock whose next reading, once armed, blocks until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self._armed = False
        self.entered = threading.Event()
        self.release = threading.Event()
        #: Each reading's value of `CALLER`, in reading order.
        self.callers: list[str | None] = []

    def hold_next(self) -> None:
        self.entered.clear()
        self.release.clear()
        self._armed = True

    def __call__(self) -> float:
        self.callers.append(CALLER.get())
        if self._armed:
            self._armed = False
            self.entered.set()
            assert self.release.wait(BOUND), "the test never released the held clock"
        return self.now


CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("caller", default=None)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "keys.db"


async def held_store(db: Path, **options: float) -> tuple[SQLiteKeyStore, HeldClock]:
    """A store on `db` whose clock can hold the writer, its connection open, schema made and
    mark written (what a store object's first claim does first: `idempotency._stores.mark`),
    so that the clock holds the writer inside a transition."""
    clock = HeldClock()
    store = SQLiteKeyStore(db, clock=clock, **options)
    await store.get("warm")
    await store._marking(store._write_mark, "the test's")
    clock.callers.clear()
    return store, clock


def counters(store: SQLiteKeyStore) -> tuple[int, int]:
    return store._writer.commits, store._writer.transitions


async def hold_writer(
    tg: TaskGroup, clock: HeldClock, first: Callable[[], Awaitable[object]]
) -> None:
    """Start `first` and return once the writer thread is held inside its transaction."""
    clock.hold_next()
    tg.start_soon(first)
    assert await anyio.to_thread.run_sync(clock.entered.wait, BOUND)


async def release_after_queued(clock: HeldClock) -> None:
    """Once every task is blocked (all their work is queued), let the writer go on."""
    await anyio.wait_all_tasks_blocked()
    clock.release.set()


@BACKENDS
async def test_queued_transitions_commit_in_one_batch(db: Path, anyio_backend: str) -> None:
    store, clock = await held_store(db)
    claims: dict[str, ClaimOutcome] = {}
    contested: list[ClaimOutcome] = []

    async def claim(key: str) -> None:
        claims[key] = await store.claim(key, "fp", lease=10, takeover=False)

    async def contest() -> None:
        contested.append(await store.claim("shared", "fp", lease=10, takeover=False))

    before = counters(store)
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            await hold_writer(tg, clock, lambda: claim("k0"))
            for i in range(1, 13):
                tg.start_soon(claim, f"k{i}")
            for _ in range(3):
                tg.start_soon(contest)
            await release_after_queued(clock)
    # The first committed alone (the direct path), the 15 queued behind it in ONE transaction.
    assert counters(store) == (before[0] + 2, before[1] + 16)
    assert all(o.status is ClaimStatus.CLAIMED for o in claims.values())
    assert sorted(o.status.value for o in contested) == ["busy", "busy", "claimed"]

    async def complete(key: str, token: str) -> None:
        assert await store.complete(key, token, key.encode(), retention=60)

    tokens = {key: o.token for key, o in claims.items()}
    tokens["shared"] = next(o.token for o in contested if o.status is ClaimStatus.CLAIMED)
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            first, *rest = tokens.items()
            await hold_writer(tg, clock, lambda: complete(first[0], str(first[1])))
            for key, token in rest:
                tg.start_soon(complete, key, str(token))
            await release_after_queued(clock)
    assert counters(store) == (before[0] + 4, before[1] + 30)
    await store.aclose()

    reopened = SQLiteKeyStore(db, clock=clock)
    for key in tokens:
        record = await reopened.get(key)
        assert record is not None and record.state is RecordState.COMPLETED, key
        assert record.result == key.encode()
    await reopened.aclose()


@BACKENDS
async def test_one_round_of_callers_is_one_batch_even_if_they_let_go_of_the_gil(
    db: Path, anyio_backend: str
) -> None:
    """Callers that start together queue in one round of the event loop and commit together,
    although each releases the GIL before it queues (a blocking call, as any system call does:
    the claim's own token comes from os.urandom). Woken at the first one's queueing, the writer
    would take the queue at the next release and commit the first caller alone."""
    store = SQLiteKeyStore(db)
    await store.get("warm")  # connection open, schema made: the writer idle, waiting for work
    await store._marking(store._write_mark, "the test's")  # a first claim's, once: written
    callers = 8
    go = anyio.Event()
    outcomes: list[ClaimOutcome] = []

    async def claim(key: str) -> None:
        await go.wait()
        # A blocking call: holds up the loop and releases the GIL, the writer's chance.
        threading.Event().wait(0.005)
        outcomes.append(await store.claim(key, "fp", lease=10, takeover=False))

    before = counters(store)
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            for i in range(callers):
                tg.start_soon(claim, f"k{i}")
            await anyio.wait_all_tasks_blocked()
            go.set()
    assert [o.status for o in outcomes] == [ClaimStatus.CLAIMED] * callers
    assert counters(store) == (before[0] + 1, before[1] + callers)
    await store.aclose()


@BACKENDS
async def test_sixteen_callers_share_commits_and_every_answer_is_right(
    db: Path, anyio_backend: str
) -> None:
    store = SQLiteKeyStore(db)
    pairs = 25
    done: dict[str, bytes] = {}

    async def caller(c: int) -> None:
        for i in range(pairs):
            key = f"c{c}-{i}"
            outcome = await store.claim(key, "fp", lease=10, takeover=False)
            assert outcome.status is ClaimStatus.CLAIMED and outcome.token
            assert await store.complete(key, outcome.token, key.encode(), retention=60)
            done[key] = key.encode()

    with anyio.fail_after(BOUND * 4):
        async with anyio.create_task_group() as tg:
            for c in range(16):
                tg.start_soon(caller, c)
    commits, transitions = counters(store)
    assert transitions == 16 * pairs * 2
    assert commits < transitions  # batches formed: fewer fsyncs than transitions
    await store.aclose()
    with sqlite3.connect(db) as conn:
        rows = dict(conn.execute("SELECT key, result FROM records WHERE state = 'completed'"))
    conn.close()
    assert rows == done


def _add_trigger(db: Path, resolution: str) -> None:
    """Inserting the key `refused` fails with `resolution` (ABORT: that statement only;
    ROLLBACK: SQLite rolls back the whole transaction, the batch with it)."""
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON records WHEN NEW.key = 'refused'"
            f" BEGIN SELECT RAISE({resolution}, 'refused by a trigger'); END"
        )
    conn.close()


@BACKENDS
@pytest.mark.parametrize("fault", ["statement", "whole-batch", "corrupt-record"])
async def test_a_failing_member_is_answered_alone_and_the_others_commit(
    db: Path, anyio_backend: str, fault: str
) -> None:
    store, clock = await held_store(db)
    victim = "refused"
    if fault == "corrupt-record":
        owner = await store.claim(victim, "fp", lease=10, takeover=False)
        assert owner.token
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE records SET state = 'banana' WHERE key = ?", (victim,))
        conn.close()
    else:
        _add_trigger(db, "ABORT" if fault == "statement" else "ROLLBACK")
    outcomes: dict[str, ClaimOutcome | BaseException] = {}

    async def claim(key: str) -> None:
        try:
            outcomes[key] = await store.claim(key, "fp", lease=10, takeover=False)
        except Exception as exc:
            outcomes[key] = exc

    before = counters(store)
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            await hold_writer(tg, clock, lambda: claim("first"))
            for key in ("a", victim, "b"):
                tg.start_soon(claim, key)
            await release_after_queued(clock)
    for key in ("first", "a", "b"):
        outcome = outcomes[key]
        assert isinstance(outcome, ClaimOutcome) and outcome.status is ClaimStatus.CLAIMED, key
    # A batch whose write statement failed (the batch writes every record in one statement)
    # or that SQLite rolled back as a whole is rerun member by member: one commit each. A
    # corrupt record fails its member's step only, and the batch commits.
    extra_commits = 1 if fault == "corrupt-record" else 2
    assert counters(store) == (before[0] + 1 + extra_commits, before[1] + 3)

    # The victim's answer is exactly what the same transition gets alone.
    failure = outcomes[victim]
    with pytest.raises(Exception) as alone:
        await store.claim(victim, "fp", lease=10, takeover=False)
    assert type(failure) is type(alone.value)
    assert str(failure) == str(alone.value)
    expected = CorruptRecord if fault == "corrupt-record" else StoreUnavailable
    assert isinstance(failure, expected)
    if expected is StoreUnavailable:
        assert "refused by a trigger" in str(failure)
    await store.aclose()

    with sqlite3.connect(db) as conn:
        keys = {
            key for (key,) in conn.execute("SELECT key FROM records WHERE state = 'in_progress'")
        }
    conn.close()
    assert keys == {"first", "a", "b"}


async def test_a_batch_that_cannot_begin_fails_each_member_once(db: Path) -> None:
    """Another process holds the write lock past busy_timeout: every queued member gets the
    lone transition's error after ONE wait, not one wait per member; nothing is written."""
    timeout = 0.5
    members = 5
    store, clock = await held_store(db, busy_timeout=timeout)
    blocker = sqlite3.connect(db, isolation_level=None)
    failures: list[BaseException] = []

    async def claim(key: str) -> None:
        with pytest.raises(StoreUnavailable) as caught:
            await store.claim(key, "fp", lease=10, takeover=False)
        failures.append(caught.value)

    try:
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as tg:
                await hold_writer(tg, clock, lambda: store.get("held read"))
                blocker.execute("BEGIN IMMEDIATE")
                for i in range(members):
                    tg.start_soon(claim, f"k{i}")
                await anyio.wait_all_tasks_blocked()
                started = time.monotonic()
                clock.release.set()
        elapsed = time.monotonic() - started
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert len(failures) == members
    assert all("locked by another writer" in str(f) for f in failures)
    assert timeout <= elapsed < members * timeout
    assert await store.list_records() == []
    await store.aclose()


@BACKENDS
async def test_each_member_runs_in_its_callers_context(db: Path, anyio_backend: str) -> None:
    store, clock = await held_store(db)

    async def claim(key: str) -> None:
        CALLER.set(key)
        await store.claim(key, "fp", lease=10, takeover=False)

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            await hold_writer(tg, clock, lambda: claim("first"))
            for i in range(8):
                tg.start_soon(claim, f"k{i}")
            await release_after_queued(clock)
    assert counters(store)[0] == 2  # the eight ran as one batch
    # Each reads the clock in its own context (its rule, and its history event's time).
    assert sorted({c for c in clock.callers if c is not None}) == sorted(
        ["first", *(f"k{i}" for i in range(8))]
    )
    assert None not in clock.callers
    await store.aclose()


@BACKENDS
async def test_a_cancelled_waiting_caller_still_gets_its_write_and_its_answer(
    db: Path, anyio_backend: str
) -> None:
    store, clock = await held_store(db)
    answers: list[ClaimOutcome] = []
    reached_next_checkpoint = []

    async def cancelled_claim(scope: anyio.CancelScope) -> None:
        with scope:
            outcome = await store.claim("cancelled", "fp", lease=10, takeover=False)
            answers.append(outcome)  # the answer arrives although the scope was cancelled
            await anyio.lowlevel.checkpoint()
            reached_next_checkpoint.append(True)  # pragma: no cover - must not happen
        assert scope.cancelled_caught

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            await hold_writer(
                tg, clock, lambda: store.claim("first", "fp", lease=10, takeover=False)
            )
            scope = anyio.CancelScope()
            tg.start_soon(cancelled_claim, scope)
            await anyio.wait_all_tasks_blocked()
            scope.cancel()  # while its claim waits in the queue behind the held writer
            await anyio.wait_all_tasks_blocked()
            assert answers == []  # still waiting: the write has not committed yet
            clock.release.set()
    assert not reached_next_checkpoint
    (outcome,) = answers
    assert outcome.status is ClaimStatus.CLAIMED and outcome.token
    record = await store.get("cancelled")
    assert record is not None and record.state is RecordState.IN_PROGRESS
    assert record.token == outcome.token  # the caller holds the token that was written
    await store.aclose()


@BACKENDS
async def test_closing_drains_the_queue(db: Path, anyio_backend: str) -> None:
    store, clock = await held_store(db)
    claimed: list[str] = []

    async def claim(key: str) -> None:
        outcome = await store.claim(key, "fp", lease=10, takeover=False)
        assert outcome.status is ClaimStatus.CLAIMED
        claimed.append(key)

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            await hold_writer(tg, clock, lambda: claim("first"))
            for i in range(5):
                tg.start_soon(claim, f"k{i}")
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(store.aclose)  # queued after the claims: they are done first
            await release_after_queued(clock)
    assert sorted(claimed) == sorted(["first", *(f"k{i}" for i in range(5))])
    with pytest.raises(StoreUnavailable, match="closed"):
        await store.claim("late", "fp", lease=10, takeover=False)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM records").fetchone()[0] == 6
    conn.close()


async def test_an_idle_writer_thread_exits_and_comes_back(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sqlite_writer, "_LINGER", 0.01)
    store = SQLiteKeyStore(db)
    first = await store.claim("a", "fp", lease=10, takeover=False)
    thread = store._writer._thread
    assert thread is not None
    await anyio.to_thread.run_sync(thread.join, BOUND)
    assert not thread.is_alive()
    second = await store.claim("b", "fp", lease=10, takeover=False)
    assert first.status is second.status is ClaimStatus.CLAIMED
    await store.aclose()


async def test_a_fault_in_the_writer_answers_its_callers_and_the_writer_goes_on(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteKeyStore(db)
    writer = store._writer
    commit = writer._commit

    def broken(members: list[_sqlite_writer._Job[object]]) -> None:
        monkeypatch.setattr(writer, "_commit", commit)  # once only
        raise RuntimeError("a bug in the writer")

    monkeypatch.setattr(writer, "_commit", broken)
    with anyio.fail_after(BOUND), pytest.raises(RuntimeError, match="a bug in the writer"):
        await store.claim("a", "fp", lease=10, takeover=False)
    with anyio.fail_after(BOUND):
        outcome = await store.claim("a", "fp", lease=10, takeover=False)
    assert outcome.status is ClaimStatus.CLAIMED
    await store.aclose()


def _synchronous_pragma(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA synchronous").fetchone()[0])


async def test_synchronous_is_full_unless_normal_is_asked_for(tmp_path: Path) -> None:
    full = SQLiteKeyStore(tmp_path / "full.db")
    normal = SQLiteKeyStore(tmp_path / "normal.db", synchronous="normal")
    assert await full._writer.run(_synchronous_pragma) == 2  # FULL
    assert await normal._writer.run(_synchronous_pragma) == 1  # NORMAL
    outcome = await normal.claim("k", "fp", lease=10, takeover=False)
    assert outcome.status is ClaimStatus.CLAIMED
    await full.aclose()
    await normal.aclose()


@pytest.mark.parametrize("value", ["off", "FULL", "", None, 2, ["full"]])
def test_a_bad_synchronous_value_is_refused(tmp_path: Path, value: object) -> None:
    with pytest.raises(ValueError, match="synchronous must be one of \\['full', 'normal'\\]"):
        SQLiteKeyStore(tmp_path / "keys.db", synchronous=value)  # type: ignore[arg-type]
    assert not (tmp_path / "keys.db").exists()


# -- durability across kill -9 --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("callers", "child_backend"),
    [(1, "asyncio"), (16, "asyncio"), (16, "trio")],
    ids=["direct", "batched-asyncio", "batched-trio"],
)
async def test_every_acknowledged_claim_survives_kill_9(
    db: Path, callers: int, child_backend: str
) -> None:
    script = Path(__file__).with_name("_group_claimer.py")
    command = [sys.executable, str(script), str(db), str(callers), child_backend]
    process = await anyio.open_process(command, cwd=Path(__file__).parents[2])
    acked: list[str] = []
    last: tuple[int, int] = (0, 0)
    try:
        assert process.stdout is not None
        lines = BufferedByteReceiveStream(process.stdout)
        with anyio.fail_after(BOUND * 2):
            while len(acked) < 300:
                _, key, commits, transitions = (await lines.receive_until(b"\n", 200)).split()
                acked.append(key.decode())
                last = (int(commits), int(transitions))
        os.kill(process.pid, signal.SIGKILL)  # mid-stream: claims are in flight
        with anyio.fail_after(BOUND):
            await process.wait()
            tail = b""
            try:
                while True:
                    tail += await lines.receive()
            except anyio.EndOfStream:
                pass
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == -signal.SIGKILL
    # Lines written before the kill, still in the pipe: acknowledged too.
    acked += [line.split()[1].decode() for line in tail.splitlines() if line.count(b" ") == 3]
    commits, transitions = last
    if callers == 1:
        assert commits == transitions  # the direct path: each claim its own commit
    else:
        assert commits < transitions  # the group-commit path
    with sqlite3.connect(db) as conn:
        found = {
            key for (key,) in conn.execute("SELECT key FROM records WHERE state = 'in_progress'")
        }
    conn.close()
    missing = sorted(set(acked) - found)
    assert not missing, f"{len(missing)} acknowledged claims lost: {missing[:10]}"
