"""The record's state machine as pure functions, shared by the in-process backends.

`MemoryKeyStore` and `SQLiteKeyStore` read a record, apply one of these under their own lock or
transaction, and write the answer back; Redis runs the same rules as Lua scripts. Keeping the rules
pure is what lets one reference model in the tests check every backend.
"""

from __future__ import annotations

import enum

from .store import FENCE_MEMORY, ClaimOutcome, ClaimStatus, Record, RecordState, tool_label


class _Keep(enum.Enum):
    """`_successor`'s default: the field keeps the record's value."""

    KEEP = 0


_KEEP = _Keep.KEEP


def _successor(
    record: Record,
    now: float,
    *,
    expires_at: float | None,
    state: RecordState | None = None,
    token: str | _Keep | None = _KEEP,
    lease_deadline: float | _Keep | None = _KEEP,
    completed_at: float | _Keep | None = _KEEP,
    result: bytes | _Keep | None = _KEEP,
    tool: str | None = None,
    retake: bool = False,
    delivered: bool | _Keep = _KEEP,
) -> Record:
    """`record` changed at `now`: the fields given replace its own (`tool` only fills a record
    that has none; `retake` counts one more fence and attempt).

    Not `dataclasses.replace`, which looks the fields up and checks them on every call: a third
    of a transition's rule on the SQLite store's writer thread, paid by every batch member."""
    return Record(
        record.key,
        record.state if state is None else state,
        record.fingerprint,
        record.fence + 1 if retake else record.fence,
        record.attempts + 1 if retake else record.attempts,
        record.token if token is _KEEP else token,
        record.created_at,
        now,
        record.lease_deadline if lease_deadline is _KEEP else lease_deadline,
        record.completed_at if completed_at is _KEEP else completed_at,
        expires_at,
        record.result if result is _KEEP else result,
        record.tool if tool is None else record.tool or tool,
        record.delivered if delivered is _KEEP else delivered,
    )


def live(record: Record | None, now: float) -> Record | None:
    """The record as a reader should see it: expired ones are gone, tombstones are kept.
    IN_PROGRESS and UNKNOWN records carry no expiry (rule 25: in doubt, never forgotten)."""
    if record is None:
        return None
    if record.expires_at is not None and record.expires_at <= now:
        return None
    return record


def forgotten(key: str, fence: int, expired_at: float) -> Record:
    """What a store keeps of a record it purged: its last fence and when it expired, as an
    expired tombstone, so that the rules number the next execution of its key above it while
    the fence is `remembered` (`memory.py`, `sqlite.py`'s `fences` table; Redis keeps a `:f`
    key beside the record)."""
    return Record(
        key, RecordState.RELEASED, "", fence, 1, None, 0.0, 0.0, None, None, expired_at, None
    )


def remembered(record: Record | None, now: float) -> Record | None:
    """An expired record (still stored, or `forgotten`) while its fence is remembered:
    `FENCE_MEMORY` past its expiry. A claim of its key then starts a new intent (attempts
    from 1) whose fence is above the record's last: a key's fence never repeats (rule 25)."""
    if record is None or record.expires_at is None or record.expires_at + FENCE_MEMORY <= now:
        return None
    return record


def visible(record: Record | None, now: float) -> Record | None:
    """The record as an operator sees it: no expired records and no tombstones."""
    record = live(record, now)
    if record is None or record.state is RecordState.RELEASED:
        return None
    return record


def listed(
    record: Record,
    state: RecordState | None,
    tool: str | None,
    created_before: float | None = None,
) -> bool:
    """Whether a visible record passes a listing's filters (`KeyStore.list_records`)."""
    if state is not None and record.state is not state:
        return False
    if created_before is not None and record.created_at > created_before:
        return False
    return tool is None or record.tool == tool_label(tool)


def claim(
    record: Record | None,
    key: str,
    fingerprint: str,
    *,
    now: float,
    lease: float,
    takeover: bool,
    token: str,
    tool: str | None = None,
    resend_only: bool = False,
) -> tuple[Record | None, ClaimOutcome]:
    """Decide a claim. Returns the record to write (None: leave it as it is) and the outcome.

    `tool` (already a `tool_label`) goes into a new record, and into a record this claim writes
    that has none (an older release wrote it); a tool name already stored stays. `resend_only`:
    see `KeyStore.claim` (a delivered answer is replaced by a new execution, one not delivered
    is replayed and counts as delivered from then on).

    A claim of a key whose record expired (`record` is the expired record, or what the store
    remembers of it: `forgotten`) starts a new intent: its fence one above the record's last
    while that is `remembered`, its attempts counted from 1. An IN_PROGRESS record has no
    expiry: it stays, its lease deadline saying when its holder is presumed gone (rule 25)."""
    stored = record
    record = live(record, now)
    repeat = (
        resend_only
        and record is not None
        and record.state is RecordState.COMPLETED
        and record.delivered
        and record.fingerprint == fingerprint
    )
    if record is None or record.state is RecordState.RELEASED or repeat:
        # The fence goes on from the record's last, also from one expired (rule 25).
        last = record or remembered(stored, now)
        fence = (last.fence if last else 0) + 1
        # A deliberate repeat, or a key whose record expired, is a call of its own: its
        # executions are counted afresh. A released claim's retry goes on counting.
        attempts = 1 if repeat or record is None else record.attempts + 1
        fresh = Record(
            key=key,
            state=RecordState.IN_PROGRESS,
            fingerprint=fingerprint,
            fence=fence,
            attempts=attempts,
            token=token,
            created_at=now,
            updated_at=now,
            lease_deadline=now + lease,
            completed_at=None,
            expires_at=None,
            result=None,
            tool=tool,
        )
        return fresh, ClaimOutcome(ClaimStatus.CLAIMED, token=token, fence=fence, attempts=attempts)
    if record.fingerprint != fingerprint:
        return None, ClaimOutcome(ClaimStatus.MISMATCH)
    if record.state is RecordState.COMPLETED:
        replay = ClaimOutcome(
            ClaimStatus.REPLAY,
            fence=record.fence,
            result=record.result,
            completed_at=record.completed_at,
            attempts=record.attempts,
        )
        if resend_only:  # handed to this re-send: delivered from now on
            return _successor(record, now, expires_at=record.expires_at, delivered=True), replay
        return None, replay
    if record.state is RecordState.UNKNOWN:
        return None, ClaimOutcome(ClaimStatus.UNKNOWN, fence=record.fence, attempts=record.attempts)
    assert record.lease_deadline is not None
    if now < record.lease_deadline:
        return None, ClaimOutcome(
            ClaimStatus.BUSY, fence=record.fence, retry_after=record.lease_deadline - now
        )
    if takeover:
        taken = _successor(
            record,
            now,
            token=token,
            retake=True,
            lease_deadline=now + lease,
            expires_at=None,
            tool=tool,
        )
        return taken, ClaimOutcome(
            ClaimStatus.CLAIMED,
            token=token,
            fence=taken.fence,
            attempts=taken.attempts,
            took_over=True,
        )
    lost = _successor(
        record, now, state=RecordState.UNKNOWN, token=None, expires_at=None, tool=tool
    )
    return lost, ClaimOutcome(
        ClaimStatus.UNKNOWN, fence=record.fence, attempts=record.attempts, turned_unknown=True
    )


def _held(record: Record | None, token: str, now: float) -> Record | None:
    record = live(record, now)
    if record is None or record.state is not RecordState.IN_PROGRESS or record.token != token:
        return None
    return record


def renew(record: Record | None, token: str, *, now: float, lease: float) -> Record | None:
    """The renewed record, or None when `token` no longer holds the claim."""
    held = _held(record, token, now)
    if held is None:
        return None
    return _successor(held, now, lease_deadline=now + lease, expires_at=None)


def complete(
    record: Record | None,
    token: str,
    result: bytes,
    *,
    now: float,
    retention: float,
    delivered: bool = False,
) -> Record | None:
    held = _held(record, token, now)
    if held is None:
        return None
    return _successor(
        held,
        now,
        state=RecordState.COMPLETED,
        token=None,
        result=result,
        lease_deadline=None,
        completed_at=now,
        expires_at=now + retention,
        delivered=delivered,
    )


def abandon(record: Record | None, fence: int, *, now: float) -> Record | None:
    """The record with its answer marked not delivered (`KeyStore.abandon`); None when it is
    not COMPLETED under `fence` (replaced by a later execution, or gone)."""
    record = live(record, now)
    if record is None or record.state is not RecordState.COMPLETED or record.fence != fence:
        return None
    if not record.delivered:
        return record  # already so: nothing to change, and the caller is told it holds
    return _successor(record, now, expires_at=record.expires_at, delivered=False)


def release(record: Record | None, token: str, *, now: float, retention: float) -> Record | None:
    held = _held(record, token, now)
    if held is None:
        return None
    return tombstone(held, now=now, retention=retention)


def tombstone(record: Record, *, now: float, retention: float) -> Record:
    return _successor(
        record,
        now,
        state=RecordState.RELEASED,
        token=None,
        result=None,
        lease_deadline=None,
        expires_at=now + retention,
    )


def settle(
    record: Record | None,
    result: bytes | None,
    *,
    now: float,
    retention: float,
    replacing: int | None = None,
) -> Record | None:
    """An operator's verdict on an UNKNOWN record; None when the record is not UNKNOWN.
    `replacing`: also on the record COMPLETED under that fence (`KeyStore.settle`)."""
    record = live(record, now)
    if record is None:
        return None
    again = record.state is RecordState.COMPLETED and record.fence == replacing
    if record.state is not RecordState.UNKNOWN and not again:
        return None
    if result is None:
        return tombstone(record, now=now, retention=retention)
    return _successor(
        record,
        now,
        state=RecordState.COMPLETED,
        result=result,
        lease_deadline=None,
        completed_at=now,
        expires_at=now + retention,
        delivered=False,  # its caller never had an answer: a re-send of it gets this one
    )


def reconcile(
    record: Record | None,
    fingerprint: str,
    fence: int,
    *,
    now: float,
    token: str,
    lease: float,
) -> tuple[Record | None, ClaimOutcome | None]:
    """An UNKNOWN record claimed for its reconciliation (rule 19, `ReconcilingStore.reconcile`):
    IN_PROGRESS under `token`, the fence one higher, held for `lease` seconds.

    Fenced on the UNKNOWN record's `fence` and `fingerprint`: any other record (reconciled or
    settled meanwhile, another fence) is left alone, `(None, None)`. The claim sent again after a
    lost reply finds its own token and answers as the first did.
    """
    record = live(record, now)
    if record is None or record.fingerprint != fingerprint:
        return None, None
    if record.state is RecordState.IN_PROGRESS and record.token == token:
        return None, _taken_by(record, token)
    if record.state is not RecordState.UNKNOWN or record.fence != fence:
        return None, None
    taken = _successor(
        record,
        now,
        state=RecordState.IN_PROGRESS,
        token=token,
        retake=True,
        lease_deadline=now + lease,
        expires_at=None,
    )
    return taken, _taken_by(taken, token)


def leave_unknown(record: Record | None, token: str, *, now: float) -> Record | None:
    """A reconciler that held the record could not tell (`ReconcilingStore.leave_unknown`): it
    is UNKNOWN again, kept until resolved. None when `token` no longer holds it."""
    held = _held(record, token, now)
    if held is None:
        return None
    return _successor(held, now, state=RecordState.UNKNOWN, token=None, expires_at=None)


def _taken_by(record: Record, token: str) -> ClaimOutcome:
    return ClaimOutcome(
        ClaimStatus.CLAIMED,
        token=token,
        fence=record.fence,
        attempts=record.attempts,
        took_over=True,
    )
