"""The key store contract, run against every backend (`backend` fixture: memory, SQLite, Redis).

Each test states one rule of `semantics.md` and proves it with the records themselves: who holds
the claim, which result is stored, which fence was issued, and that a refused call changed nothing.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from store_backends import ORPHAN_RETENTION, Backend, damage, raw_state, redis_store

from idempotency import (
    ClaimOutcome,
    ClaimStatus,
    CorruptRecord,
    KeyStore,
    LimitExceeded,
    RecordState,
    SQLiteKeyStore,
    StoreUnavailable,
    unreadable_records,
)
from idempotency._stores.store import (
    DEFAULT_MAX_KEY_BYTES,
    DEFAULT_MAX_RESULT_BYTES,
    FENCE_MEMORY,
)

pytestmark = pytest.mark.anyio

KEY = "scope/tool/key-1"
FP = "fp-a"
OTHER_FP = "fp-b"
LEASE = 10.0
RETENTION = 3600.0


async def claimed(store: KeyStore, key: str = KEY, *, takeover: bool = False) -> ClaimOutcome:
    outcome = await store.claim(key, FP, lease=LEASE, takeover=takeover)
    assert outcome.status is ClaimStatus.CLAIMED, outcome
    assert outcome.token
    return outcome


def token_of(outcome: ClaimOutcome) -> str:
    assert outcome.token is not None
    return outcome.token


# -- rule 1: claim is atomic -------------------------------------------------------------------


async def test_exactly_one_of_fifty_concurrent_claims_runs(backend: Backend) -> None:
    outcomes: list[ClaimOutcome] = []

    async def claimer() -> None:
        outcomes.append(await backend.store.claim(KEY, FP, lease=LEASE, takeover=True))

    async with anyio.create_task_group() as tg:
        for _ in range(50):
            tg.start_soon(claimer)

    winners = [o for o in outcomes if o.status is ClaimStatus.CLAIMED]
    assert len(outcomes) == 50
    assert len(winners) == 1
    assert {o.status for o in outcomes if o not in winners} == {ClaimStatus.BUSY}
    record = await backend.store.get(KEY)
    assert record is not None
    assert (record.token, record.fence, record.attempts) == (winners[0].token, 1, 1)


async def test_exactly_one_of_four_processes_claims(backend: Backend) -> None:
    if backend.name == "memory":
        pytest.skip("the memory store lives in one process")
    script = Path(__file__).with_name("_claimer.py")
    command = [sys.executable, str(script), backend.name, backend.location, backend.prefix, KEY, FP]
    processes = [await anyio.open_process(command, cwd=Path(__file__).parents[2]) for _ in range(4)]
    try:
        with anyio.fail_after(60):
            outputs = [BufferedByteReceiveStream(p.stdout) for p in processes if p.stdout]
            for output in outputs:  # the barrier: every process has its store open
                assert await output.receive_until(b"\n", 100) == b"ready"
            for process in processes:  # then all are released together
                assert process.stdin is not None
                await process.stdin.send(b"go\n")
            answers = [json.loads(await output.receive_until(b"\n", 10_000)) for output in outputs]
            for process in processes:
                assert await process.wait() == 0
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
            await process.aclose()

    statuses = sorted(answer["status"] for answer in answers)
    assert statuses == ["busy", "busy", "busy", "claimed"]
    winner = next(answer for answer in answers if answer["status"] == "claimed")
    record = await backend.store.get(KEY)
    assert record is not None
    assert (record.token, record.fence, record.attempts) == (winner["token"], 1, 1)


# -- rule 2: every later transition is a compare-and-set on the token --------------------------


async def test_stale_token_can_neither_complete_release_nor_renew_after_takeover(
    backend: Backend,
) -> None:
    store = backend.store
    stale = await claimed(store)
    await backend.advance(LEASE + 1)
    fresh = await claimed(store, takeover=True)
    assert fresh.took_over and fresh.token != stale.token
    taken = await store.get(KEY)

    assert not await store.complete(KEY, token_of(stale), b"stale result", retention=RETENTION)
    assert not await store.release(KEY, token_of(stale))
    assert not await store.renew(KEY, token_of(stale), lease=LEASE)
    assert await store.get(KEY) == taken  # the stale worker changed nothing

    assert await store.complete(KEY, token_of(fresh), b"fresh result", retention=RETENTION)
    assert not await store.complete(KEY, token_of(stale), b"stale result", retention=RETENTION)
    assert not await store.release(KEY, token_of(stale))
    replay = await store.claim(KEY, FP, lease=LEASE, takeover=True)
    assert replay.status is ClaimStatus.REPLAY
    assert (replay.result, replay.fence, replay.attempts) == (b"fresh result", 2, 2)


async def test_the_owner_cannot_complete_twice_or_release_after_completing(
    backend: Backend,
) -> None:
    store = backend.store
    owner = await claimed(store)
    assert await store.complete(KEY, token_of(owner), b"first", retention=RETENTION)
    assert not await store.complete(KEY, token_of(owner), b"second", retention=RETENTION)
    assert not await store.release(KEY, token_of(owner))
    assert not await store.renew(KEY, token_of(owner), lease=LEASE)
    record = await store.get(KEY)
    assert record is not None and record.state is RecordState.COMPLETED
    assert record.result == b"first"


async def test_unknown_key_and_wrong_token_change_nothing(backend: Backend) -> None:
    store = backend.store
    assert not await store.complete("nobody", "no-token", b"r", retention=RETENTION)
    assert not await store.release("nobody", "no-token")
    assert not await store.renew("nobody", "no-token", lease=LEASE)
    assert await store.get("nobody") is None
    owner = await claimed(store)
    before = await store.get(KEY)
    assert not await store.complete(KEY, "forged-token", b"r", retention=RETENTION)
    assert not await store.release(KEY, "forged-token")
    assert not await store.renew(KEY, "forged-token", lease=LEASE)
    assert await store.get(KEY) == before
    assert await store.complete(KEY, token_of(owner), b"r", retention=RETENTION)


# -- rule 3: the fingerprint is kept in every state --------------------------------------------


async def test_other_fingerprint_is_a_mismatch_in_every_state(backend: Backend) -> None:
    store = backend.store
    owner = await claimed(store)
    during = await store.claim(KEY, OTHER_FP, lease=LEASE, takeover=True)
    assert during.status is ClaimStatus.MISMATCH and during.token is None
    assert await store.complete(KEY, token_of(owner), b"r", retention=RETENTION)
    after = await store.claim(KEY, OTHER_FP, lease=LEASE, takeover=True)
    assert after.status is ClaimStatus.MISMATCH and after.result is None
    same = await store.claim(KEY, FP, lease=LEASE, takeover=True)
    assert same.status is ClaimStatus.REPLAY and same.result == b"r"

    await claimed(store, "lost")
    await backend.advance(LEASE + 1)
    lost = await store.claim("lost", FP, lease=LEASE, takeover=False)
    assert lost.status is ClaimStatus.UNKNOWN
    mismatch = await store.claim("lost", OTHER_FP, lease=LEASE, takeover=True)
    assert mismatch.status is ClaimStatus.MISMATCH


# -- rule 4 and lease expiry --------------------------------------------------------------------


async def test_running_lease_makes_duplicates_busy_with_a_retry_hint(backend: Backend) -> None:
    store = backend.store
    await claimed(store)
    await backend.advance(4)
    busy = await store.claim(KEY, FP, lease=LEASE, takeover=True)
    assert busy.status is ClaimStatus.BUSY and busy.token is None
    assert busy.retry_after is not None
    assert busy.retry_after == pytest.approx(LEASE - 4, abs=0.5)


async def test_renewal_extends_the_lease(backend: Backend) -> None:
    store = backend.store
    owner = await claimed(store)
    await backend.advance(LEASE - 2)
    assert await store.renew(KEY, token_of(owner), lease=LEASE)
    await backend.advance(LEASE - 2)  # past the first lease, inside the renewed one
    assert (await store.claim(KEY, FP, lease=LEASE, takeover=True)).status is ClaimStatus.BUSY
    await backend.advance(3)
    taken = await store.claim(KEY, FP, lease=LEASE, takeover=True)
    assert taken.status is ClaimStatus.CLAIMED and taken.took_over
    assert not await store.renew(KEY, token_of(owner), lease=LEASE)


async def test_expired_lease_is_taken_over_when_the_policy_allows(backend: Backend) -> None:
    store = backend.store
    first = await claimed(store)
    await backend.advance(LEASE)  # the deadline itself is already expired
    second = await store.claim(KEY, FP, lease=LEASE, takeover=True)
    assert second.status is ClaimStatus.CLAIMED and second.took_over
    assert second.token != first.token
    assert (second.fence, second.attempts) == (2, 2)
    record = await store.get(KEY)
    assert record is not None and record.state is RecordState.IN_PROGRESS
    assert (record.token, record.fence, record.attempts) == (second.token, 2, 2)


async def test_expired_lease_turns_unknown_and_stays_unknown_until_settled(
    backend: Backend,
) -> None:
    store = backend.store
    first = await claimed(store)
    await backend.advance(LEASE + 1)
    lost = await store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert lost.status is ClaimStatus.UNKNOWN and lost.token is None
    assert (lost.fence, lost.attempts) == (1, 1)
    for step in (0, 1, LEASE * 10, RETENTION * 48):  # not even a long wait forgets it
        await backend.advance(step)
        for takeover in (False, True):
            again = await store.claim(KEY, FP, lease=LEASE, takeover=takeover)
            assert again.status is ClaimStatus.UNKNOWN, (step, takeover, again)
    assert not await store.complete(KEY, token_of(first), b"late", retention=RETENTION)
    assert not await store.release(KEY, token_of(first))
    record = await store.get(KEY)
    assert record is not None
    assert (record.state, record.token, record.expires_at) == (RecordState.UNKNOWN, None, None)
    assert await store.purge_expired() == 0
    assert await store.get(KEY) == record


async def test_settle_with_a_result_makes_it_the_replay(backend: Backend) -> None:
    store = backend.store
    await claimed(store)
    await backend.advance(LEASE + 1)
    assert (await store.claim(KEY, FP, lease=LEASE, takeover=False)).status is ClaimStatus.UNKNOWN
    assert await store.settle(KEY, result=b"reconciled", retention=RETENTION)
    replay = await store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert replay.status is ClaimStatus.REPLAY
    assert (replay.result, replay.fence, replay.attempts) == (b"reconciled", 1, 1)
    assert not await store.settle(KEY, result=b"again", retention=RETENTION)
    await backend.advance(RETENTION)
    assert await store.get(KEY) is None  # a settled result is kept for its retention only


async def test_settle_with_none_lets_the_next_claim_run_with_a_higher_fence(
    backend: Backend,
) -> None:
    store = backend.store
    await claimed(store)
    await backend.advance(LEASE + 1)
    assert (await store.claim(KEY, FP, lease=LEASE, takeover=False)).status is ClaimStatus.UNKNOWN
    assert await store.settle(KEY, result=None, retention=RETENTION)
    assert await store.get(KEY) is None
    rerun = await store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert rerun.status is ClaimStatus.CLAIMED and not rerun.took_over
    assert (rerun.fence, rerun.attempts) == (2, 2)


async def test_settle_refuses_records_that_are_not_unknown(backend: Backend) -> None:
    store = backend.store
    assert not await store.settle("absent", result=b"r", retention=RETENTION)
    owner = await claimed(store)
    running = await store.get(KEY)
    assert not await store.settle(KEY, result=b"r", retention=RETENTION)
    assert not await store.settle(KEY, result=None, retention=RETENTION)
    assert await store.get(KEY) == running
    assert await store.complete(KEY, token_of(owner), b"done", retention=RETENTION)
    assert not await store.settle(KEY, result=None, retention=RETENTION)
    replay = await store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert replay.result == b"done"


# -- retention -----------------------------------------------------------------------------------


async def test_retention_expiry_forgets_the_record_but_not_its_fence(backend: Backend) -> None:
    """Rule 25: a key's fence never repeats, even across expiry. A claim of a key whose record
    expired is a new intent (attempts from 1) with a fence above the record's last, whether
    the expired record is still stored or was purged."""
    store = backend.store
    owner = await claimed(store)
    assert await store.complete(KEY, token_of(owner), b"r", retention=60)
    await backend.advance(59)
    kept = await store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert kept.status is ClaimStatus.REPLAY and kept.result == b"r"
    await backend.advance(1)
    assert await store.get(KEY) is None
    assert await store.list_records() == []
    forgotten = await store.claim(KEY, OTHER_FP, lease=LEASE, takeover=False)
    assert forgotten.status is ClaimStatus.CLAIMED  # not even the fingerprint is remembered
    assert (forgotten.fence, forgotten.attempts) == (2, 1)
    assert await store.complete(KEY, token_of(forgotten), b"r2", retention=60)
    await backend.advance(60)
    assert await store.purge_expired() in ((0, 1) if backend.name.startswith("redis") else (1,))
    again = await store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert (again.status, again.fence, again.attempts) == (ClaimStatus.CLAIMED, 3, 1)


async def test_an_expired_tombstone_leaves_its_fence_and_a_new_intent_begins(
    backend: Backend,
) -> None:
    """A released claim retried while its tombstone is kept goes on counting (the same
    intent); once the tombstone expired and was purged, the next claim is a new intent whose
    fence still goes on."""
    store = backend.store
    first = await claimed(store)
    assert await store.release(KEY, token_of(first))
    retry = await claimed(store)
    assert (retry.fence, retry.attempts) == (2, 2)
    assert await store.release(KEY, token_of(retry))
    await backend.advance(ORPHAN_RETENTION)
    await store.purge_expired()
    later = await claimed(store)
    assert (later.fence, later.attempts) == (3, 1)


async def test_a_settled_record_with_a_short_retention_does_not_repeat_its_fence(
    backend: Backend,
) -> None:
    """Issue 48's double charge at the same fence: an UNKNOWN record settled as completed with
    a short retention vanished, and the next retry ran at fence 1 again."""
    store = backend.store
    await claimed(store)
    await backend.advance(LEASE + 1)
    assert (await store.claim(KEY, FP, lease=LEASE, takeover=False)).status is ClaimStatus.UNKNOWN
    assert await store.settle(KEY, result=b"charged", retention=60)
    await backend.advance(61)
    await store.purge_expired()
    rerun = await claimed(store)
    assert (rerun.fence, rerun.attempts) == (2, 1)


async def test_a_fence_is_remembered_for_fence_memory_after_the_record_expired(
    backend: Backend,
) -> None:
    """The bound docs/guarantee.md states: FENCE_MEMORY past the record's expiry, no longer."""
    store = backend.store
    for key, memory in (("kept", FENCE_MEMORY - 1), ("gone", FENCE_MEMORY)):
        owner = await claimed(store, key)
        assert await store.complete(key, token_of(owner), b"r", retention=60)
        await backend.advance(60)
        await store.purge_expired()
        await backend.advance(memory)
        await store.purge_expired()
        again = await claimed(store, key)
        assert (key, again.fence, again.attempts) == (key, 2 if key == "kept" else 1, 1)


async def test_an_in_progress_record_whose_worker_died_never_expires(backend: Backend) -> None:
    """Rule 25: a record whose holder is gone (its lease ran out, nobody retried) is kept, with
    no expiry, however long it waits; the first claim that finds it turns it UNKNOWN and says
    so (`turned_unknown`), a later one finds it UNKNOWN."""
    store = backend.store
    owner = await claimed(store)
    assert await store.renew(KEY, token_of(owner), lease=LEASE)
    await backend.advance(LEASE + ORPHAN_RETENTION + FENCE_MEMORY + RETENTION)
    assert await store.purge_expired() == 0
    orphan = await store.get(KEY)
    assert orphan is not None
    assert (orphan.state, orphan.expires_at, orphan.fence) == (RecordState.IN_PROGRESS, None, 1)
    assert [r.key for r in await store.list_records(state=RecordState.IN_PROGRESS)] == [KEY]
    lost = await store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert (lost.status, lost.fence, lost.turned_unknown) == (ClaimStatus.UNKNOWN, 1, True)
    found = await store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert (found.status, found.fence, found.turned_unknown) == (ClaimStatus.UNKNOWN, 1, False)
    assert [r.key for r in await store.list_records(state=RecordState.UNKNOWN)] == [KEY]


async def test_results_replay_byte_for_byte(backend: Backend) -> None:
    store = backend.store
    payload = bytes(range(256)) * 4 + b"\x00\xff{}\r\n"
    owner = await claimed(store)
    assert await store.complete(KEY, token_of(owner), payload, retention=RETENTION)
    replay = await store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert replay.status is ClaimStatus.REPLAY and replay.result == payload
    assert replay.completed_at is not None
    record = await store.get(KEY)
    assert record is not None and record.result == payload
    assert record.completed_at == replay.completed_at


async def test_an_empty_result_is_a_result(backend: Backend) -> None:
    owner = await claimed(backend.store)
    assert await backend.store.complete(KEY, token_of(owner), b"", retention=RETENTION)
    replay = await backend.store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert replay.status is ClaimStatus.REPLAY and replay.result == b""


# -- fences --------------------------------------------------------------------------------------


async def test_fence_strictly_increases_across_claim_release_claim_takeover(
    backend: Backend,
) -> None:
    store = backend.store
    fences = []
    first = await claimed(store)
    fences.append(first.fence)
    assert await store.release(KEY, token_of(first))
    assert not await store.release(KEY, token_of(first))
    second = await claimed(store)
    fences.append(second.fence)
    await backend.advance(LEASE + 1)
    third = await claimed(store, takeover=True)
    assert third.took_over
    fences.append(third.fence)
    assert await store.complete(KEY, token_of(third), b"r", retention=RETENTION)
    replay = await store.claim(KEY, FP, lease=LEASE, takeover=True)
    fences.append(replay.fence)
    assert fences == [1, 2, 3, 3]
    assert replay.attempts == 3


# -- rule 5: waiting for a running duplicate ----------------------------------------------------


async def test_a_waiter_is_woken_by_completion(backend: Backend) -> None:
    store = backend.store
    owner = await claimed(store)
    returned = anyio.Event()
    seen = []

    async def waiter() -> None:
        seen.append(await store.wait(KEY, timeout=30))
        returned.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        with anyio.move_on_after(0.2):
            await returned.wait()
        assert not returned.is_set(), "wait() returned while the record was in progress"
        completed_at = time.monotonic()
        assert await store.complete(KEY, token_of(owner), b"r", retention=RETENTION)
        with anyio.fail_after(5):
            await returned.wait()
        latency = time.monotonic() - completed_at
    [record] = seen
    assert record is not None and record.state is RecordState.COMPLETED
    assert record.result == b"r"
    assert latency < 1.0, f"the waiter woke {latency:.3f}s after completion"


async def test_a_waiter_sees_a_completion_made_through_another_instance(
    backend: Backend,
) -> None:
    other = backend.reopen()
    owner = await claimed(backend.store)
    assert (await other.claim(KEY, FP, lease=LEASE, takeover=False)).status is ClaimStatus.BUSY
    returned = anyio.Event()
    seen = []

    async def waiter() -> None:
        seen.append(await backend.store.wait(KEY, timeout=30))
        returned.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        with anyio.move_on_after(0.2):
            await returned.wait()
        assert not returned.is_set()
        completed_at = time.monotonic()
        assert await other.complete(KEY, token_of(owner), b"r", retention=RETENTION)
        with anyio.fail_after(5):
            await returned.wait()
        latency = time.monotonic() - completed_at
    [record] = seen
    assert record is not None and record.state is RecordState.COMPLETED and record.result == b"r"
    assert latency < 1.0


async def test_wait_returns_after_its_timeout_on_a_stuck_record(backend: Backend) -> None:
    owner = await claimed(backend.store)
    started = time.monotonic()
    record = await backend.store.wait(KEY, timeout=0.3)
    waited = time.monotonic() - started
    assert 0.3 <= waited < 1.3
    assert record is not None and record.state is RecordState.IN_PROGRESS
    assert record.token == owner.token


async def test_wait_returns_at_once_when_nothing_runs(backend: Backend) -> None:
    store = backend.store
    with anyio.fail_after(1):
        assert await store.wait("absent", timeout=30) is None
        owner = await claimed(store)
        assert await store.complete(KEY, token_of(owner), b"r", retention=RETENTION)
        record = await store.wait(KEY, timeout=30)
    assert record is not None and record.result == b"r"


# -- bad records, bad stores, bad sizes ----------------------------------------------------------


@pytest.mark.parametrize("how", ["garbled", "wrong-type"])
async def test_a_corrupt_record_is_reported_and_left_untouched(backend: Backend, how: str) -> None:
    store = backend.store
    owner = await claimed(store)
    other = await claimed(store, "other")
    assert await store.complete("other", token_of(other), b"fine", retention=RETENTION)
    await damage(backend, KEY, how)
    before = await raw_state(backend, KEY)

    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.claim(KEY, FP, lease=LEASE, takeover=True),
        lambda: store.claim(KEY, FP, lease=LEASE, takeover=False),
        lambda: store.complete(KEY, token_of(owner), b"r", retention=RETENTION),
        lambda: store.release(KEY, token_of(owner)),
        lambda: store.renew(KEY, token_of(owner), lease=LEASE),
        lambda: store.settle(KEY, result=b"r", retention=RETENTION),
        lambda: store.settle(KEY, result=None, retention=RETENTION),
        lambda: store.get(KEY),
        lambda: store.wait(KEY, timeout=1),
    ]
    for call in calls:
        with pytest.raises(CorruptRecord) as caught:
            await call()
        assert caught.value.key == KEY and caught.value.why
    # An operator's listing still shows every readable record, and reports the damaged one
    # apart (`mcp-once keys list` shows it as corrupt).
    with unreadable_records() as unreadable:
        assert [r.key for r in await store.list_records()] == ["other"]
    assert [(found.key, bool(found.why)) for found in unreadable] == [(KEY, True)]
    await backend.advance(LEASE + 1)
    with pytest.raises(CorruptRecord):
        await store.claim(KEY, FP, lease=LEASE, takeover=True)
    await backend.advance(ORPHAN_RETENTION + RETENTION)  # past every expiry the record had
    assert await store.purge_expired() == 1  # "other" went; the damaged record is left alone
    assert await store.get("other") is None
    assert await raw_state(backend, KEY) == before


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_an_unreachable_store_is_unavailable_and_nothing_runs(
    backend: Backend, tmp_path: Path
) -> None:
    if backend.name == "memory":
        pytest.skip("the memory store is always reachable")
    unreachable: list[KeyStore] = []
    if backend.name == "sqlite":
        unreachable.append(SQLiteKeyStore(tmp_path / "missing" / "keys.db"))
        unreachable.append(SQLiteKeyStore(tmp_path))  # a directory, not a file
    elif backend.name == "redis-sentinel":  # no Sentinel answers
        dead = f"redis+sentinel://127.0.0.1:{_closed_port()},127.0.0.1:{_closed_port()}/svc"
        unreachable.append(redis_store(dead, backend.prefix))
    else:
        unreachable.append(redis_store(f"redis://127.0.0.1:{_closed_port()}/0", backend.prefix))
    for store in unreachable:
        with anyio.fail_after(30):
            with pytest.raises(StoreUnavailable):
                await store.claim(KEY, FP, lease=LEASE, takeover=False)
            with pytest.raises(StoreUnavailable):
                await store.get(KEY)
            with pytest.raises(StoreUnavailable):
                await store.complete(KEY, "token", b"r", retention=RETENTION)
            with pytest.raises(StoreUnavailable):
                await store.list_records()
        await store.aclose()
    assert not (tmp_path / "missing").exists()
    assert await backend.store.get(KEY) is None  # the real store saw nothing


async def test_an_oversized_key_is_refused_and_nothing_written(backend: Backend) -> None:
    store = backend.store
    too_long = "k" * (DEFAULT_MAX_KEY_BYTES + 1)
    with pytest.raises(LimitExceeded) as caught:
        await store.claim(too_long, FP, lease=LEASE, takeover=False)
    assert (caught.value.what, caught.value.limit) == ("key", DEFAULT_MAX_KEY_BYTES)
    with pytest.raises(LimitExceeded):
        await store.claim("", FP, lease=LEASE, takeover=False)
    assert await store.list_records() == []
    assert await store.purge_expired() == 0
    longest = "k" * DEFAULT_MAX_KEY_BYTES
    await claimed(store, longest)


async def test_an_oversized_result_is_refused_and_the_claim_kept(backend: Backend) -> None:
    store = backend.store
    owner = await claimed(store)
    before = await store.get(KEY)
    too_big = b"x" * (DEFAULT_MAX_RESULT_BYTES + 1)
    with pytest.raises(LimitExceeded) as caught:
        await store.complete(KEY, token_of(owner), too_big, retention=RETENTION)
    assert caught.value.what == "result" and caught.value.size == len(too_big)
    assert await store.get(KEY) == before
    largest = b"y" * DEFAULT_MAX_RESULT_BYTES
    assert await store.complete(KEY, token_of(owner), largest, retention=RETENTION)
    assert (await store.claim(KEY, FP, lease=LEASE, takeover=False)).result == largest

    await claimed(store, "lost")
    await backend.advance(LEASE + 1)
    assert (await store.claim("lost", FP, lease=LEASE, takeover=False)).status is (
        ClaimStatus.UNKNOWN
    )
    unknown = await store.get("lost")
    with pytest.raises(LimitExceeded):
        await store.settle("lost", result=too_big, retention=RETENTION)
    assert await store.get("lost") == unknown


# -- operator views -------------------------------------------------------------------------------


async def test_list_records_by_state(backend: Backend) -> None:
    store = backend.store
    await claimed(store, "lost")
    await backend.advance(LEASE + 1)
    assert (await store.claim("lost", FP, lease=LEASE, takeover=False)).status is (
        ClaimStatus.UNKNOWN
    )
    done = await claimed(store, "done")
    assert await store.complete("done", token_of(done), b"r", retention=RETENTION)
    await backend.advance(1)
    await claimed(store, "running")
    released = await claimed(store, "released")
    assert await store.release("released", token_of(released))

    def keys(records: list[object]) -> list[str]:
        return [r.key for r in records]  # type: ignore[attr-defined]

    assert keys(await store.list_records()) == ["lost", "done", "running"]  # oldest first
    assert keys(await store.list_records(state=RecordState.IN_PROGRESS)) == ["running"]
    assert keys(await store.list_records(state=RecordState.COMPLETED)) == ["done"]
    assert keys(await store.list_records(state=RecordState.UNKNOWN)) == ["lost"]
    assert await store.list_records(state=RecordState.RELEASED) == []
    limited = keys(await store.list_records(limit=2))
    if getattr(store, "oldest_first", lambda state: True)(None):
        assert limited == ["lost", "done"]
    else:  # any two (the first its scan met), oldest first among themselves
        assert len(limited) == 2 and limited == [
            k for k in ("lost", "done", "running") if k in limited
        ]
    [completed] = await store.list_records(state=RecordState.COMPLETED)
    assert (completed.fingerprint, completed.result, completed.fence) == (FP, b"r", 1)
    assert completed.token is None and completed.completed_at is not None
    [running] = await store.list_records(state=RecordState.IN_PROGRESS)
    assert running.token is not None and running.lease_deadline is not None


async def test_list_records_created_before_counts_only_older_records_to_the_limit(
    backend: Backend,
) -> None:
    """`created_before` is a filter like the others, applied before `limit`: a store that stops
    at the first matches it meets (Redis) still answers only records that old (the CLI's
    `--older-than`)."""
    store = backend.store
    for key in ("old-1", "old-2", "new-1", "new-2"):
        await claimed(store, key)
        await backend.advance(100 if key == "old-2" else 1)
    records = {r.key: r for r in await store.list_records()}
    cutoff = records["old-2"].created_at
    older = [r.key for r in await store.list_records(created_before=cutoff, limit=2)]
    assert older == ["old-1", "old-2"]
    [one] = [r.key for r in await store.list_records(created_before=cutoff, limit=1)]
    assert one in ("old-1", "old-2")
    assert await store.list_records(created_before=records["old-1"].created_at - 1) == []
    newer = await store.list_records(created_before=cutoff + 50, state=RecordState.IN_PROGRESS)
    assert [r.key for r in newer] == ["old-1", "old-2"]


async def test_purge_expired_removes_only_expired_records(backend: Backend) -> None:
    store = backend.store
    short = await claimed(store, "short")
    assert await store.complete("short", token_of(short), b"r", retention=60)
    long = await claimed(store, "long")
    assert await store.complete("long", token_of(long), b"r", retention=600)
    await claimed(store, "lost")
    await backend.advance(LEASE + 1)
    assert (await store.claim("lost", FP, lease=LEASE, takeover=False)).status is (
        ClaimStatus.UNKNOWN
    )
    assert await store.purge_expired() == 0
    await backend.advance(60)
    purged = await store.purge_expired()
    if backend.name.startswith("redis"):
        assert purged in (0, 1)  # Redis may have let the key expire by itself
    else:
        assert purged == 1
    assert await store.purge_expired() == 0
    assert [r.key for r in await store.list_records()] == ["long", "lost"]
    assert await store.get("short") is None


@pytest.mark.parametrize("limit", [-1, -5])
async def test_negative_list_limit_is_refused_by_every_backend(
    backend: Backend, limit: int
) -> None:
    with pytest.raises(ValueError, match="limit"):
        await backend.store.list_records(limit=limit)
