"""A store marks itself at its first write (issue 48, `idempotency._stores.mark`), on every
backend: unmarked and holding nothing until a claim; every read (and a claim refused for a bad
key) leaves it so; the first claim marks it, on the store's clock; another store object over the
same data finds that mark and keeps it; a record's history alone (its record purged) still counts
as something of ours. The marking is one store call per store object (concurrent first claims
share it), not one per claim; a mark the store refuses fails no claim and is not tried again by
that object.
"""

from __future__ import annotations

import functools

import anyio
import pytest
from fake_clock import EPOCH
from store_backends import Backend, write_history

from idempotency import (
    AuditedStore,
    LimitExceeded,
    MarkedStore,
    RedisKeyStore,
    SQLiteKeyStore,
    StoreMark,
    StoreUnavailable,
)

pytestmark = pytest.mark.anyio

LEASE = 10.0


def marked(backend: Backend) -> MarkedStore:
    store = backend.store
    assert isinstance(store, MarkedStore)
    return store


async def test_a_store_is_marked_by_its_first_claim_and_by_nothing_before(
    backend: Backend,
) -> None:
    store = marked(backend)
    assert await store.mark() is None
    assert not await store.holds_anything()
    # Reads of every kind leave it as it is: looking creates nothing.
    await backend.store.get("k")
    await backend.store.list_records()
    await backend.store.wait("k", timeout=0)
    await backend.store.purge_expired()
    with pytest.raises(LimitExceeded):
        await backend.store.claim("", "fp", lease=LEASE, takeover=False)
    assert await store.mark() is None
    assert not await store.holds_anything()

    await backend.advance(5)
    claimed = await backend.store.claim("k", "fp", lease=LEASE, takeover=False, tool="charge")
    assert claimed.token is not None
    mark = await store.mark()
    assert isinstance(mark, StoreMark) and mark.format == 1
    if backend.name in ("memory", "sqlite"):  # the fake clock: exactly when it was written
        assert mark.created_at == EPOCH + 5
    assert await store.holds_anything()

    # Another store object (another process) finds that mark, and its own first claim keeps it.
    await backend.advance(60)
    again = backend.reopen()
    assert isinstance(again, MarkedStore)
    assert await again.mark() == mark
    await again.claim("other", "fp", lease=LEASE, takeover=False)
    assert await again.mark() == mark == await store.mark()


async def test_a_history_alone_is_something_of_ours(backend: Backend) -> None:
    """A history whose record is gone (a record of the release before format 3 purged here on
    Redis, its history beside it kept for a grace; on memory and SQLite a history row without
    its record): the store is not "nothing". A purged record's history goes with it (rule 24)."""
    store = backend.store
    claimed = await store.claim("k", "fp", lease=LEASE, takeover=False)
    assert claimed.token is not None
    assert await store.release("k", claimed.token)
    assert isinstance(store, AuditedStore)
    text = await store.history("k")
    assert text is not None
    await backend.advance(30 * 24 * 3600)  # past the release tombstone's retention
    assert await store.purge_expired() == 1
    assert await store.list_records() == []
    write_history(backend, "k", text, beside=True)
    assert await marked(backend).holds_anything()


def count_marks(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, *, fail: bool = False
) -> list[None]:
    """Each mark the store object writes (or, with `fail`, fails to: the store refuses it)."""
    store = backend.store
    if not isinstance(store, SQLiteKeyStore | RedisKeyStore):
        pytest.skip("the memory store's mark is an attribute it sets")
    written: list[None] = []
    write_mark = store._write_mark

    async def counted() -> None:
        written.append(None)
        if fail:
            raise StoreUnavailable("the mark's node is down")
        await write_mark()

    monkeypatch.setattr(store, "_write_mark", counted)
    return written


async def test_the_mark_is_written_once_per_store_object_not_per_claim(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrent first claims write it once; the next claims cost a claim and nothing more
    (on one Redis: one round trip each)."""
    written = count_marks(backend, monkeypatch)
    store = backend.store
    async with anyio.create_task_group() as group:
        for n in range(8):
            group.start_soon(
                functools.partial(store.claim, f"k{n}", "fp", lease=LEASE, takeover=False)
            )
    assert len(written) == 1
    writes = store._traffic.writes if isinstance(store, RedisKeyStore) else 0
    for key in ("a", "b", "c"):
        await store.claim(key, "fp", lease=LEASE, takeover=False)
    assert len(written) == 1
    if isinstance(store, RedisKeyStore) and "cluster" not in backend.location:
        # (On a cluster a claim's first visit to a node opens its connection as well.)
        assert store._traffic.writes - writes == 3
    assert await marked(backend).mark() is not None


async def test_a_mark_that_cannot_be_written_fails_no_claim_and_is_tried_once(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    written = count_marks(backend, monkeypatch, fail=True)
    for key in ("a", "b"):
        claimed = await backend.store.claim(key, "fp", lease=LEASE, takeover=False)
        assert claimed.token is not None
    assert len(written) == 1
    assert "could not mark the key store" in caplog.text and "StoreUnavailable" in caplog.text
    assert await marked(backend).mark() is None
    assert await marked(backend).holds_anything()  # its records say it is ours all the same
