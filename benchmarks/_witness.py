"""A key store that remembers what it acknowledged, to find acknowledged writes a failover lost.

The server's guard talks to this wrapper exactly as to the store it wraps. The wrapper notes every
claim the store answered CLAIMED (with its fence) and every complete that answered True, and
when each store write last succeeded. A write is lost if a later answer contradicts it:

* an acknowledged claim is lost when a later claim of that key is CLAIMED with a fence no higher
  (the record vanished and began again at fence 1), or when, at the end, a key whose last
  acknowledged write was a claim has no record;
* an acknowledged completion is lost when a later claim of that key is answered anything but a
  replay, or when, at the end, its record is missing or not COMPLETED.

The ledger, not this wrapper, counts effects: the store under test cannot vouch for itself.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from idempotency import ClaimOutcome, ClaimStatus, KeyStore, Record, RecordState


@dataclass(slots=True)
class _Key:
    fence: int = 0
    completed: bool = False
    #: The last acknowledged write: "claim", "complete" or "release".
    last: str = ""


@dataclass(slots=True)
class Losses:
    claims: set[str] = field(default_factory=set)
    completions: set[str] = field(default_factory=set)


class Witness(KeyStore):
    """`store` plus a memory of its acknowledgements (one event loop; no locking needed)."""

    def __init__(self, store: KeyStore) -> None:
        self.store = store
        self.keys: dict[str, _Key] = {}
        self.losses = Losses()
        #: (sent, answered) `time.monotonic()` of every write that succeeded (any answer
        #: counts: it reached a primary that took it).
        self.writes: list[tuple[float, float]] = []
        #: Per key, what each write answered ("claim CLAIMED fence 2", "complete
        #: StoreUnavailable"): the story behind a record that ended UNKNOWN. No arguments, no
        #: results.
        self.history: dict[str, list[str]] = {}

    def first_write_after(self, instant: float) -> float | None:
        """When the first write sent at or after `instant` was answered (a write sent earlier
        may have been answered by the primary that died)."""
        later = [answered for sent, answered in self.writes if sent >= instant]
        return min(later) if later else None

    @contextlib.contextmanager
    def _noting(self, key: str, what: str) -> Iterator[list[str]]:
        """Note how the write `what` on `key` ended: the answer the body appends, or the error."""
        told: list[str] = []
        try:
            yield told
        except BaseException as exc:
            self.history.setdefault(key, []).append(f"{what} {type(exc).__name__}")
            raise
        self.history.setdefault(key, []).append(" ".join([what, *told]))

    async def audit(self) -> Losses:
        """Compare each key's last acknowledged write with its record as stored now."""
        for key, seen in self.keys.items():
            record = await self.store.get(key)
            if seen.last == "complete" and (
                record is None or record.state is not RecordState.COMPLETED
            ):
                self.losses.completions.add(key)
            if seen.last == "claim" and record is None:
                self.losses.claims.add(key)
        return self.losses

    # -- KeyStore ----------------------------------------------------------------------------

    async def claim(
        self, key: str, fingerprint: str, *, lease: float, takeover: bool, tool: str | None = None
    ) -> ClaimOutcome:
        sent = time.monotonic()
        with self._noting(key, "claim") as told:
            outcome = await self.store.claim(
                key, fingerprint, lease=lease, takeover=takeover, tool=tool
            )
            told += [outcome.status.name, f"fence {outcome.fence}"]
        self.writes.append((sent, time.monotonic()))
        seen = self.keys.setdefault(key, _Key())
        if seen.completed and outcome.status is not ClaimStatus.REPLAY:
            self.losses.completions.add(key)
        if outcome.status is ClaimStatus.CLAIMED:
            if outcome.fence <= seen.fence:
                self.losses.claims.add(key)
            seen.fence = max(seen.fence, outcome.fence)
            seen.completed = False
            seen.last = "claim"
        return outcome

    async def renew(self, key: str, token: str, *, lease: float) -> bool:
        return await self.store.renew(key, token, lease=lease)

    async def complete(self, key: str, token: str, result: bytes, *, retention: float) -> bool:
        sent = time.monotonic()
        with self._noting(key, "complete") as told:
            done = await self.store.complete(key, token, result, retention=retention)
            told.append(str(done))
        self.writes.append((sent, time.monotonic()))
        if done:
            seen = self.keys.setdefault(key, _Key())
            seen.completed = True
            seen.last = "complete"
        return done

    async def release(self, key: str, token: str) -> bool:
        with self._noting(key, "release") as told:
            released = await self.store.release(key, token)
            told.append(str(released))
        if released:
            self.keys.setdefault(key, _Key()).last = "release"
        return released

    async def wait(self, key: str, *, timeout: float) -> Record | None:
        return await self.store.wait(key, timeout=timeout)

    async def get(self, key: str) -> Record | None:
        return await self.store.get(key)

    async def list_records(
        self, *, state: RecordState | None = None, tool: str | None = None, limit: int = 100
    ) -> list[Record]:
        return await self.store.list_records(state=state, tool=tool, limit=limit)

    async def settle(self, key: str, *, result: bytes | None, retention: float) -> bool:
        return await self.store.settle(key, result=result, retention=retention)

    async def purge_expired(self) -> int:
        return await self.store.purge_expired()

    async def aclose(self) -> None:
        await self.store.aclose()
