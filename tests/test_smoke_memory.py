import pytest

from idempotency import ClaimStatus, MemoryKeyStore


@pytest.mark.asyncio
async def test_claim_complete_replay() -> None:
    store = MemoryKeyStore()
    first = await store.claim("k", "fp", lease=10, takeover=False)
    assert first.status is ClaimStatus.CLAIMED and first.token and first.fence == 1
    assert await store.complete("k", first.token, b"r", retention=60)
    again = await store.claim("k", "fp", lease=10, takeover=False)
    assert again.status is ClaimStatus.REPLAY and again.result == b"r"
