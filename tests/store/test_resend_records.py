"""Rule 15 in the store: a derived key's COMPLETED record answers a re-send, never a repeat.

Run against every backend (`backend` fixture). A record remembers whether its answer reached
its caller (`Record.delivered`, written with the completion); a claim made `resend_only` (a key
the server derived) replays an answer that was not delivered and hands it over, and replaces a
delivered one with a new execution; `abandon` marks a completed answer not delivered, fenced on
the record's fence so that it never touches a later execution's record.
"""

from __future__ import annotations

import pytest
from store_backends import Backend

from idempotency import ClaimOutcome, ClaimStatus, KeyStore, RecordState

pytestmark = pytest.mark.anyio

KEY = "scope/tool/derived-1"
FP = "fp-a"
LEASE = 10.0
RETENTION = 600.0


async def completed(store: KeyStore, *, delivered: bool, resend_only: bool = True) -> ClaimOutcome:
    """A derived call claimed and completed with result b"first"."""
    outcome = await store.claim(KEY, FP, lease=LEASE, takeover=False, resend_only=resend_only)
    assert outcome.status is ClaimStatus.CLAIMED, outcome
    assert outcome.token is not None
    stored = await store.complete(
        KEY, outcome.token, b"first", retention=RETENTION, delivered=delivered
    )
    assert stored
    return outcome


async def test_a_delivered_answer_is_replaced_by_a_new_execution(backend: Backend) -> None:
    store = backend.store
    first = await completed(store, delivered=True)
    record = await store.get(KEY)
    assert record is not None and record.delivered and record.state is RecordState.COMPLETED
    assert record.lease_deadline is None

    again = await store.claim(KEY, FP, lease=LEASE, takeover=False, resend_only=True)
    assert again.status is ClaimStatus.CLAIMED, again
    assert again.fence == (first.fence or 0) + 1
    assert again.attempts == 1  # a call of its own, counted afresh
    record = await store.get(KEY)
    assert record is not None
    assert (record.state, record.token, record.result) == (
        RecordState.IN_PROGRESS,
        again.token,
        None,
    )
    assert again.token is not None
    assert await store.complete(KEY, again.token, b"second", retention=RETENTION, delivered=True)
    record = await store.get(KEY)
    assert record is not None and record.result == b"second" and record.fence == again.fence


async def test_an_answer_its_caller_gave_up_on_is_replayed_once_then_counts_as_delivered(
    backend: Backend,
) -> None:
    store = backend.store
    first = await completed(store, delivered=False)
    resend = await store.claim(KEY, FP, lease=LEASE, takeover=False, resend_only=True)
    assert resend.status is ClaimStatus.REPLAY, resend
    assert (resend.result, resend.fence) == (b"first", first.fence)
    record = await store.get(KEY)
    assert record is not None and record.delivered  # handed to the re-send
    # Delivered now: the next identical call is a repeat and runs.
    repeat = await store.claim(KEY, FP, lease=LEASE, takeover=False, resend_only=True)
    assert repeat.status is ClaimStatus.CLAIMED, repeat


async def test_abandon_after_completion_makes_the_answer_a_re_sends_again(
    backend: Backend,
) -> None:
    store = backend.store
    first = await completed(store, delivered=True)
    assert first.fence is not None
    assert await store.abandon(KEY, first.fence)
    assert await store.abandon(KEY, first.fence)  # sent twice: the same effect, still true
    record = await store.get(KEY)
    assert record is not None and not record.delivered and record.result == b"first"
    resend = await store.claim(KEY, FP, lease=LEASE, takeover=False, resend_only=True)
    assert resend.status is ClaimStatus.REPLAY and resend.result == b"first"


async def test_abandon_is_fenced_on_the_execution_it_names(backend: Backend) -> None:
    store = backend.store
    first = await completed(store, delivered=True)
    assert first.fence is not None
    repeat = await store.claim(KEY, FP, lease=LEASE, takeover=False, resend_only=True)
    assert repeat.status is ClaimStatus.CLAIMED and repeat.token is not None
    # The first call's late give-up cannot touch the repeat's record: in progress, or completed.
    assert not await store.abandon(KEY, first.fence)
    assert await store.complete(KEY, repeat.token, b"second", retention=RETENTION, delivered=True)
    assert not await store.abandon(KEY, first.fence)
    record = await store.get(KEY)
    assert record is not None and record.delivered and record.result == b"second"
    assert not await store.abandon("scope/tool/never-claimed", 1)


async def test_a_key_the_client_sent_replays_whatever_the_delivery(backend: Backend) -> None:
    store = backend.store
    await completed(store, delivered=True, resend_only=False)
    again = await store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert again.status is ClaimStatus.REPLAY and again.result == b"first"
    record = await store.get(KEY)
    assert record is not None and record.delivered  # unchanged by a plain replay


async def test_a_settled_answer_is_one_a_re_send_gets(backend: Backend) -> None:
    store = backend.store
    outcome = await store.claim(KEY, FP, lease=1.0, takeover=False, resend_only=True)
    assert outcome.status is ClaimStatus.CLAIMED
    await backend.advance(2.0)
    lost = await store.claim(KEY, FP, lease=LEASE, takeover=False, resend_only=True)
    assert lost.status is ClaimStatus.UNKNOWN
    assert await store.settle(KEY, result=b"settled", retention=RETENTION)
    record = await store.get(KEY)
    assert record is not None and not record.delivered and record.lease_deadline is None
    resend = await store.claim(KEY, FP, lease=LEASE, takeover=False, resend_only=True)
    assert resend.status is ClaimStatus.REPLAY and resend.result == b"settled"
