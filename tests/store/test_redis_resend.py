"""Rule 12: every transition is safe to re-send after a lost reply.

A proxy of ours (`lossy_proxy.py`) sits between the store and Redis. It lets a chosen script
reach Redis and run, then drops Redis's answer and closes the connection. The store sends the
script again on a fresh connection, and the record must end as if the answer had arrived: a
re-sent claim finds its own claim, a re-sent complete reports success, nothing is left
IN_PROGRESS or turned UNKNOWN. When the re-send fails too (Redis unreachable for a moment), the
caller's own retry of the same write is recognised as a re-send. Runs under asyncio and trio.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from lossy_proxy import LossyProxy

from idempotency import ClaimStatus, RecordState, RedisKeyStore, StoreUnavailable
from idempotency._stores.redis import lua

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

FP = "fp-a"
LEASE = 30.0
SCRIPTS = {"complete": lua.COMPLETE, "renew": lua.RENEW, "release": lua.RELEASE}


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def proxy(redis_url: str) -> AsyncIterator[LossyProxy]:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    async with LossyProxy(port).running() as running:
        yield running


@pytest.fixture
async def stores(
    proxy: LossyProxy, redis_url: str, redis_namespace: str
) -> AsyncIterator[tuple[RedisKeyStore, RedisKeyStore]]:
    """The store under test (through the proxy) and an observer (straight to Redis)."""
    prefix = f"{redis_namespace}:"
    through = RedisKeyStore.from_url(proxy.url, prefix=prefix)
    observer = RedisKeyStore.from_url(redis_url, prefix=prefix)
    assert await observer.get("warm-up") is None
    for script in (lua.CLAIM, lua.COMPLETE, lua.RELEASE, lua.RENEW, lua.SETTLE, lua.RECONCILE):
        await observer._plain(lua_load(script))  # cached: the cut hits EVALSHA, not NOSCRIPT
    try:
        yield through, observer
    finally:
        await through.aclose()
        await observer.aclose()


async def held(store: RedisKeyStore, key: str = "k", *, lease: float = LEASE) -> str:
    """A claim on `key`, made without incident; its token."""
    first = await store.claim(key, FP, lease=lease, takeover=True)
    assert first.status is ClaimStatus.CLAIMED and first.token
    return first.token


def lua_load(script: lua.Script) -> bytes:
    from idempotency._stores.redis.wire import command

    return command(b"SCRIPT", b"LOAD", script.source)


async def test_a_claim_whose_reply_was_lost_finds_itself(
    proxy: LossyProxy, stores: tuple[RedisKeyStore, RedisKeyStore]
) -> None:
    store, observer = stores
    assert await store.get("k") is None  # connected through the proxy
    proxy.cut_reply_to(lua.CLAIM.sha.encode())
    outcome = await store.claim("k", FP, lease=LEASE, takeover=False)
    assert proxy.cut.is_set()
    assert outcome.status is ClaimStatus.CLAIMED, outcome
    assert (outcome.fence, outcome.attempts, outcome.took_over) == (1, 1, False)
    record = await observer.get("k")
    assert record is not None and record.state is RecordState.IN_PROGRESS
    assert record.token == outcome.token and record.fence == 1
    assert outcome.token is not None
    assert await store.complete("k", outcome.token, b"r", retention=60)
    replay = await observer.claim("k", FP, lease=LEASE, takeover=False)
    assert replay.status is ClaimStatus.REPLAY and replay.result == b"r"


@pytest.mark.parametrize("write", ["complete", "renew", "release"])
async def test_a_write_whose_reply_was_lost_reports_success(
    proxy: LossyProxy, stores: tuple[RedisKeyStore, RedisKeyStore], write: str
) -> None:
    store, observer = stores
    token = await held(store)
    proxy.cut_reply_to(SCRIPTS[write].sha.encode())
    if write == "complete":
        assert await store.complete("k", token, b"result", retention=60) is True
    elif write == "renew":
        assert await store.renew("k", token, lease=LEASE) is True
    else:
        assert await store.release("k", token) is True
    assert proxy.cut.is_set()
    record = await observer.get("k")
    if write == "complete":
        assert record is not None and record.state is RecordState.COMPLETED
        assert record.result == b"result" and record.attempts == 1
    elif write == "renew":
        assert record is not None and record.state is RecordState.IN_PROGRESS
        assert record.token == token
    else:
        assert record is None
        again = await observer.claim("k", FP, lease=LEASE, takeover=False)
        assert again.fence == 2  # the release left its tombstone once


async def test_a_settle_whose_reply_was_lost_reports_success(
    proxy: LossyProxy, stores: tuple[RedisKeyStore, RedisKeyStore]
) -> None:
    store, observer = stores
    await held(observer, "u", lease=1.0)
    store.advance_clock_for_testing(2.0)
    unknown = await store.claim("u", FP, lease=1.0, takeover=False)
    assert unknown.status is ClaimStatus.UNKNOWN
    proxy.cut_reply_to(lua.SETTLE.sha.encode())
    assert await store.settle("u", result=b"verdict", retention=60) is True
    assert proxy.cut.is_set()
    settled = await store.get("u")
    assert settled is not None and settled.state is RecordState.COMPLETED
    assert settled.result == b"verdict"


async def test_a_plain_retry_after_a_failed_re_send_is_recognised(
    proxy: LossyProxy, stores: tuple[RedisKeyStore, RedisKeyStore]
) -> None:
    """The reply is lost and the re-send finds Redis unreachable: the caller sees
    STORE_UNAVAILABLE. Its own retry later (the client's retry of a claim, the guard's retry of
    a result) is then sent as a re-send, and finds its effect instead of misreading it."""
    store, observer = stores
    assert await store.get("k") is None
    proxy.cut_reply_to(lua.CLAIM.sha.encode())
    proxy.refuse()  # the re-send's fresh connection is closed at once
    with pytest.raises(StoreUnavailable):
        await store.claim("k", FP, lease=LEASE, takeover=False)
    assert proxy.cut.is_set()
    orphan = await observer.get("k")
    assert orphan is not None and orphan.state is RecordState.IN_PROGRESS  # it did land
    proxy.accept()
    retried = await store.claim("k", FP, lease=LEASE, takeover=False)
    assert retried.status is ClaimStatus.CLAIMED, retried  # not BUSY until the lease ends
    assert retried.token == orphan.token and retried.fence == 1

    assert retried.token is not None
    proxy.cut_reply_to(lua.COMPLETE.sha.encode())
    proxy.refuse()
    with pytest.raises(StoreUnavailable):
        await store.complete("k", retried.token, b"result", retention=60)
    proxy.accept()
    assert await store.complete("k", retried.token, b"result", retention=60) is True
    record = await observer.get("k")
    assert record is not None and record.state is RecordState.COMPLETED
    assert (record.result, record.attempts) == (b"result", 1)


async def test_a_re_sent_write_never_claims_another_attempts_effect(
    proxy: LossyProxy, stores: tuple[RedisKeyStore, RedisKeyStore]
) -> None:
    """The relaxed rule accepts only the write's own effect: a stale worker's complete whose
    reply was lost, re-sent after another attempt completed, still answers "lost"."""
    store, observer = stores
    stale = await held(store, lease=5.0)
    observer.advance_clock_for_testing(6.0)
    fresh = await observer.claim("k", FP, lease=5.0, takeover=True)
    assert fresh.token and fresh.took_over
    assert await observer.complete("k", fresh.token, b"fresh", retention=60)
    proxy.cut_reply_to(lua.COMPLETE.sha.encode())
    assert await store.complete("k", stale, b"stale", retention=60) is False
    assert proxy.cut.is_set()
    record = await observer.get("k")
    assert record is not None and record.result == b"fresh"


async def test_a_reconcile_whose_reply_was_lost_finds_its_own_claim(
    proxy: LossyProxy, stores: tuple[RedisKeyStore, RedisKeyStore]
) -> None:
    """Rule 12 for rule 19: the claim of an in-doubt record for its reconciliation, re-sent
    after its reply was lost, finds its own token and answers CLAIMED, not lost."""
    store, observer = stores
    await held(observer, "r", lease=1.0)
    store.advance_clock_for_testing(2.0)
    unknown = await store.claim("r", FP, lease=1.0, takeover=False)
    assert unknown.status is ClaimStatus.UNKNOWN and unknown.fence is not None
    proxy.cut_reply_to(lua.RECONCILE.sha.encode())
    taken = await store.reconcile("r", FP, unknown.fence, lease=LEASE)
    assert proxy.cut.is_set()
    assert taken is not None and taken.status is ClaimStatus.CLAIMED
    record = await observer.get("r")
    assert record is not None and record.state is RecordState.IN_PROGRESS
    assert (record.token, record.fence) == (taken.token, unknown.fence + 1)
