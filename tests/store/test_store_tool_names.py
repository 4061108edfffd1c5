"""Records name their tool, for `mcp-once keys list`, and records of the previous release, which
did not, still read.

The first half runs against every backend (`backend` fixture): the name given at claim is kept
by every transition, a record without one takes it from the next claim that writes it, listings
filter by it before counting their limit, and an over-long name is cut the same way everywhere.
The second half builds what the previous release left behind, byte for byte from its own
layout (not with this release's code): an SQLite file of schema 1 without the `tool` column,
and Redis records of header format 1.
"""

from __future__ import annotations

import shutil
import sqlite3
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
from fake_clock import EPOCH, FakeClock
from history_tamper import without_redis_history
from store_backends import Backend

from idempotency import (
    ClaimStatus,
    CorruptRecord,
    KeyStore,
    RecordState,
    RedisKeyStore,
    SQLiteKeyStore,
)
from idempotency._stores.sqlite import APPLICATION_ID
from idempotency._stores.store import MAX_TOOL_BYTES, tool_label

pytestmark = pytest.mark.anyio

FP = "fp-a"
LEASE = 10.0
RETENTION = 3600.0


# -- every backend -------------------------------------------------------------------------------


async def test_the_tool_name_is_kept_by_every_transition(backend: Backend) -> None:
    store = backend.store
    first = await store.claim("done", FP, lease=LEASE, takeover=False, tool="charge")
    assert first.token is not None
    assert (await store.get("done")).tool == "charge"  # type: ignore[union-attr]
    assert await store.renew("done", first.token, lease=LEASE)
    assert await store.complete("done", first.token, b"r", retention=RETENTION)
    completed = await store.get("done")
    assert completed is not None and (completed.state, completed.tool) == (
        RecordState.COMPLETED,
        "charge",
    )

    # Released, then claimed again: the new claim's name.
    gone = await store.claim("again", FP, lease=LEASE, takeover=False, tool="refund")
    assert gone.token is not None and await store.release("again", gone.token)
    await store.claim("again", FP, lease=LEASE, takeover=False, tool="refund")
    assert (await store.get("again")).tool == "refund"  # type: ignore[union-attr]

    # A lease that ran out: taken over, or turned UNKNOWN, and then settled.
    await store.claim("taken", FP, lease=LEASE, takeover=True, tool="ship")
    await store.claim("lost", FP, lease=LEASE, takeover=False, tool="charge")
    await backend.advance(LEASE + 1)
    taken = await store.claim("taken", FP, lease=LEASE, takeover=True, tool="ship")
    assert taken.took_over
    lost = await store.claim("lost", FP, lease=LEASE, takeover=False, tool="charge")
    assert lost.status is ClaimStatus.UNKNOWN
    for key, tool, state in (
        ("taken", "ship", RecordState.IN_PROGRESS),
        ("lost", "charge", RecordState.UNKNOWN),
    ):
        record = await store.get(key)
        assert record is not None and (record.state, record.tool) == (state, tool)
    assert await store.settle("lost", result=b"verdict", retention=RETENTION)
    settled = await store.get("lost")
    assert settled is not None and (settled.state, settled.tool) == (
        RecordState.COMPLETED,
        "charge",
    )


async def test_a_record_without_a_tool_name_takes_it_from_the_claim_that_writes_it(
    backend: Backend,
) -> None:
    """What a caller that gives no name (the previous release's guard, a direct store user)
    leaves: `tool` None; the next claim that writes the record names it, and a name already
    stored stays whatever a later claim says."""
    store = backend.store
    for key in ("lost", "taken", "kept"):
        await store.claim(key, FP, lease=LEASE, takeover=False)
        record = await store.get(key)
        assert record is not None and record.tool is None
    await backend.advance(LEASE + 1)
    lost = await store.claim("lost", FP, lease=LEASE, takeover=False, tool="charge")
    taken = await store.claim("taken", FP, lease=LEASE, takeover=True, tool="ship")
    assert (lost.status, taken.status) == (ClaimStatus.UNKNOWN, ClaimStatus.CLAIMED)
    assert [(await store.get(k)).tool for k in ("lost", "taken")] == ["charge", "ship"]  # type: ignore[union-attr]

    await store.claim("named", FP, lease=LEASE, takeover=True, tool="first")
    await backend.advance(LEASE + 1)
    await store.claim("named", FP, lease=LEASE, takeover=True, tool="second")
    assert (await store.get("named")).tool == "first"  # type: ignore[union-attr]


async def test_listing_filters_by_tool_before_counting_the_limit(backend: Backend) -> None:
    store = backend.store
    for n in range(6):  # interleaved, oldest first: c0 r1 c2 r3 c4 r5
        await store.claim(f"k{n}", FP, lease=LEASE, takeover=False, tool="cr"[n % 2] * 3)
        await backend.advance(1)
    await store.claim("k-none", FP, lease=LEASE, takeover=False)

    refunds = [r.key for r in await store.list_records(tool="rrr", limit=2)]
    if getattr(store, "oldest_first", lambda state: True)(None):
        assert refunds == ["k1", "k3"]  # the two oldest refunds, not "k1" alone
    else:  # two refunds (the first its scan met), oldest first among themselves
        assert (
            len(refunds) == 2 and refunds == sorted(refunds) and set(refunds) < {"k1", "k3", "k5"}
        )
    assert [r.key for r in await store.list_records(tool="ccc")] == ["k0", "k2", "k4"]
    assert await store.list_records(tool="nothing-of-that-name") == []
    assert [r.key for r in await store.list_records(tool="")] == ["k-none"]
    assert await store.list_records(state=RecordState.COMPLETED, tool="ccc") == []
    assert len(await store.list_records(state=RecordState.IN_PROGRESS, tool="ccc")) == 3


async def test_a_long_tool_name_is_cut_at_a_character_boundary_by_every_store(
    backend: Backend,
) -> None:
    long = "é" * MAX_TOOL_BYTES  # two bytes each: the cut falls inside a character
    await backend.store.claim("long", FP, lease=LEASE, takeover=False, tool=long)
    record = await backend.store.get("long")
    assert record is not None and record.tool == "é" * (MAX_TOOL_BYTES // 2)
    assert record.tool == tool_label(long)
    assert [r.key for r in await backend.store.list_records(tool=long)] == ["long"]


def test_tool_label_keeps_conforming_names_whole() -> None:
    name = "a" * 128  # the longest name MCP's naming rules allow
    assert tool_label(name) == name and tool_label("get.v2-x_y") == "get.v2-x_y"
    assert tool_label("") is None and tool_label(None) is None
    assert tool_label("bad\udcff") == "bad?"  # a lone surrogate UTF-8 cannot hold


# -- an SQLite file of the previous release (schema 1, no `tool` column) --------------------------

#: A key store file written by the previous release's own `SQLiteKeyStore` (commit e0633a1,
#: clock at EPOCH): "done" completed with result b"r" (retention 600 s), and "running" claimed
#: with a 10 s lease. Made by running that commit's code (`git archive e0633a1 idempotency`)
#: with `SQLiteKeyStore(path, clock=...)`: claim, complete, claim, close. Copied before use:
#: opening it upgrades it.
PREVIOUS_FILE = Path(__file__).parent / "fixtures" / "previous_release.sqlite"
#: The previous release's write statement, verbatim: it names its twelve columns.
PREVIOUS_UPSERT = (
    "INSERT OR REPLACE INTO records (key, state, fingerprint, fence, attempts, token, created_at,"
    " updated_at, lease_deadline, completed_at, expires_at, result)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
)
COMPLETED_ROW = ("done", "completed", FP, 1, 1, None, EPOCH, EPOCH, None, EPOCH, EPOCH + 600, b"r")


async def reads_the_previous_release(store: KeyStore, lease_runs_out: Callable[[], None]) -> None:
    """What the previous release left, a completed record "done" and a record "running" whose
    worker holds its lease, read by this release: no tool name, the result replayed; once the
    lease runs out, the next claim turns "running" UNKNOWN and names its tool."""
    done = await store.get("done")
    assert done is not None and (done.state, done.tool, done.result) == (
        RecordState.COMPLETED,
        None,
        b"r",
    )
    replay = await store.claim("done", FP, lease=LEASE, takeover=False, tool="charge")
    assert (replay.status, replay.result) == (ClaimStatus.REPLAY, b"r")
    listed = [(r.key, r.tool) for r in await store.list_records()]
    assert listed == [("done", None), ("running", None)]
    lease_runs_out()
    lost = await store.claim("running", FP, lease=LEASE, takeover=False, tool="charge")
    assert lost.status is ClaimStatus.UNKNOWN
    assert (await store.get("running")).tool == "charge"  # type: ignore[union-attr]


def previous_release_file(path: Path) -> None:
    shutil.copyfile(PREVIOUS_FILE, path)


def columns(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        found = [row[1] for row in conn.execute("PRAGMA table_info(records)")]
    conn.close()
    return found


async def test_a_schema_1_file_is_upgraded_in_place_and_its_records_read(tmp_path: Path) -> None:
    path = tmp_path / "previous.sqlite3"
    previous_release_file(path)
    assert "tool" not in columns(path)
    clock = FakeClock(EPOCH + 1)
    store = SQLiteKeyStore(path, clock=clock)
    try:
        await reads_the_previous_release(store, lambda: clock.advance(LEASE))
        fresh = await store.claim("new", FP, lease=LEASE, takeover=False, tool="charge")
        assert fresh.status is ClaimStatus.CLAIMED
    finally:
        await store.aclose()
    assert columns(path)[-2:] == ["tool", "delivered"]
    with sqlite3.connect(path) as conn:
        # Still version 1: the previous release opens the file as before.
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        # And its statements still work beside ours: a row it rewrites loses only the name and
        # the delivery mark (read as not delivered: merged, as that release merges it).
        conn.execute(PREVIOUS_UPSERT, ("new", *COMPLETED_ROW[1:]))
        rows = conn.execute(
            "SELECT key, state, fingerprint, fence, attempts, token, created_at, updated_at,"
            " lease_deadline, completed_at, expires_at, result FROM records ORDER BY key"
        ).fetchall()
    conn.close()
    assert [row[0] for row in rows] == ["done", "new", "running"]
    reopened = SQLiteKeyStore(path, clock=clock)
    try:
        new = await reopened.get("new")
        assert new is not None and (new.state, new.tool) == (RecordState.COMPLETED, None)
        assert not new.delivered
        assert (await reopened.get("running")).tool == "charge"  # type: ignore[union-attr]
    finally:
        await reopened.aclose()


async def test_two_stores_opening_one_schema_1_file_add_the_column_once(tmp_path: Path) -> None:
    path = tmp_path / "previous.sqlite3"
    previous_release_file(path)
    clock = FakeClock(EPOCH + 1)
    stores = [SQLiteKeyStore(path, clock=clock) for _ in range(4)]
    found = []

    async def read(store: SQLiteKeyStore) -> None:
        found.append(await store.get("done"))

    try:
        async with anyio.create_task_group() as tg:  # each store opens on its own thread
            for store in stores:
                tg.start_soon(read, store)
    finally:
        for store in stores:
            await store.aclose()
    assert columns(path).count("tool") == 1
    assert len(found) == 4 and all(r is not None and r.result == b"r" for r in found)


# -- Redis records of the previous release (header format 1, no tool name) ------------------------

#: The previous release's record header: format, state, then seven 8-byte integers.
HEAD = ">BBqqqqqqq"
COMPLETED, IN_PROGRESS = 2, 1


def previous_record(
    state: int, now_us: int, *, lease_us: int = 0, result: bytes = b"", token: bytes = b""
) -> bytes:
    completed_us = now_us if state == COMPLETED else 0
    header = struct.pack(
        HEAD, 1, state, 1, 1, now_us, now_us, lease_us, completed_us, now_us + 600_000_000
    )
    fingerprint = FP.encode()
    return (
        header
        + struct.pack(">H", len(fingerprint))
        + fingerprint
        + bytes([len(token)])
        + token
        + result
    )


@pytest.fixture
async def redis_pair(redis_url: str, prefix: str) -> AsyncIterator[tuple[RedisKeyStore, Any]]:
    store = RedisKeyStore.from_url(redis_url, prefix=prefix)
    raw = aioredis.Redis.from_url(redis_url)
    try:
        yield store, raw
    finally:
        await store.aclose()
        await raw.aclose()


def rkey(prefix: str, key: str) -> bytes:
    return f"{prefix}{{{key}}}".encode()


@pytest.mark.redis
@pytest.mark.parametrize("record_format", [2, 3])
async def test_redis_records_of_the_previous_format_still_read(
    redis_pair: tuple[RedisKeyStore, Any], redis_url: str, prefix: str, record_format: int
) -> None:
    """Read by this release as it writes (format 3: records carrying their history), and as
    it writes under `record_format=2` for a rolling upgrade (no history, formats 1 and 2)."""
    _, raw = redis_pair
    store = RedisKeyStore.from_url(redis_url, prefix=prefix, record_format=record_format)
    seconds, micros = await raw.time()
    now_us = seconds * 1_000_000 + micros
    await raw.set(rkey(prefix, "done"), previous_record(COMPLETED, now_us, result=b"r"), px=600_000)
    running = previous_record(IN_PROGRESS, now_us, lease_us=now_us + 1_000_000, token=b"t" * 32)
    await raw.set(rkey(prefix, "running"), running, px=600_000)

    try:
        await reads_the_previous_release(store, lambda: store.advance_clock_for_testing(2.0))
    finally:
        await store.aclose()
    # Named now, so in a format that carries the name (3: its history too, the events from
    # this release on).
    stored = await raw.get(rkey(prefix, "running"))
    assert stored[0] == record_format and b"\x06charge" in stored
    if record_format == 2:
        # A record nobody named stays in the previous format, byte for byte readable by it.
        assert (await raw.get(rkey(prefix, "done")))[0] == 1
    else:  # its replay was recorded: in its history, inside it
        assert (await raw.get(rkey(prefix, "done")))[0] == 3


@pytest.mark.redis
async def test_a_redis_record_with_a_truncated_tool_name_is_corrupt_and_left_alone(
    redis_pair: tuple[RedisKeyStore, Any], prefix: str
) -> None:
    store, raw = redis_pair
    await store.claim("k", FP, lease=LEASE, takeover=False, tool="charge")
    good = without_redis_history(await raw.get(rkey(prefix, "k")))  # format 2
    assert good.endswith(b"\x06charge")  # an in-progress record: nothing after the name
    await raw.set(rkey(prefix, "k"), good[:-3], keepttl=True)
    with pytest.raises(CorruptRecord) as caught:
        await store.get("k")
    assert caught.value.why == "truncated tool name"
    assert await raw.get(rkey(prefix, "k")) == good[:-3]
