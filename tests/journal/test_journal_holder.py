"""Whether a run's holder is dead, alive, elsewhere or unknown, judged from its recorded proof of
life against real processes (`orchestrator/_journal/holder.py`); and what the two durable
journals keep of that proof when a release that records none writes beside this one."""

from __future__ import annotations

import dataclasses
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator._journal import RunBusy, SQLiteJournal
from orchestrator._journal.holder import Proof, this_process, verdict

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(this_process() is None, reason="the proof of life is read from /proc"),
]


def proof_of(pid: int) -> Proof:
    mine = this_process()
    assert mine is not None
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return dataclasses.replace(mine, pid=pid, started=int(fields[19]))


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A live process of ours (it waits on stdin), killed and reaped at the end."""
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                               stdin=subprocess.PIPE)  # fmt: skip
    yield process
    if process.poll() is None:
        process.kill()
    process.wait()


def test_this_process_and_a_live_one_are_alive(child: subprocess.Popen[bytes]) -> None:
    mine = this_process()
    assert mine is not None and Proof.decode(mine.encode()) == mine
    assert verdict(mine.encode()) == "alive"
    assert verdict(proof_of(child.pid).encode()) == "alive"


def test_a_process_gone_is_dead(child: subprocess.Popen[bytes]) -> None:
    recorded = proof_of(child.pid).encode()
    child.kill()
    child.wait()
    assert verdict(recorded) == "dead"


def test_a_killed_process_not_yet_reaped_is_dead(child: subprocess.Popen[bytes]) -> None:
    """A zombie still has its /proc entry, but can write nothing."""
    recorded = proof_of(child.pid).encode()
    child.send_signal(signal.SIGKILL)
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, and left unreaped
    assert Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    assert verdict(recorded) == "dead"


def test_a_pid_that_now_belongs_to_a_later_process_is_dead() -> None:
    mine = this_process()
    assert mine is not None
    earlier = dataclasses.replace(mine, started=mine.started - 1)
    assert verdict(earlier.encode()) == "dead"


def test_another_host_or_namespace_is_elsewhere() -> None:
    mine = this_process()
    assert mine is not None
    another_boot = dataclasses.replace(mine, boot="00000000-0000-4000-8000-000000000000", pid=1)
    another_namespace = dataclasses.replace(mine, namespace="pid:[1]", pid=999_999_999)
    assert verdict(another_boot.encode()) == "elsewhere"
    assert verdict(another_namespace.encode()) == "elsewhere"


@pytest.mark.parametrize("recorded", [None, "", "written by someone else", "a b c d"])
def test_no_proof_or_an_unreadable_one_is_unknown(recorded: str | None) -> None:
    assert verdict(recorded) == "unknown"


def test_without_proc_nothing_is_judged(tmp_path: Path) -> None:
    """Another OS: no proof of our own to record, and no holder judged dead."""
    mine = this_process()
    assert mine is not None
    assert this_process(tmp_path) is None
    gone = dataclasses.replace(mine, pid=999_999_999)
    assert verdict(gone.encode(), tmp_path) == "unknown"


# -- what the journals keep beside a release that records no proof -----------------------------

PROOF = Proof("1d3f846e-07ae-414a-a286-6679a0ad9023", "pid:[4026531836]", 4242, 130956).encode()
FIRST_LAYOUT = """
CREATE TABLE runs (id INTEGER PRIMARY KEY, run_id TEXT NOT NULL UNIQUE, state TEXT NOT NULL,
    fence INTEGER NOT NULL, holder TEXT, lease_deadline REAL, calls INTEGER NOT NULL,
    dangling INTEGER NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
    finished_at REAL);
CREATE TABLE entries (run INTEGER NOT NULL, position INTEGER NOT NULL, done INTEGER NOT NULL,
    at REAL NOT NULL, server TEXT NOT NULL, tool TEXT NOT NULL, fingerprint TEXT NOT NULL,
    key TEXT NOT NULL, PRIMARY KEY (run, position)) WITHOUT ROWID;
INSERT INTO runs VALUES (1, 'run-1', 'running', 3, 'old:1:ab', 4e9, 0, 0, 1, 1, NULL);
PRAGMA application_id = 1296255537;
PRAGMA user_version = 1;
"""


async def test_an_sqlite_file_of_the_first_layout_gains_the_proof_in_place(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(FIRST_LAYOUT)
    journal = SQLiteJournal(path)
    try:
        with pytest.raises(RunBusy) as raised:  # its holder recorded no proof: waited for
            await journal.acquire("run-1", "new", 30.0, alive=PROOF)
        busy = raised.value
        assert (busy.holder, busy.fence, busy.alive) == ("old:1:ab", 3, None)
        fence = await journal.acquire("run-1", "new", 30.0, alive=PROOF, dead=3)
        summary = await journal.run("run-1")
        assert summary is not None and (summary.fence, summary.alive) == (fence, PROOF)
    finally:
        await journal.aclose()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1


async def test_an_sqlite_holder_written_by_an_older_release_has_no_proof(tmp_path: Path) -> None:
    """An older release acquires with its own statement, which leaves the proof columns alone:
    the proof left there is the previous holder's, and must not be read as this one's."""
    path = tmp_path / "journal.db"
    journal = SQLiteJournal(path)
    try:
        await journal.acquire("run-1", "new", 30.0, alive=PROOF)
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE runs SET fence = fence + 1, holder = 'old:1:ab'")
        summary = await journal.run("run-1")
        assert summary is not None and (summary.holder, summary.alive) == ("old:1:ab", None)
        with pytest.raises(RunBusy) as raised:
            await journal.acquire("run-1", "other", 30.0)
        assert raised.value.alive is None
    finally:
        await journal.aclose()


@pytest.mark.redis
async def test_a_redis_holder_written_by_an_older_release_has_no_proof(
    redis_url: str, redis_namespace: str
) -> None:
    import redis

    from orchestrator._journal.redis import RedisJournal

    prefix = f"{redis_namespace}:journal:"
    journal = RedisJournal.from_url(redis_url, prefix=prefix)
    try:
        await journal.acquire("run-1", "new", 30.0, alive=PROOF)
        # An older release's acquire script: a new fence and holder, the proof fields untouched.
        raw = redis.Redis.from_url(redis_url, decode_responses=True)
        raw.hset(f"{prefix}{{run-1}}:run", mapping={"f": "2", "h": "old:1:ab"})
        summary = await journal.run("run-1")
        assert summary is not None and (summary.holder, summary.alive) == ("old:1:ab", None)
        with pytest.raises(RunBusy) as raised:
            await journal.acquire("run-1", "other", 30.0)
        assert (raised.value.fence, raised.value.alive) == (2, None)
    finally:
        await journal.aclose()
