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


async def take(store: KeyStore, fence: int, fingerprint: str = FP) -> ClaimOutcome | None:
    """Claim the in-doubt record for its reconciliation, under the fence it was found with."""
    return await reconciling(store).reconcile(KEY, fingerprint, fence, lease=LEASE)


def token_of(outcome: ClaimOutcome | None) -> str:
    assert outcome is not None and outcome.token is not None
    return outcome.token


async def test_happened_completes_the_record_under_the_reconciliation(backend: Backend) -> None:
    fence = await in_doubt(backend)
    taken = await take(backend.store, fence)
    assert taken is not None and taken.status is ClaimStatus.CLAIMED and taken.took_over
    assert (taken.fence, taken.attempts) == (fence + 1, 2)
    busy = await backend.store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert busy.status is ClaimStatus.BUSY  # held: a retry waits for the one answer
    assert await backend.store.complete(KEY, token_of(taken), b"ch_1", retention=RETENTION)
    replay = await backend.store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert replay.status is ClaimStatus.REPLAY and replay.result == b"ch_1"


async def test_not_happened_runs_under_it_and_nothing_can_run_it_twice(backend: Backend) -> None:
    fence = await in_doubt(backend)
    taken = await take(backend.store, fence)
    assert await take(backend.store, fence) is None  # a second resolver: lost, nothing changed
    assert await backend.store.renew(KEY, token_of(taken), lease=LEASE)
    assert await backend.store.complete(KEY, token_of(taken), b"ran once", retention=RETENTION)
    record = await backend.store.get(KEY)
    assert record is not None and (record.state, record.fence) == (RecordState.COMPLETED, 2)


async def test_a_stale_reconciliation_changes_nothing(backend: Backend) -> None:
    fence = await in_doubt(backend)
    taken = await take(backend.store, fence)
    await backend.advance(LEASE + 1)  # its hold ran out: UNKNOWN again at the next claim
    again = await backend.store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert again.status is ClaimStatus.UNKNOWN and again.fence == fence + 1
    before = await backend.store.get(KEY)
    assert await take(backend.store, fence) is None  # the fence it read is gone
    assert not await backend.store.complete(KEY, token_of(taken), b"late", retention=RETENTION)
    assert not await reconciling(backend.store).leave_unknown(KEY, token_of(taken))
    assert await backend.store.get(KEY) == before


async def test_settle_and_reconcile_never_both_win(backend: Backend) -> None:
    fence = await in_doubt(backend)
    assert await backend.store.settle(KEY, result=b"operator", retention=RETENTION)
    assert await take(backend.store, fence) is None
    replay = await backend.store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert replay.result == b"operator"


async def test_reconcile_first_then_settle_is_refused(backend: Backend) -> None:
    fence = await in_doubt(backend)
    taken = await take(backend.store, fence)
    assert not await backend.store.settle(KEY, result=b"operator", retention=RETENTION)
    assert not await backend.store.settle(KEY, result=None, retention=RETENTION)
    assert await backend.store.complete(KEY, token_of(taken), b"provider", retention=RETENTION)
    replay = await backend.store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert replay.result == b"provider"


async def test_only_an_unknown_record_of_the_same_call_is_taken(backend: Backend) -> None:
    store = backend.store
    assert await take(store, 1) is None  # absent
    held = await store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert held.fence is not None
    assert await take(store, held.fence) is None  # running, lease live
    await backend.advance(LEASE + 1)
    lost = await store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert lost.fence is not None
    assert await take(store, lost.fence, fingerprint="fp-other") is None
    record = await store.get(KEY)
    assert record is not None and record.state is RecordState.UNKNOWN


async def test_of_concurrent_resolvers_exactly_one_acts(backend: Backend) -> None:
    fence = await in_doubt(backend)
    won: list[ClaimOutcome] = []
    settled: list[bool] = []

    async def resolve(n: int) -> None:
        if n == 0:
            settled.append(await backend.store.settle(KEY, result=None, retention=RETENTION))
            return
        outcome = await take(backend.store, fence)
        if outcome is not None:
            won.append(outcome)

    async with anyio.create_task_group() as tg:
        for n in range(12):
            tg.start_soon(resolve, n)
    assert len(won) + settled.count(True) == 1, (won, settled)


async def test_a_held_reconciliation_that_cannot_tell_leaves_it_unknown(backend: Backend) -> None:
    fence = await in_doubt(backend)
    taken = await take(backend.store, fence)
    assert await reconciling(backend.store).leave_unknown(KEY, token_of(taken))
    record = await backend.store.get(KEY)
    assert record is not None
    assert (record.state, record.fence, record.token, record.expires_at) == (
        RecordState.UNKNOWN,
        fence + 1,
        None,
        None,
    )
    assert not await reconciling(backend.store).leave_unknown(KEY, token_of(taken))
    again = await take(backend.store, fence + 1)  # the next retry may ask again
    assert again is not None and again.fence == fence + 2
