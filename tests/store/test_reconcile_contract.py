"""Rule 19 in the stores: `reconcile` is one fenced transition on an UNKNOWN record, run
against every backend (`backend` fixture: memory, SQLite, Redis, Cluster, Sentinel; trio too).

A verdict acts only on the record still UNKNOWN under the fence it was asked about: of
concurrent resolvers (replicas, an operator's `settle`) exactly one wins, and a stale one
changes nothing.
"""

from __future__ import annotations

import anyio
import pytest
from store_backends import Backend

from idempotency import ClaimOutcome, ClaimStatus, KeyStore, RecordState
from idempotency._stores.store import ReconcilingStore

pytestmark = pytest.mark.anyio

KEY = "scope/tool/in-doubt"
FP = "fp-a"
LEASE = 10.0
RETENTION = 3600.0


def reconciling(store: KeyStore) -> ReconcilingStore:
    assert isinstance(store, ReconcilingStore)
    return store


async def in_doubt(backend: Backend) -> int:
    """A record left UNKNOWN by a worker that claimed it and vanished; its fence."""
    store = backend.store
    first = await store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert first.status is ClaimStatus.CLAIMED
    await backend.advance(LEASE + 1)
    lost = await store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert lost.status is ClaimStatus.UNKNOWN and lost.fence is not None
    return lost.fence


async def verdict(
    store: KeyStore, fence: int, result: bytes | None, fingerprint: str = FP
) -> ClaimOutcome | None:
    return await reconciling(store).reconcile(
        KEY, fingerprint, fence, result=result, lease=LEASE, retention=RETENTION
    )


async def test_happened_completes_the_record_and_replays_it(backend: Backend) -> None:
    fence = await in_doubt(backend)
    done = await verdict(backend.store, fence, b"charge ch_1")
    assert done is not None and done.status is ClaimStatus.REPLAY
    assert (done.result, done.fence, done.attempts) == (b"charge ch_1", fence, 1)
    replay = await backend.store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert replay.status is ClaimStatus.REPLAY and replay.result == b"charge ch_1"
    record = await backend.store.get(KEY)
    assert record is not None and record.state is RecordState.COMPLETED
    assert not record.delivered  # the lost attempt's caller never had it: its re-send gets it


async def test_not_happened_takes_it_over_with_a_higher_fence(backend: Backend) -> None:
    fence = await in_doubt(backend)
    taken = await verdict(backend.store, fence, None)
    assert taken is not None and taken.status is ClaimStatus.CLAIMED and taken.took_over
    assert (taken.fence, taken.attempts) == (fence + 1, 2)
    assert taken.token is not None
    busy = await backend.store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert busy.status is ClaimStatus.BUSY  # held, exactly as a claim holds it
    assert await backend.store.complete(KEY, taken.token, b"ran once", retention=RETENTION)
    replay = await backend.store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert replay.result == b"ran once"


async def test_a_stale_verdict_changes_nothing(backend: Backend) -> None:
    fence = await in_doubt(backend)
    taken = await verdict(backend.store, fence, None)
    assert taken is not None and taken.token is not None
    await backend.advance(LEASE + 1)  # the reconciled run dies too: UNKNOWN again, one fence up
    again = await backend.store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert again.status is ClaimStatus.UNKNOWN and again.fence == fence + 1
    before = await backend.store.get(KEY)
    assert await verdict(backend.store, fence, b"late") is None
    assert await verdict(backend.store, fence, None) is None
    assert await backend.store.get(KEY) == before


async def test_settle_and_reconcile_never_both_win(backend: Backend) -> None:
    fence = await in_doubt(backend)
    assert await backend.store.settle(KEY, result=b"operator", retention=RETENTION)
    assert await verdict(backend.store, fence, b"provider") is None
    assert await verdict(backend.store, fence, None) is None
    replay = await backend.store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert replay.result == b"operator"


async def test_reconcile_first_then_settle_is_refused(backend: Backend) -> None:
    fence = await in_doubt(backend)
    assert await verdict(backend.store, fence, b"provider") is not None
    assert not await backend.store.settle(KEY, result=b"operator", retention=RETENTION)
    assert not await backend.store.settle(KEY, result=None, retention=RETENTION)
    replay = await backend.store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert replay.result == b"provider"


async def test_only_an_unknown_record_of_the_same_call_takes_a_verdict(backend: Backend) -> None:
    store = backend.store
    assert await verdict(store, 1, b"nothing here") is None  # absent
    held = await store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert held.fence is not None
    assert await verdict(store, held.fence, None) is None  # running, lease live
    await backend.advance(LEASE + 1)
    lost = await store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert lost.fence is not None
    assert await verdict(store, lost.fence, None, fingerprint="fp-other") is None
    assert (await store.get(KEY)) is not None


async def test_a_verdict_sent_again_answers_as_the_first(backend: Backend) -> None:
    """Rule 12: a reconcile re-sent after its reply was lost finds its own effect."""
    fence = await in_doubt(backend)
    first = await verdict(backend.store, fence, b"charge ch_1")
    again = await verdict(backend.store, fence, b"charge ch_1")
    assert first is not None and again is not None
    assert (again.status, again.result, again.fence) == (ClaimStatus.REPLAY, b"charge ch_1", fence)


async def test_of_concurrent_resolvers_exactly_one_acts(backend: Backend) -> None:
    fence = await in_doubt(backend)
    won: list[ClaimOutcome] = []
    settled: list[bool] = []

    async def resolve(n: int) -> None:
        if n == 0:
            settled.append(await backend.store.settle(KEY, result=None, retention=RETENTION))
            return
        outcome = await verdict(backend.store, fence, None if n % 2 else b"r%d" % n)
        if outcome is not None:
            won.append(outcome)

    async with anyio.create_task_group() as tg:
        for n in range(12):
            tg.start_soon(resolve, n)
    assert len(won) + settled.count(True) == 1, (won, settled)


async def test_a_held_reconciliation_that_cannot_tell_leaves_it_unknown(backend: Backend) -> None:
    fence = await in_doubt(backend)
    taken = await verdict(backend.store, fence, None)
    assert taken is not None and taken.token is not None
    assert await reconciling(backend.store).leave_unknown(KEY, taken.token)
    record = await backend.store.get(KEY)
    assert record is not None
    assert (record.state, record.fence, record.token, record.expires_at) == (
        RecordState.UNKNOWN,
        fence + 1,
        None,
        None,
    )
    assert not await reconciling(backend.store).leave_unknown(KEY, taken.token)
    again = await verdict(backend.store, fence + 1, b"found it after all")
    assert again is not None and again.result == b"found it after all"


async def test_a_reconciler_paused_past_its_hold_changes_nothing(backend: Backend) -> None:
    fence = await in_doubt(backend)
    paused = await verdict(backend.store, fence, None)
    assert paused is not None and paused.token is not None
    await backend.advance(LEASE + 1)  # its hold ran out: the next claim finds it in doubt again
    lost = await backend.store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert lost.status is ClaimStatus.UNKNOWN and lost.fence == fence + 1
    other = await verdict(backend.store, fence + 1, None)
    assert other is not None and other.token is not None
    before = await backend.store.get(KEY)
    assert not await reconciling(backend.store).leave_unknown(KEY, paused.token)
    assert not await backend.store.complete(KEY, paused.token, b"stale", retention=RETENTION)
    assert await backend.store.get(KEY) == before
