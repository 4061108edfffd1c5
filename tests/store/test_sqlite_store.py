"""What only the SQLite store promises: durability across restarts, refusing files that are not
its own, clear errors for every bad path or URL, and answers that survive cancellation.
(The behaviour every backend shares is in `test_contract.py`.)"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from fake_clock import EPOCH, FakeClock
from opened_together import failures_opening_together

from benchmarks import _populate
from idempotency import (
    ClaimStatus,
    CorruptRecord,
    MemoryKeyStore,
    RecordState,
    RedisKeyStore,
    SQLiteKeyStore,
    StoreUnavailable,
    open_store,
)
from idempotency._stores.sqlite import (
    APPLICATION_ID,
    SCHEMA_VERSION,
    listing_query,
    sqlite_path_from_url,
)

pytestmark = pytest.mark.anyio

KEY = "scope/tool/key"


def _contents(path: Path) -> bytes:
    return path.read_bytes()


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "keys.db"


async def test_records_survive_a_restart(db: Path) -> None:
    clock = FakeClock()
    store = SQLiteKeyStore(db, clock=clock)
    first = await store.claim(KEY, "fp", lease=10, takeover=False)
    assert first.token and await store.release(KEY, first.token)
    second = await store.claim(KEY, "fp", lease=10, takeover=False)
    assert second.token and await store.complete(KEY, second.token, b"kept", retention=60)
    await store.aclose()

    reopened = SQLiteKeyStore(db, clock=clock)
    try:
        replay = await reopened.claim(KEY, "fp", lease=10, takeover=False)
        assert replay.status is ClaimStatus.REPLAY
        assert (replay.result, replay.fence, replay.attempts) == (b"kept", 2, 2)
        assert replay.completed_at == EPOCH
    finally:
        await reopened.aclose()


async def test_the_file_is_marked_as_ours_in_wal_mode(db: Path) -> None:
    store = SQLiteKeyStore(db)
    await store.get(KEY)
    await store.aclose()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert _mode(db) == 0o600  # results may be private: owner only


def test_a_new_file_opened_by_several_at_once_opens_for_each() -> None:
    """Several processes starting together on a new store file: each opens it. (Read one by one,
    the schema's id, version and table count could straddle another's creation and call the
    file someone else's database; the switch to WAL answered "locked" at once.)"""

    def open_one(path: Path) -> None:
        SQLiteKeyStore(path)._open().close()

    assert failures_opening_together(open_one) == []


async def _refused(path: Path, *phrases: str) -> None:
    before = _contents(path)
    store = SQLiteKeyStore(path)
    for call in (store.get(KEY), store.claim(KEY, "fp", lease=10, takeover=False)):
        with pytest.raises(StoreUnavailable) as caught:
            await call
        for phrase in phrases:
            assert phrase in str(caught.value)
    await store.aclose()
    assert _contents(path) == before  # refused without writing a byte


async def test_a_file_that_is_not_a_database_is_refused(db: Path) -> None:
    _write(db, b"these are not the records you are looking for\n" * 100)
    await _refused(db, str(db), "file is not a database")


async def test_a_foreign_database_is_refused(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE records (key TEXT, value TEXT)")
        conn.execute("INSERT INTO records VALUES ('k', 'v')")
    conn.close()
    await _refused(db, "not an mcp-once key store")


async def test_a_newer_schema_is_refused(db: Path) -> None:
    store = SQLiteKeyStore(db)
    await store.get(KEY)
    await store.aclose()
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    await _refused(db, f"schema version {SCHEMA_VERSION + 1}", f"only version {SCHEMA_VERSION}")


async def test_unopenable_paths_say_why(tmp_path: Path) -> None:
    cases = {
        tmp_path / "no" / "such" / "dir" / "keys.db": "does not exist",
        tmp_path: "is a directory",
    }
    for path, why in cases.items():
        store = SQLiteKeyStore(path)
        with pytest.raises(StoreUnavailable, match=why):
            await store.claim(KEY, "fp", lease=10, takeover=False)
    assert not (tmp_path / "no").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
async def test_a_file_without_permission_is_unavailable(db: Path) -> None:
    _write(db, b"")
    os.chmod(db, 0)
    with pytest.raises(StoreUnavailable, match="permission denied"):
        await SQLiteKeyStore(db).get(KEY)


async def test_a_missing_directory_that_appears_later_is_used(tmp_path: Path) -> None:
    path = tmp_path / "later" / "keys.db"
    store = SQLiteKeyStore(path)
    with pytest.raises(StoreUnavailable):
        await store.get(KEY)
    path.parent.mkdir()
    outcome = await store.claim(KEY, "fp", lease=10, takeover=False)
    assert outcome.status is ClaimStatus.CLAIMED
    await store.aclose()


async def test_a_closed_store_is_unavailable(db: Path) -> None:
    store = SQLiteKeyStore(db)
    await store.get(KEY)
    await store.aclose()
    await store.aclose()  # closing twice is harmless
    with pytest.raises(StoreUnavailable, match="closed"):
        await store.claim(KEY, "fp", lease=10, takeover=False)


async def test_a_writer_holding_the_lock_past_busy_timeout_makes_it_unavailable(db: Path) -> None:
    store = SQLiteKeyStore(db, busy_timeout=0.2)
    await store.get(KEY)
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="locked by another writer"):
            await store.claim(KEY, "fp", lease=10, takeover=False)
        assert 0.2 <= time.monotonic() - started < 3
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert await store.get(KEY) is None  # nothing was written
    assert (await store.claim(KEY, "fp", lease=10, takeover=False)).status is ClaimStatus.CLAIMED
    await store.aclose()


@pytest.mark.parametrize(
    ("column", "value", "why"),
    [
        ("state", "banana", "unknown state"),
        ("state", None, "unknown state"),
        ("fingerprint", None, "fingerprint"),
        ("fingerprint", "", "fingerprint"),
        ("fence", "x", "fence"),
        ("fence", 0, "fence"),
        ("attempts", None, "attempts"),
        ("token", None, "token"),
        ("token", b"\x00", "token"),
        ("created_at", "yesterday", "created_at"),
        ("updated_at", None, "updated_at"),
        ("lease_deadline", None, "lease deadline"),
        # An IN_PROGRESS record's expiry is not read (it has none: rule 25), only checked.
        ("expires_at", "someday", "expires_at"),
        ("result", "text, not bytes", "result"),
    ],
)
async def test_each_garbled_field_is_a_corrupt_record(
    db: Path, column: str, value: object, why: str
) -> None:
    store = SQLiteKeyStore(db)
    owner = await store.claim(KEY, "fp", lease=10, takeover=False)
    assert owner.token
    with sqlite3.connect(db) as conn:
        conn.execute(f"UPDATE records SET {column} = ? WHERE key = ?", (value, KEY))
        before = conn.execute("SELECT * FROM records").fetchall()
    conn.close()
    with pytest.raises(CorruptRecord, match=why) as caught:
        await store.complete(KEY, owner.token, b"r", retention=60)
    assert caught.value.key == KEY
    with pytest.raises(CorruptRecord):
        await store.get(KEY)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT * FROM records").fetchall() == before
    conn.close()
    await store.aclose()


@pytest.mark.parametrize("column", ["result", "expires_at"])
async def test_a_completed_record_without_its_result_or_its_expiry_is_corrupt(
    db: Path, column: str
) -> None:
    store = SQLiteKeyStore(db)
    owner = await store.claim(KEY, "fp", lease=10, takeover=False)
    assert owner.token and await store.complete(KEY, owner.token, b"r", retention=60)
    with sqlite3.connect(db) as conn:
        conn.execute(f"UPDATE records SET {column} = NULL")
    conn.close()
    with pytest.raises(CorruptRecord, match=r"without a result|without an expiry"):
        await store.claim(KEY, "fp", lease=10, takeover=False)
    await store.aclose()


async def test_a_cancelled_caller_still_gets_its_claim_and_completion_recorded(db: Path) -> None:
    """Once a transition starts it finishes and answers: a claim whose token was lost to a
    cancellation would block the key for a whole lease and then turn it UNKNOWN."""
    store = SQLiteKeyStore(db)
    with anyio.CancelScope() as scope:
        scope.cancel()
        outcome = await store.claim(KEY, "fp", lease=10, takeover=False)
        assert outcome.token is not None
        assert await store.complete(KEY, outcome.token, b"r", retention=60)
    record = await store.get(KEY)
    assert record is not None and record.state is RecordState.COMPLETED
    await store.aclose()


async def test_purge_works_in_batches(db: Path) -> None:
    clock = FakeClock()
    store = SQLiteKeyStore(db, clock=clock)
    for i in range(1203):
        owner = await store.claim(f"k{i}", "fp", lease=10, takeover=False)
        assert owner.token
        assert await store.complete(f"k{i}", owner.token, b"r", retention=60 + i % 7)
    kept = await store.claim("kept", "fp", lease=10, takeover=False)
    assert kept.token and await store.complete("kept", kept.token, b"r", retention=3600)
    clock.advance(100)
    assert await store.purge_expired() == 1203
    assert [r.key for r in await store.list_records()] == ["kept"]
    await store.aclose()


#: Every filter `list_records` takes, alone and together.
LISTINGS: list[dict[str, Any]] = [
    {},
    {"state": RecordState.UNKNOWN},
    {"state": RecordState.COMPLETED},
    {"tool": "charge"},
    {"created_before": EPOCH},
    {"state": RecordState.IN_PROGRESS, "tool": "charge", "created_before": EPOCH},
]


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of 5,000 records (`benchmarks/_populate.py`, as the benchmark fills a million)."""
    path = tmp_path_factory.mktemp("listing") / "keys.db"
    _populate.fill_sqlite(path, 5_000, unknown_every=1_000, running_every=1_001)
    return path


@pytest.mark.parametrize("filters", LISTINGS, ids=lambda f: "+".join(f) or "none")
def test_a_listing_reads_along_an_index_instead_of_sorting_every_row(
    filled: Path, filters: dict[str, Any]
) -> None:
    """`keys list --limit 10` on a million records must not sort a million rows to return ten:
    the statement's plan walks an index in `created_at` order, so reading its first rows
    stops early; and it does (SQLite's count of the steps it ran, ten rows against all)."""
    sql, args = listing_query(time.time(), filters.get("state"), filters.get("tool"),
                              filters.get("created_before"))  # fmt: skip
    with contextlib.closing(sqlite3.connect(filled)) as conn:
        plan = " / ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", args))
        assert "TEMP B-TREE" not in plan, plan
        index = "records_by_state" if "state" in filters else "records_by_created"
        assert f"USING INDEX {index}" in plan, plan
        if filters:
            return
        steps = [0]

        def step() -> int:
            steps[0] += 1
            return 0

        conn.set_progress_handler(step, 100)
        first = conn.execute(sql, args).fetchmany(10)
        ten, steps[0] = steps[0], 0
        every = conn.execute(sql, args).fetchall()
    assert len(first) == 10 and len(every) == 5_000
    assert ten * 50 < steps[0], (ten, steps[0])


async def test_a_file_of_an_earlier_release_gets_the_listing_index_in_place(db: Path) -> None:
    store = SQLiteKeyStore(db)
    await store.get(KEY)
    await store.aclose()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("DROP INDEX records_by_created")  # as a release before it made the file
    reopened = SQLiteKeyStore(db)
    await reopened.get(KEY)
    await reopened.aclose()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        names = {row[1] for row in conn.execute("PRAGMA index_list(records)")}
    assert "records_by_created" in names


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_runs_under_trio_too(db: Path, anyio_backend: str) -> None:
    store = SQLiteKeyStore(db)
    owner = await store.claim(KEY, "fp", lease=10, takeover=False)
    assert owner.token
    async with anyio.create_task_group() as tg:

        async def finish() -> None:
            assert owner.token and await store.complete(KEY, owner.token, b"r", retention=60)

        tg.start_soon(finish)
        with anyio.fail_after(5):
            record = await store.wait(KEY, timeout=10)
    assert record is not None and record.result == b"r"
    await store.aclose()


async def test_bad_limits_are_refused(db: Path) -> None:
    store = SQLiteKeyStore(db)
    with pytest.raises(ValueError, match="limit"):
        await store.list_records(limit=-1)
    assert await store.list_records(limit=0) == []
    await store.aclose()
    with pytest.raises(ValueError, match="busy_timeout"):
        SQLiteKeyStore(db, busy_timeout=-1)
    with pytest.raises(ValueError, match="file path"):
        SQLiteKeyStore("")


# -- URLs -----------------------------------------------------------------------------------------


def test_sqlite_urls_follow_the_sqlalchemy_convention() -> None:
    assert sqlite_path_from_url("sqlite:///keys.db") == "keys.db"
    assert sqlite_path_from_url("sqlite:///data/keys.db") == "data/keys.db"
    assert sqlite_path_from_url("sqlite:////var/lib/mcp/keys.db") == "/var/lib/mcp/keys.db"
    store = SQLiteKeyStore.from_url("sqlite:////tmp/x/keys.db", busy_timeout=1.0)
    assert store.path == Path("/tmp/x/keys.db")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("sqlite://", "expected sqlite:///"),
        ("sqlite://host/keys.db", "expected sqlite:///"),
        ("sqlite:///", "names no file"),
        ("sqlite:///keys.db?mode=ro", "unknown key store URL option 'mode'"),
        ("postgres:///keys", "not an SQLite URL"),
    ],
)
def test_bad_sqlite_urls_say_why(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        SQLiteKeyStore.from_url(url)


def test_open_store_picks_the_backend_from_the_url(tmp_path: Path) -> None:
    assert isinstance(open_store("memory://"), MemoryKeyStore)
    by_url = open_store(f"sqlite:///{tmp_path}/a.db")
    assert isinstance(by_url, SQLiteKeyStore) and by_url.path == tmp_path / "a.db"
    by_path = open_store(str(tmp_path / "b.db"))
    assert isinstance(by_path, SQLiteKeyStore) and by_path.path == tmp_path / "b.db"
    for url in ("redis://127.0.0.1:1/0", "rediss://127.0.0.1:1/0", "unix:///tmp/redis.sock"):
        assert isinstance(open_store(url), RedisKeyStore), url


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("", "non-empty"),
        ("   ", "non-empty"),
        ("memory://somewhere", "takes no location"),
        ("postgres://db/keys", "unknown key store scheme 'postgres'"),
        ("http://example.com/keys", "unknown key store scheme 'http'"),
    ],
)
def test_open_store_refuses_unknown_urls(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        open_store(url)
