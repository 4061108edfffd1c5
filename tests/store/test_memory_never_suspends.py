"""`MemoryKeyStore.claim` is marked `never_suspends`, so the guard claims without a shielded
scope: the mark must be true (the coroutine completes on its first step, so no cancellation can
land inside it), and must not be inherited by an override that may suspend."""

from __future__ import annotations

import anyio.lowlevel
import pytest

from idempotency import ClaimOutcome, ClaimStatus, MemoryKeyStore
from idempotency._stores.store import suspends


def test_the_memory_claim_completes_without_suspending() -> None:
    store = MemoryKeyStore()
    for round_ in range(3):  # a first claim, a busy one, and one on another key
        key = "k" if round_ < 2 else "other"
        coro = store.claim(key, "fp", lease=30.0, takeover=False, tool="t")
        with pytest.raises(StopIteration) as done:
            coro.send(None)  # one step, no event loop: it must not yield
        status = done.value.value.status
        assert status is (ClaimStatus.BUSY if round_ == 1 else ClaimStatus.CLAIMED)
    assert suspends(store.claim) is False


def test_an_override_is_not_marked_and_other_stores_are_shielded() -> None:
    class Slower(MemoryKeyStore):
        async def claim(
            self,
            key: str,
            fingerprint: str,
            *,
            lease: float,
            takeover: bool,
            tool: str | None = None,
        ) -> ClaimOutcome:
            await anyio.lowlevel.checkpoint()
            return await super().claim(key, fingerprint, lease=lease, takeover=takeover, tool=tool)

    assert suspends(Slower().claim) is True
    assert suspends(MemoryKeyStore().complete) is True  # only what is marked
