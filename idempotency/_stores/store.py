"""The key store contract: one record per (scoped, hashed) key, and its transitions.

Every backend answers to this protocol with the same behaviour; the contract suite in
`tests/store/` runs each of them against it. The server layer speaks only to this protocol.
"""

from __future__ import annotations

import contextvars
import enum
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

#: The library's logger, the same one the guard logs to: stores tell the operator in the same
#: place without importing anything from the guard above them.
logger = logging.getLogger("idempotency")

#: Seconds since the epoch. Injectable so that tests move time instead of sleeping.
Clock = Callable[[], float]

#: Store keys are already hashed and scoped by the server layer; this only guards against misuse.
DEFAULT_MAX_KEY_BYTES = 1024
#: A stored result larger than this is refused rather than silently truncated.
DEFAULT_MAX_RESULT_BYTES = 1024 * 1024
#: Longest tool name a record keeps, in UTF-8 bytes (see `tool_label`). MCP asks for names of at
#: most 128 characters from [A-Za-z0-9_.-], so every conforming name is kept whole.
MAX_TOOL_BYTES = 255
#: How long a store remembers a record's last fence after the record itself expired (seconds):
#: a claim of its key within that time gets a higher fence (rule 25: a key's fence never
#: repeats). A day; what it costs per record is in docs/guarantee.md.
FENCE_MEMORY = 24 * 3600.0
#: The expiry stored in an IN_PROGRESS record (seconds since the epoch, year 2286), which has
#: none: the previous release refuses an IN_PROGRESS record without one, and reads this as a
#: deadline it never reaches. This release reads an IN_PROGRESS record's expiry as None.
NEVER_EXPIRES = 1e10


class RecordState(enum.StrEnum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    UNKNOWN = "unknown"
    #: Internal tombstone: a released claim keeps its fence and attempt count so that fence
    #: numbers stay monotonic per key. Reads and listings treat it as absent.
    RELEASED = "released"


class ClaimStatus(enum.StrEnum):
    CLAIMED = "claimed"
    REPLAY = "replay"
    BUSY = "busy"
    MISMATCH = "mismatch"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    """What a claim found. Only the fields that belong to `status` are set."""

    status: ClaimStatus
    #: CLAIMED: the secret every later transition must present (the compare-and-set token).
    token: str | None = None
    #: CLAIMED and REPLAY: strictly increasing per key, for fencing downstream systems.
    fence: int | None = None
    #: CLAIMED: True when an expired lease was taken over from a vanished worker.
    took_over: bool = False
    #: REPLAY: the stored result, byte for byte as completed.
    result: bytes | None = None
    #: REPLAY: when the result was stored (seconds since the epoch, store clock).
    completed_at: float | None = None
    #: CLAIMED and REPLAY: how many executions the record has seen, this one included.
    attempts: int = 0
    #: BUSY: seconds until the running attempt's lease ends (a hint, never negative).
    retry_after: float | None = None
    #: UNKNOWN: this claim found the lease run out and turned the record UNKNOWN (the first
    #: to learn it is in doubt); False when it was UNKNOWN already.
    turned_unknown: bool = False


@dataclass(frozen=True, slots=True)
class Record:
    """A record as an operator sees it (`get`, `list_records`)."""

    key: str
    state: RecordState
    fingerprint: str
    fence: int
    attempts: int
    token: str | None
    created_at: float
    updated_at: float
    lease_deadline: float | None
    completed_at: float | None
    #: When the store forgets the record; None for UNKNOWN and IN_PROGRESS, which are kept until
    #: completed, settled or reconciled (an IN_PROGRESS record whose lease ran out is in doubt
    #: as an UNKNOWN one is). A forgotten record's fence is remembered (`FENCE_MEMORY`).
    expires_at: float | None
    result: bytes | None
    #: The tool the record is for (see `tool_label`), so that an operator listing records sees
    #: more than hashes. None for a record written by a release that did not store it, or by a
    #: caller that gave none. A label for people: the store key, not this, decides identity.
    tool: str | None = None
    #: COMPLETED: the answer reached its caller, as far as the server could see (no give-up
    #: before it was written). Only keys the server derived read it (rule 15): an identical
    #: keyless call after a delivered answer is a deliberate repeat and runs; after an answer
    #: its caller gave up on (`KeyStore.abandon`) it is a re-send and replays. False for every
    #: record a release before this one wrote, so those keep being merged as they were.
    delivered: bool = False
    #: The record's history when it was read with the record (a Redis listing reads a format-3
    #: record's history in the same MGET: `history.servers_of` and `keys list` use it instead
    #: of reading it again); None: not read with it (ask the store: `AuditedStore.history`).
    history: str | None = field(default=None, compare=False, repr=False)


class StoreError(Exception):
    """Base of every key store failure."""


class StoreUnavailable(StoreError):
    """The store could not be reached or did not answer. Nothing is known to have changed;
    the server layer maps this to STORE_UNAVAILABLE and does not run the tool."""


class CorruptRecord(StoreError):
    """A record exists but cannot be read as ours (damaged, or written by something else).
    It is left untouched for an operator to inspect."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"the record for key {key!r} is corrupted or foreign: {why}")
        self.key = key
        self.why = why


class LimitExceeded(StoreError, ValueError):
    """A key or result is over the store's configured size limit. Nothing was written."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(f"the {what} is {size} bytes; this store accepts at most {limit}")
        self.what = what
        self.size = size
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Limits:
    max_key_bytes: int = DEFAULT_MAX_KEY_BYTES
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES

    def check_key(self, key: str) -> None:
        size = len(key.encode())
        if size == 0 or size > self.max_key_bytes:
            raise LimitExceeded("key", size, self.max_key_bytes)

    def check_result(self, result: bytes) -> None:
        if len(result) > self.max_result_bytes:
            raise LimitExceeded("result", len(result), self.max_result_bytes)


#: Where `list_records` reports the records it could not read, while someone collects them.
_passed_over: contextvars.ContextVar[list[CorruptRecord] | None] = contextvars.ContextVar(
    "mcp_once_unreadable_records", default=None
)


def pass_over(record: CorruptRecord) -> None:
    """`list_records` met a record it cannot read. It goes on with the others (one damaged
    record must not hide every other one), logs it, and reports it to `unreadable_records()`:
    an operator must be able to find it, not only read about it in a log."""
    logger.warning("list_records passes over an unreadable record: %s", record)
    found = _passed_over.get()
    if found is not None:
        found.append(record)


@contextmanager
def unreadable_records() -> Iterator[list[CorruptRecord]]:
    """Collect the records the listings made inside the block could not read.

    ```python
    with unreadable_records() as unreadable:
        records = await store.list_records()
    # `unreadable`: one CorruptRecord (its `key`, and `why`) per record passed over
    ```

    A side channel rather than a `list_records` parameter, so that the store protocol (and every
    store written against it) stays as it is; stores that never pass records over report none.
    """
    found: list[CorruptRecord] = []
    token = _passed_over.set(found)
    try:
        yield found
    finally:
        _passed_over.reset(token)


def tool_label(tool: str | None) -> str | None:
    """The tool name as every store keeps it: None for none (or empty), else the name cut to
    `MAX_TOOL_BYTES` at a character boundary, so that a longer (non-conforming) name costs a
    record a bounded number of bytes and reads back the same from every backend (a character
    UTF-8 cannot hold, a lone surrogate, becomes "?")."""
    if not tool:
        return None
    return tool.encode(errors="replace")[:MAX_TOOL_BYTES].decode(errors="ignore")


def check_list_limit(limit: int) -> None:
    """Every backend refuses a negative limit the same way, instead of slicing `[:-1]`."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be an int >= 0, not {limit!r}")


F = TypeVar("F", bound=Callable[..., Any])

#: The mark of a store method that never suspends (`never_suspends`).
NEVER_SUSPENDS = "__mcp_once_never_suspends__"


def never_suspends(method: F) -> F:
    """Mark a store coroutine method that completes without ever suspending (no await that
    yields to the event loop: `MemoryKeyStore`'s), so nothing can cancel it part-way and a caller
    need not shield it. An override in a subclass is not marked unless it says so itself."""
    setattr(method, NEVER_SUSPENDS, True)
    return method


def suspends(method: object) -> bool:
    """Whether `method` (a store's bound method) may suspend: unless marked `never_suspends`."""
    return getattr(method, NEVER_SUSPENDS, False) is not True


@runtime_checkable
class KeyStore(Protocol):
    """One record per key; every transition after `claim` is a compare-and-set on the token."""

    async def claim(
        self,
        key: str,
        fingerprint: str,
        *,
        lease: float,
        takeover: bool,
        tool: str | None = None,
        resend_only: bool = False,
    ) -> ClaimOutcome:
        """Claim `key` for one execution, or report why not (replay, busy, mismatch, unknown).

        `takeover` says what an expired IN_PROGRESS lease means: True takes it over (new token,
        higher fence); False turns the record UNKNOWN for good. `tool` names the tool in the
        record, for operators (`Record.tool`); a record that has none yet (an older release
        wrote it) takes it from the next claim that writes the record.

        `resend_only` (a key the server derived, rule 15): a COMPLETED record answers the claim
        only as a re-send. If its answer was `delivered`, the claim is a deliberate repeat and
        starts a new execution in its place (fence one higher, attempts counted from 1); if
        not, it replays, and the answer counts as delivered from then on (handed to this
        caller: should it give up too, the guard says so with `abandon`).
        """
        ...

    async def renew(self, key: str, token: str, *, lease: float) -> bool:
        """Extend the lease of an IN_PROGRESS record held by `token`."""
        ...

    async def complete(
        self, key: str, token: str, result: bytes, *, retention: float, delivered: bool = False
    ) -> bool:
        """Store `result` and keep it for `retention` seconds, if `token` still holds the claim.
        `delivered`: the caller is still there to receive it (see `Record.delivered`)."""
        ...

    async def abandon(self, key: str, fence: int) -> bool:
        """The caller of the answer stored under `fence` gave up before it was delivered (it
        cancelled, disconnected, or the answer could not be written): mark the COMPLETED record
        not delivered, so that the caller's re-send replays it (rule 15). Fenced: False, and
        nothing changed, when the record is not COMPLETED under that fence any more (a later
        execution replaced it, or it is gone)."""
        ...

    async def release(self, key: str, token: str) -> bool:
        """Give the claim up without a result, so the next claim runs again."""
        ...

    async def wait(self, key: str, *, timeout: float) -> Record | None:
        """Wait up to `timeout` seconds for the record to leave IN_PROGRESS; return it as found."""
        ...

    async def get(self, key: str) -> Record | None:
        """The live record for `key`, or None (absent, released or expired)."""
        ...

    async def list_records(
        self,
        *,
        state: RecordState | None = None,
        tool: str | None = None,
        limit: int = 100,
        created_before: float | None = None,
    ) -> list[Record]:
        """Live records, optionally only those of one state, of one tool (compared as
        `tool_label` keeps it; `""` picks the records that name no tool) and first claimed at
        or before `created_before` (seconds since the epoch), at most `limit` of them, oldest
        first (by `created_at`, then key).

        Which `limit` records, when more match: the oldest ones, unless the store's
        `oldest_first(state)` says False for that state. Such a listing (`RedisKeyStore`'s but
        for its in-doubt index: finding the oldest of a million would mean reading the million)
        answers with the first `limit` matches the store's scan meets, sorted oldest first among
        themselves; when fewer than `limit` match, it answered with all of them, as every store
        does. A listing should cost about what it returns, not what the store holds: SQLite
        reads an index in `created_at` order and stops at `limit`, Redis stops scanning. A
        store without `oldest_first` lists oldest first (every store before it did); a store
        written before `created_before` is only asked without it."""
        ...

    async def settle(
        self, key: str, *, result: bytes | None, retention: float, replacing: int | None = None
    ) -> bool:
        """Operator's verdict on an UNKNOWN record: completed with `result`, or failed (None),
        which releases it so the next claim runs again.

        `replacing`: an operator's earlier settle is being corrected. The record may then also
        be COMPLETED under exactly that fence: its result was put there by a settle, as the
        caller read in its history (a settled event at that fence; an executed record's fence
        never had one, and any later execution has a higher fence, so fencing on it is enough).
        The new settled event says that it replaces the earlier one."""
        ...

    async def purge_expired(self) -> int:
        """Physically remove records past their expiry; returns how many went."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class ReconcilingStore(KeyStore, Protocol):
    """A key store that takes the system of record's verdict on an UNKNOWN record (rule 19):
    every store of this release. A protocol of its own rather than a `KeyStore` method, so that
    a `KeyStore` written before it keeps working wherever no `reconcile=` is configured."""

    async def reconcile(
        self, key: str, fingerprint: str, fence: int, *, lease: float
    ) -> ClaimOutcome | None:
        """Claim the UNKNOWN record of `key` for its reconciliation, if it is still UNKNOWN under
        `fence` (and `fingerprint`): IN_PROGRESS under a new token with the fence one higher,
        held for `lease` seconds, answered as CLAIMED (`took_over`). None, and nothing changed,
        when the record is anything else: another resolver (a replica, an operator's `settle`)
        acted first. Safe to re-send.

        The reconciler is asked while the claim is held, so that concurrent retries wait for
        its one answer instead of each asking; the verdict then lands with `complete` (it
        happened), by running the tool under the claim (it did not; `release` where nothing
        runs it), or with `leave_unknown` (nobody can tell)."""
        ...

    async def leave_unknown(self, key: str, token: str) -> bool:
        """Turn the record `token` holds (claimed by `reconcile`) UNKNOWN again: the system of
        record could not tell. False, and nothing changed, if `token` no longer holds it."""
        ...
