"""`MemoryKeyStore`: one process, no durability. For tests, the demo and single-process servers
that accept losing their records on restart."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import AsyncIterator

import anyio

from . import audit_key as audit_keys
from . import history as chain
from . import transitions as rules
from .audit_key import AuditKey
from .history import AuditEntry, Trail
from .mark import STORE_FORMAT, StoreMark
from .store import (
    DEFAULT_MAX_KEY_BYTES,
    DEFAULT_MAX_RESULT_BYTES,
    FENCE_MEMORY,
    ClaimOutcome,
    Clock,
    Limits,
    Record,
    RecordState,
    check_list_limit,
    never_suspends,
    tool_label,
)

#: How long a released claim's tombstone is kept (`orphan_retention`): a retry of the call within
#: it goes on counting its attempts (the same intent); after it, the record's fence is still
#: remembered (`FENCE_MEMORY`). IN_PROGRESS and UNKNOWN records never expire (rule 25), so
#: despite its name it applies to no orphaned claim.
DEFAULT_ORPHAN_RETENTION = 24 * 3600.0


class MemoryKeyStore:
    """Records in a dict; waiters woken by an event per key. Safe across tasks, not processes."""

    def __init__(
        self,
        *,
        clock: Clock = time.time,
        max_key_bytes: int = DEFAULT_MAX_KEY_BYTES,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        orphan_retention: float = DEFAULT_ORPHAN_RETENTION,
        history: bool = True,
        audit_key: str | bytes | AuditKey | None = None,
        audit_key_file: str | os.PathLike[str] | None = None,
    ) -> None:
        """`history`: keep each record's history and the audit stream (rule 20; on by
        default, off only to measure what it costs). `audit_key` (or `audit_key_file`, else
        `$MCP_ONCE_AUDIT_KEY` or `$MCP_ONCE_AUDIT_KEY_FILE`): MAC and seal the histories
        (`audit_key.py`)."""
        self._clock = clock
        self._limits = Limits(max_key_bytes, max_result_bytes)
        self._orphan_retention = orphan_retention
        self._records: dict[str, Record] = {}
        #: The last fence of each record purged, and when it expired (rule 25).
        self._fences: dict[str, tuple[int, float]] = {}
        self._changed: dict[str, anyio.Event] = {}
        #: The key this store MACs and seals histories with; None: plain digests.
        self.audit_key = audit_keys.resolve(audit_key, audit_key_file)
        self._trail = Trail(audit_key=self.audit_key) if history else None
        self._mark: StoreMark | None = None

    def _note(self, key: str, new: Record | None, answer: object) -> None:
        """The transition's events, in the same step as its write (nothing runs in between)."""
        if self._trail is not None:
            self._trail.note(key, self._records.get(key), new, answer, self._clock())

    def _write(self, key: str, record: Record) -> None:
        self._records[key] = record
        event = self._changed.pop(key, None)
        if event is not None:
            event.set()

    @never_suspends
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
        self._limits.check_key(key)
        now = self._clock()
        if self._mark is None:
            self._mark = StoreMark(STORE_FORMAT, now)
        new, outcome = rules.claim(
            self._records.get(key) or self._forgotten(key),
            key,
            fingerprint,
            now=now,
            lease=lease,
            takeover=takeover,
            token=secrets.token_hex(16),
            tool=tool_label(tool),
            resend_only=resend_only,
        )
        self._note(key, new, outcome)
        if new is not None:
            self._write(key, new)
        return outcome

    def _forgotten(self, key: str) -> Record | None:
        """What is kept of the purged record of `key` (`transitions.forgotten`), if anything."""
        memo = self._fences.get(key)
        return None if memo is None else rules.forgotten(key, *memo)

    async def renew(self, key: str, token: str, *, lease: float) -> bool:
        new = rules.renew(self._records.get(key), token, now=self._clock(), lease=lease)
        if new is None:
            return False
        self._records[key] = new
        return True

    async def complete(
        self, key: str, token: str, result: bytes, *, retention: float, delivered: bool = False
    ) -> bool:
        self._limits.check_result(result)
        new = rules.complete(
            self._records.get(key),
            token,
            result,
            now=self._clock(),
            retention=retention,
            delivered=delivered,
        )
        if new is None:
            return False
        self._note(key, new, True)
        self._write(key, new)
        return True

    async def abandon(self, key: str, fence: int) -> bool:
        new = rules.abandon(self._records.get(key), fence, now=self._clock())
        if new is None:
            return False
        self._records[key] = new
        return True

    async def release(self, key: str, token: str) -> bool:
        new = rules.release(
            self._records.get(key), token, now=self._clock(), retention=self._orphan_retention
        )
        if new is None:
            return False
        self._note(key, new, True)
        self._write(key, new)
        return True

    async def wait(self, key: str, *, timeout: float) -> Record | None:
        with anyio.move_on_after(timeout):
            while True:
                record = rules.visible(self._records.get(key), self._clock())
                if record is None or record.state is not RecordState.IN_PROGRESS:
                    return record
                event = self._changed.setdefault(key, anyio.Event())
                await event.wait()
        return rules.visible(self._records.get(key), self._clock())

    async def get(self, key: str) -> Record | None:
        return rules.visible(self._records.get(key), self._clock())

    async def list_records(
        self,
        *,
        state: RecordState | None = None,
        tool: str | None = None,
        limit: int = 100,
        created_before: float | None = None,
    ) -> list[Record]:
        check_list_limit(limit)
        now = self._clock()
        found = []
        for stored in self._records.values():
            record = rules.visible(stored, now)
            if record is not None and rules.listed(record, state, tool, created_before):
                found.append(record)
        found.sort(key=lambda r: (r.created_at, r.key))
        return found[:limit]

    async def settle(
        self, key: str, *, result: bytes | None, retention: float, replacing: int | None = None
    ) -> bool:
        if result is not None:
            self._limits.check_result(result)
        record = self._records.get(key)
        now = self._clock()
        new = rules.settle(record, result, now=now, retention=retention, replacing=replacing)
        if new is None:
            return False
        with chain.replacing_settle(replacing):
            self._note(key, new, True)
        self._write(key, new)
        return True

    @never_suspends
    async def reconcile(
        self, key: str, fingerprint: str, fence: int, *, lease: float
    ) -> ClaimOutcome | None:
        new, outcome = rules.reconcile(
            self._records.get(key),
            fingerprint,
            fence,
            now=self._clock(),
            token=secrets.token_hex(16),
            lease=lease,
        )
        if new is not None:
            self._note(key, new, outcome)
            self._write(key, new)
        return outcome

    async def leave_unknown(self, key: str, token: str) -> bool:
        new = rules.leave_unknown(self._records.get(key), token, now=self._clock())
        if new is None:
            return False
        self._note(key, new, True)
        self._write(key, new)
        return True

    async def purge_expired(self) -> int:
        now = self._clock()
        gone = [k for k, r in self._records.items() if rules.live(r, now) is None]
        for key in gone:
            record = self._records.pop(key)
            assert record.expires_at is not None  # records without an expiry never expire
            self._fences[key] = (record.fence, record.expires_at)
            if self._trail is not None:
                self._trail.purged(key, record, now)
        for key in [k for k, (_, at) in self._fences.items() if at + FENCE_MEMORY <= now]:
            del self._fences[key]
        return len(gone)

    # -- the store's mark (`mark.py`) --------------------------------------------------------

    async def mark(self) -> StoreMark | None:
        """The mark this store made at its first claim; None before it."""
        return self._mark

    async def holds_anything(self) -> bool:
        """Whether it keeps a record (in any state) or a history."""
        return bool(self._records) or (self._trail is not None and bool(self._trail.histories))

    # -- history (rule 20) -----------------------------------------------------------------

    async def history(self, key: str) -> str | None:
        """The record's history as stored (`history.parse` reads it); None: it has none."""
        return None if self._trail is None else self._trail.histories.get(key)

    async def histories(self) -> list[tuple[str, str]]:
        """Every history kept, (record key, history), sorted by key."""
        return [] if self._trail is None else sorted(self._trail.histories.items())

    async def iter_histories(self) -> AsyncIterator[tuple[str, str]]:
        """Every history kept, (record key, history), for `mcp-once audit verify`."""
        for kept in await self.histories():
            yield kept

    async def audit(self, *, since: float | None = None, limit: int = 1000) -> list[AuditEntry]:
        """The audit stream from `since` (seconds, store clock) on, oldest first."""
        return [] if self._trail is None else self._trail.read(since, limit)

    async def aclose(self) -> None:
        return None
