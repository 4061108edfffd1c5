"""What only the Redis journal promises: its own clock (Redis TIME) when given none, a key
layout a Cluster accepts (one hash tag per run), writes that fail closed when their durability
cannot be confirmed, and its memory per entry."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
import redis
from journal_kinds import entry
from redis.crc import key_slot

from orchestrator._journal import FencedOut, JournalUnavailable, RunBusy
from orchestrator._journal.redis import RedisJournal

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


@pytest.fixture
def prefix(redis_namespace: str) -> str:
    return f"{redis_namespace}:journal:"


Opened = Callable[..., RedisJournal]


@pytest.fixture
async def opened() -> AsyncIterator[Opened]:
    """`RedisJournal.from_url`, each journal it made closed after the test."""
    made: list[RedisJournal] = []

    def open_one(url: str, **options: Any) -> RedisJournal:
        made.append(RedisJournal.from_url(url, **options))
        return made[-1]

    yield open_one
    for journal in made:
        await journal.aclose()


async def test_without_a_clock_leases_run_on_the_redis_clock(
    redis_url: str, prefix: str, opened: Opened
) -> None:
    journal = opened(redis_url, prefix=prefix)
    fence = await journal.acquire("run-1", "a", 0.2)
    with pytest.raises(RunBusy):
        await journal.acquire("run-1", "b", 0.2)
    summary = await journal.run("run-1")
    assert summary is not None and summary.lease_deadline is not None
    assert summary.lease_deadline - summary.created_at == pytest.approx(0.2, abs=1e-3)
    # Past the lease on the server's clock (a real wait: the Redis clock cannot be moved).

    await anyio.sleep(0.25)
    assert await journal.acquire("run-1", "b", 10.0) == fence + 1


async def test_a_run_keeps_its_keys_in_one_slot(
    redis_url: str, prefix: str, opened: Opened
) -> None:
    journal = opened(redis_url, prefix=prefix)
    for run_id in ("run-1", "a:b", "with {braces}", "é"):
        fence = await journal.acquire(run_id, "a", 10.0)
        await journal.record_intent(run_id, fence, entry(0, run_id=run_id))
    keys = [
        k.decode()
        for k in redis.Redis.from_url(redis_url).keys(f"{prefix}*")
        if not k.decode().endswith(":runs")
    ]
    by_run: dict[str, set[int]] = {}
    for key in keys:
        by_run.setdefault(key.rsplit(":", 1)[0], set()).add(key_slot(key.encode()))
    assert len(by_run) == 4
    assert all(len(slots) == 1 for slots in by_run.values()), by_run


async def test_finishing_gives_the_run_a_ttl_of_the_retention(
    redis_url: str, prefix: str, opened: Opened
) -> None:
    journal = opened(redis_url, prefix=prefix, retention=3600.0)
    fence = await journal.acquire("run-1", "a", 10.0)
    await journal.record_intent("run-1", fence, entry(0))
    raw = redis.Redis.from_url(redis_url)
    assert raw.pttl(f"{prefix}{{run-1}}:run") == -1  # running: kept until finished
    await journal.finish("run-1", fence)
    for suffix in ("run", "e"):
        assert 3_500_000 < raw.pttl(f"{prefix}{{run-1}}:{suffix}") <= 3_600_000


async def test_a_write_whose_durability_cannot_be_confirmed_fails_closed(
    redis_url: str, prefix: str, opened: Opened
) -> None:
    """One replica asked for, none there: the write is refused as unavailable, so its call
    would not be sent."""
    journal = opened(redis_url, prefix=prefix, wait_replicas=1, wait_timeout=0.05)
    with pytest.raises(JournalUnavailable, match="not confirmed durable"):
        await journal.acquire("run-1", "a", 10.0)


async def test_waiting_for_no_replica_passes(redis_url: str, prefix: str, opened: Opened) -> None:
    journal = opened(redis_url, prefix=prefix, wait_replicas=0)
    fence = await journal.acquire("run-1", "a", 10.0)
    await journal.record_intent("run-1", fence, entry(0))
    with pytest.raises(FencedOut):
        await journal.record_intent("run-1", fence + 1, entry(1))


async def test_an_unreachable_redis_is_unavailable(opened: Opened) -> None:
    journal = opened("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    with pytest.raises(JournalUnavailable):
        await journal.acquire("run-1", "a", 10.0)


@pytest.mark.slow
async def test_the_journal_works_on_a_cluster(
    redis_cluster_url: str, prefix: str, opened: Opened
) -> None:
    journal = opened(redis_cluster_url, prefix=prefix)
    for n in range(10):  # enough runs to land on several masters
        run_id = f"run-{n}"
        fence = await journal.acquire(run_id, "a", 10.0)
        await journal.record_intent(run_id, fence, entry(0, run_id=run_id))
        await journal.mark_done(run_id, fence, 0)
        await journal.finish(run_id, fence)
    assert [(r.calls, r.state) for r in await journal.runs()] == [(1, "finished")] * 10
    assert await journal.sweep(now=10**12) == 10
    assert await journal.runs() == []


@pytest.mark.parametrize("calls", [20, 10_000])
async def test_bytes_per_entry(redis_url: str, prefix: str, calls: int) -> None:
    """MEMORY USAGE (every field counted: SAMPLES 0) of a run's entries hash, per entry; the
    target is at most 300 bytes. The head hash (~200 bytes) is per run, not per entry."""
    journal = RedisJournal.from_url(redis_url, prefix=prefix)
    run_id = str(uuid.uuid4())
    try:
        fence = await journal.acquire(run_id, "agent@host:1234", 30.0)
        for position in range(calls):
            await journal.record_intent(run_id, fence, entry(position, run_id=run_id))
            await journal.mark_done(run_id, fence, position)
        raw = redis.Redis.from_url(redis_url)
        entries = raw.memory_usage(f"{prefix}{{{run_id}}}:e", samples=0)
        head = raw.memory_usage(f"{prefix}{{{run_id}}}:run", samples=0)
    finally:
        await journal.aclose()
    assert entries is not None and head is not None
    per_entry = entries / calls
    print(f"\nRedis journal: {per_entry:.1f} bytes per entry over {calls} entries; head {head}")
    assert per_entry <= 300


async def test_the_journal_works_through_sentinel(
    redis_sentinel_url: str, prefix: str, opened: Opened
) -> None:
    journal = opened(redis_sentinel_url, prefix=prefix)
    fence = await journal.acquire("run-1", "a", 10.0)
    await journal.record_intent("run-1", fence, entry(0))
    await journal.mark_done("run-1", fence, 0)
    assert [(e.position, e.state) for e in await journal.entries("run-1")] == [(0, "done")]
