"""The store backends under test and the tools to reach around them (used by `conftest.py`).

One `backend` fixture runs each contract test against every key store.

Time is moved, never slept through: memory and SQLite get an injectable fake clock, Redis an
offset added to its own TIME inside the scripts (`advance_clock_for_testing`).
"""

from __future__ import annotations

import inspect
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from fake_clock import FakeClock

from idempotency import KeyStore, MemoryKeyStore, SQLiteKeyStore

#: A fixed, realistic epoch second, so timestamps look like real ones.
#: Every backend's default for abandoned claims and release tombstones.
ORPHAN_RETENTION = 24 * 3600.0


@dataclass
class Backend:
    """A store under test plus what the tests need to reach around it."""

    name: str
    store: KeyStore
    _advance: Callable[[float], object]
    #: Another store instance over the same data (a second process would open the same).
    _reopen: Callable[[], KeyStore] | None = None
    #: SQLite: the database file. Redis: the URL.
    location: str = ""
    #: Redis: the key prefix of this test's namespace.
    prefix: str = ""
    _extra: list[KeyStore] = field(default_factory=list)

    async def advance(self, seconds: float) -> None:
        moved = self._advance(seconds)
        if inspect.isawaitable(moved):
            await moved

    def reopen(self) -> KeyStore:
        if self._reopen is None:
            pytest.skip(f"the {self.name} store cannot be opened twice (one process only)")
        store = self._reopen()
        self._extra.append(store)
        return store

    async def close(self) -> None:
        for store in [*self._extra, self.store]:
            await store.aclose()


def redis_store(
    url: str, prefix: str, *, orphan_retention: float = ORPHAN_RETENTION, audit_stream: bool = False
) -> Any:
    from idempotency import RedisKeyStore

    return RedisKeyStore.from_url(
        url, prefix=prefix, orphan_retention=orphan_retention, audit_stream=audit_stream
    )


def make_memory(*, orphan_retention: float = ORPHAN_RETENTION) -> Backend:
    clock = FakeClock()
    store = MemoryKeyStore(clock=clock, orphan_retention=orphan_retention)
    return Backend("memory", store, clock.advance)


def make_sqlite(path: Path, *, orphan_retention: float = ORPHAN_RETENTION) -> Backend:
    clock = FakeClock()

    def open_store() -> SQLiteKeyStore:
        return SQLiteKeyStore(path, clock=clock, orphan_retention=orphan_retention)

    return Backend(
        "sqlite",
        open_store(),
        clock.advance,
        open_store,
        location=str(path),
    )


def make_redis(
    url: str,
    namespace: str,
    *,
    orphan_retention: float = ORPHAN_RETENTION,
    audit_stream: bool = False,
) -> Backend:
    prefix = f"{namespace}:"
    store = redis_store(url, prefix, orphan_retention=orphan_retention, audit_stream=audit_stream)
    return Backend(
        "redis",
        store,
        store.advance_clock_for_testing,
        lambda: redis_store(
            url, prefix, orphan_retention=orphan_retention, audit_stream=audit_stream
        ),
        location=url,
        prefix=prefix,
    )


def make_redis_sentinel(
    url: str, namespace: str, *, orphan_retention: float = ORPHAN_RETENTION
) -> Backend:
    """The Redis store reached through Sentinel (`redis+sentinel://`); everything else as
    `make_redis`, and raw access goes through Sentinel too (`_redis_client`). It keeps the audit
    stream (`audit_stream=true`), so that every contract test runs on one Redis with the stream
    and without it (`redis`)."""
    made = make_redis(url, namespace, orphan_retention=orphan_retention, audit_stream=True)
    made.name = "redis-sentinel"
    return made


# -- reaching into the stored data, to damage it or prove it did not change ----------------------


async def raw_state(backend: Backend, key: str) -> object:
    """What the backend holds for `key`, byte for byte."""
    if backend.name == "sqlite":
        with sqlite3.connect(backend.location) as conn:
            return conn.execute("SELECT * FROM records WHERE key = ?", (key,)).fetchall()
    if backend.name.startswith("redis"):
        return await _redis_raw(backend, key)
    pytest.skip("the memory store holds Python objects; there is no raw form to damage")


async def damage(backend: Backend, key: str, how: str) -> None:
    """Make the stored record for `key` unreadable as ours."""
    if backend.name == "sqlite":
        statement = {
            "garbled": "UPDATE records SET state = 'banana' WHERE key = ?",
            "wrong-type": "UPDATE records SET fingerprint = NULL, fence = 'x' WHERE key = ?",
        }[how]
        with sqlite3.connect(backend.location) as conn:
            assert conn.execute(statement, (key,)).rowcount == 1
        return
    if backend.name.startswith("redis"):
        await _redis_damage(backend, key, how)
        return
    pytest.skip("the memory store holds Python objects and cannot be damaged from outside")


def _redis_client(backend: Backend) -> Any:
    # Synchronous, run in a worker thread: the contract also runs under trio, where redis-py's
    # asyncio client cannot. On a cluster, redis-py's cluster client: SCAN covers every master,
    # and each key command goes to the key's owner.
    return sync_redis_client(backend.location)


def sync_redis_client(url: str) -> Any:
    """A synchronous redis-py client for a `redis://`, `redis+cluster://` or
    `redis+sentinel://` URL (the primary Sentinel names)."""
    import redis
    from redis.cluster import ClusterNode, RedisCluster

    from idempotency._stores.redis.cluster import seeds_of_url

    if url.startswith("redis+sentinel://"):
        return _sentinel_client(url)
    if not url.startswith("redis+cluster://"):
        return redis.Redis.from_url(url)
    seeds, _ = seeds_of_url(url)
    return RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in seeds])


def _sentinel_client(url: str) -> Any:
    """A synchronous redis-py client of the primary a `redis+sentinel://` URL names."""
    from redis.sentinel import Sentinel

    from idempotency._stores.redis.sentinel import parse_sentinel_url

    hosts, service, options, sentinel_options = parse_sentinel_url(url)
    return Sentinel(hosts, sentinel_kwargs=sentinel_options).master_for(service, **options)


def _redis_names(client: Any, backend: Backend, key: str) -> list[bytes]:
    """The Redis keys of this test's namespace that belong to record `key` (found by SCAN)."""
    return [name for name in client.scan_iter(match=f"{backend.prefix}*") if key.encode() in name]


async def _redis_raw(backend: Backend, key: str) -> dict[bytes, object]:
    return await anyio.to_thread.run_sync(_redis_raw_now, backend, key)


def _redis_raw_now(backend: Backend, key: str) -> dict[bytes, object]:
    with _redis_client(backend) as client:
        found: dict[bytes, object] = {}
        for name in _redis_names(client, backend, key):
            kind = client.type(name)
            if kind == b"hash":
                found[name] = ("hash", client.hgetall(name))
            elif kind == b"string":
                found[name] = ("string", client.get(name))
            else:
                found[name] = (kind, client.dump(name))
        return found


async def _redis_damage(backend: Backend, key: str, how: str) -> None:
    await anyio.to_thread.run_sync(_redis_damage_now, backend, key, how)


def _redis_damage_now(backend: Backend, key: str, how: str) -> None:
    """Overwrite the record's key: with a garbage string, or with another Redis type."""
    with _redis_client(backend) as client:
        names = _redis_names(client, backend, key)
        # A record's history (`:h`, rule 20) is a string beside it, not the record.
        records = [
            name for name in names if client.type(name) == b"string" and not name.endswith(b":h")
        ]
        assert len(records) == 1, f"expected one record for {key!r}, found {names}"
        name = records[0]
        ttl = client.pttl(name)
        if how == "garbled":
            client.set(name, b"banana" * 20, px=ttl if ttl > 0 else None)
        else:
            client.delete(name)
            client.hset(name, mapping={"state": "banana", "fingerprint": ""})


def write_history(backend: Backend, key: str, text: str, *, beside: bool = False) -> None:
    """Store `text` as the history of `key` behind the store's back: memory's dict, SQLite's
    `history` row (made if missing); on Redis inside the record (format 3), or with `beside` in
    a key beside it (`{key}:h`), as the release of issue 37 kept histories."""
    from history_tamper import with_redis_history

    store = backend.store
    if isinstance(store, MemoryKeyStore):
        assert store._trail is not None
        store._trail.histories[key] = text
    elif backend.name == "sqlite":
        with sqlite3.connect(backend.location) as conn:
            conn.execute(
                "INSERT INTO history (key, lines) VALUES (?, ?)"
                " ON CONFLICT (key) DO UPDATE SET lines = excluded.lines",
                (key, text),
            )
        conn.close()
    else:
        with sync_redis_client(backend.location) as client:
            name = f"{backend.prefix}{{{key}}}"
            if beside:
                client.set(f"{name}:h", text)
            else:
                client.set(name, with_redis_history(client.get(name), text), keepttl=True)
