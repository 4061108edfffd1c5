"""Rule 18's intents, read off every store's transitions (`backend` fixture: memory, SQLite, Redis,
Cluster, Sentinel; trio too): `Claim.downstream_key` (and `InDoubt.downstream_key`) stays the same
through every transition that may be the same effect, and changes only for a new intent.

The intent is `fence - attempts + 1` of the claim's outcome. One record walked through them all:
a takeover, a release and a new claim, an UNKNOWN record settled `--failed` and claimed again, an
UNKNOWN record reconciled ("not happened": run under it), all within one intent; a give-up's
re-send is a replay (no execution at all); a deliberate repeat after a delivered answer (rule 15)
starts the next intent, within which the same transitions keep its key again.
"""

from __future__ import annotations

import hashlib

import pytest
from store_backends import Backend

from idempotency import Claim, ClaimOutcome, ClaimStatus, InDoubt, KeyStore
from idempotency._stores.store import ReconcilingStore

pytestmark = pytest.mark.anyio

#: A store key as the guard makes them (SHA-256 hex).
KEY = hashlib.sha256(b"scope/charge/derived-key").hexdigest()
FP = "fp-a"
LEASE = 10.0
RETENTION = 3600.0


def claim_of(outcome: ClaimOutcome) -> Claim:
    """The `current_claim()` a tool would see for this claim."""
    assert outcome.status is ClaimStatus.CLAIMED, outcome
    assert outcome.fence is not None
    return Claim("derived-k", outcome.fence, outcome.attempts, KEY, "charge")


def doubt_of(outcome: ClaimOutcome) -> InDoubt:
    """What a reconciler is asked about the UNKNOWN record `outcome` found."""
    assert outcome.status is ClaimStatus.UNKNOWN and outcome.fence is not None, outcome
    return InDoubt("charge", None, KEY, outcome.fence, outcome.attempts, None, 0.0, None)


async def claim(store: KeyStore) -> ClaimOutcome:
    """A keyless call's claim (a derived key: `resend_only`), taking over expired leases."""
    return await store.claim(KEY, FP, lease=LEASE, takeover=True, resend_only=True)


async def lost(backend: Backend) -> ClaimOutcome:
    """The record's holder vanished: its lease runs out and a claim that may not take it over
    turns it UNKNOWN (what the reconciler and the operator then see)."""
    await backend.advance(LEASE + 1)
    found = await backend.store.claim(KEY, FP, lease=LEASE, takeover=False, resend_only=True)
    assert found.status is ClaimStatus.UNKNOWN
    return found


async def every_transition_of_one_intent(backend: Backend, first: ClaimOutcome) -> list[Claim]:
    """From `first` (an intent's first execution, held), every transition that may be the same
    effect: the claims they lead to, in order."""
    store = backend.store
    claims = [claim_of(first)]
    # A takeover of a lease that ran out (the worker died mid-call).
    await backend.advance(LEASE + 1)
    taken = await claim(store)
    assert taken.took_over
    claims.append(claim_of(taken))
    # A release (an effect-free error) and the re-send's new claim.
    assert taken.token is not None and await store.release(KEY, taken.token)
    claims.append(claim_of(again := await claim(store)))
    # UNKNOWN, settled --failed by an operator, and the retry's new claim.
    assert again.token is not None
    unknown = await lost(backend)
    assert doubt_of(unknown).downstream_key == claims[-1].downstream_key
    assert await store.settle(KEY, result=None, retention=RETENTION)
    claims.append(claim_of(retried := await claim(store)))
    # UNKNOWN again, reconciled: "not happened" runs the tool under the reconciliation's claim.
    assert retried.token is not None
    unknown = await lost(backend)
    doubt = doubt_of(unknown)
    assert doubt.downstream_key == claims[-1].downstream_key
    assert isinstance(store, ReconcilingStore)
    held = await store.reconcile(KEY, FP, doubt.fence, lease=LEASE)
    assert held is not None
    claims.append(claim_of(held))
    return claims


async def test_one_intent_keeps_its_key_and_a_repeat_after_delivery_gets_a_new_one(
    backend: Backend,
) -> None:
    store = backend.store
    first = await every_transition_of_one_intent(backend, await claim(store))
    assert [c.intent for c in first] == [1] * 5
    assert {c.downstream_key for c in first} == {KEY}  # intent 1: the record, as ever
    assert [c.fence for c in first] == [1, 2, 3, 4, 5]
    last = await store.get(KEY)
    assert last is not None and last.token is not None
    # Its answer is lost on the way (the caller gave up): the re-send replays, nothing runs.
    assert await store.complete(KEY, last.token, b"charged", retention=RETENTION, delivered=False)
    resent = await claim(store)
    assert resent.status is ClaimStatus.REPLAY
    # Now delivered (to the re-send): the same call once more is a new intent.
    repeat = await claim(store)
    second = await every_transition_of_one_intent(backend, repeat)
    assert [c.fence for c in second] == [6, 7, 8, 9, 10]
    assert [c.intent for c in second] == [6] * 5
    assert {c.downstream_key for c in second} == {f"{KEY}/6"}
    # And once more after that intent's answer was delivered: intent 11.
    done = await store.get(KEY)
    assert done is not None and done.token is not None
    assert await store.complete(KEY, done.token, b"charged", retention=RETENTION, delivered=True)
    third = claim_of(await claim(store))
    assert (third.fence, third.attempt, third.downstream_key) == (11, 1, f"{KEY}/11")


async def test_a_record_claimed_again_after_it_expired_is_a_new_intent(backend: Backend) -> None:
    """A call 24 h later under the same client key: the record expired, the claim is a new call,
    and the system downstream (keeping its records longer) must not answer it from the old one."""
    store = backend.store
    first = await store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert first.token is not None
    assert await store.complete(KEY, first.token, b"charged", retention=RETENTION)
    await backend.advance(RETENTION + 1)
    later = await store.claim(KEY, FP, lease=LEASE, takeover=False)
    assert claim_of(later).downstream_key != claim_of(first).downstream_key
