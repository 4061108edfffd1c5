"""What only the SQLite journal promises: one writer per run across real processes, intents
that survive the SIGKILL of their writer, a file that is ours, and its size per entry."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from journal_kinds import entry
from opened_together import failures_opening_together

from orchestrator._journal import JournalUnavailable, SQLiteJournal

pytestmark = pytest.mark.anyio

CHILD = Path(__file__).with_name("_journal_child.py")


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_processes_racing_to_acquire_one_run_exactly_one_wins(tmp_path: Path) -> None:
    """Four processes, each with its journal open, released at once by a barrier."""
    path = str(tmp_path / "journal.db")
    children = [spawn("race", path, "run-1", f"holder-{n}") for n in range(4)]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        for child in children:  # the barrier: all are open and waiting
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        answers = sorted(child.communicate(timeout=30)[0].strip() for child in children)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert answers == ["busy", "busy", "busy", "won 1"], answers


def test_an_intent_survives_a_sigkill_right_after_record_intent_returned(tmp_path: Path) -> None:
    path = str(tmp_path / "journal.db")
    child = spawn("record", path, "run-1")
    assert child.stdout is not None
    printed = [int(child.stdout.readline()) for _ in range(25)]
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    printed += [int(line) for line in child.stdout.read().split()]
    assert child.returncode == -signal.SIGKILL
    with sqlite3.connect(path) as conn:
        stored = {row[0] for row in conn.execute("SELECT position FROM entries")}
        runs = conn.execute("SELECT calls, dangling FROM runs").fetchall()
    # Every intent whose record_intent returned is there; at most the one in flight beyond.
    assert set(printed) <= stored, sorted(set(printed) - stored)
    assert len(stored) <= len(printed) + 1
    assert runs == [(len(stored), len(stored))]


async def test_commits_are_fsynced_and_the_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "journal.db"
    journal = SQLiteJournal(path)
    try:
        await journal.acquire("run-1", "a", 10.0)

        def pragma(name: str) -> object:
            conn = journal._connection
            assert conn is not None
            return conn.execute(f"PRAGMA {name}").fetchone()[0]

        assert pragma("synchronous") == 2  # FULL
        assert pragma("journal_mode") == "wal"
        assert path.stat().st_mode & 0o077 == 0
    finally:
        await journal.aclose()


async def test_a_foreign_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE mine (x)")
    before = path.read_bytes()
    journal = SQLiteJournal(path)
    with pytest.raises(JournalUnavailable, match="not an mcp-once journal"):
        await journal.runs()
    await journal.aclose()
    assert path.read_bytes() == before


async def test_a_closed_journal_says_so(tmp_path: Path) -> None:
    journal = SQLiteJournal(tmp_path / "j.db")
    await journal.aclose()
    with pytest.raises(JournalUnavailable, match="closed"):
        await journal.runs()


async def test_a_write_lock_held_too_long_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = SQLiteJournal(path, busy_timeout=0.05)
    try:
        await journal.runs()
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(JournalUnavailable, match="locked"):
                await journal.acquire("run-1", "a", 10.0)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert await journal.acquire("run-1", "a", 10.0) == 1
    finally:
        await journal.aclose()


ENTRIES = 10_000


async def test_bytes_per_entry(tmp_path: Path, record_property: object) -> None:
    """The target is at most 300 bytes per stored entry. Measured as the growth of the
    checkpointed file over ENTRIES realistic intents (a 45-character derived key, a 32-hex
    fingerprint, ~20 characters of server and tool), in runs of 100 calls. Written without
    fsync (the layout is the same; the suite is not a disk benchmark): the first run's 202
    writes are timed with it, for the cost of a durable intent."""
    path = tmp_path / "journal.db"
    journal = SQLiteJournal(path)
    runs = ENTRIES // 100

    def size() -> int:
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            count, page = (
                conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "page_size")
            )
            return int(count * page)

    try:
        await journal.runs()
        empty = size()
        started = time.perf_counter()
        durable = 0.0
        for n in range(runs):
            if n == 1:
                durable = (time.perf_counter() - started) / 202  # acquire, 100 x 2, finish
                assert journal._connection is not None
                journal._connection.execute("PRAGMA synchronous = OFF")
            run_id = f"run-{n:04d}-3f9c1b2e-8d4a-4c1e-9b7f-2a6d5e8c0f13"
            fence = await journal.acquire(run_id, "agent@host:1234", 30.0)
            for position in range(100):
                await journal.record_intent(run_id, fence, entry(position, run_id=run_id))
                await journal.mark_done(run_id, fence, position)
            await journal.finish(run_id, fence)
        full = size()
    finally:
        await journal.aclose()
    per_entry = (full - empty) / ENTRIES
    print(
        f"\nSQLite journal: {per_entry:.1f} bytes per entry ({ENTRIES} entries in {runs} runs,"
        f" {full - empty} bytes); {durable * 1e6:.0f} µs per fsynced write"
    )
    assert per_entry <= 300


def test_a_new_journal_opened_by_several_at_once_opens_for_each() -> None:
    """Several agents starting together on a new journal file: each opens it (the switch to WAL
    answered "locked" at once, past the busy timeout, while another created the schema)."""

    def open_one(path: Path) -> None:
        SQLiteJournal(path)._open().close()

    assert failures_opening_together(open_one) == []
