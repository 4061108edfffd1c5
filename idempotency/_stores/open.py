"""`open_store(url)`: one configuration string picks the key store backend.

A URL keeps deployment choices out of code: the same server runs on `memory://` in a demo, on a
SQLite file on one host and on Redis across hosts.
"""

from __future__ import annotations

from .memory import MemoryKeyStore
from .sqlite import SQLiteKeyStore
from .store import KeyStore

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+sentinel://", "rediss+sentinel://")
_REDIS_CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")


def open_store(url: str) -> KeyStore:
    """The key store `url` names.

    `memory://` (one process, lost on restart), `sqlite:///relative.db`,
    `sqlite:////absolute.db` or a plain file path (durable, one host), `redis://`, `rediss://`,
    `unix://` or `redis+sentinel://host:port[,host:port...]/service_name[/db]` (shared by many
    hosts; `rediss+sentinel://` over TLS), `redis+cluster://host:port[,host:port...]` (a Redis
    Cluster, `rediss+cluster://` over TLS).

    The query may carry the store's own options, parsed with their types
    (`redis://host/0?wait_replicas=1&wait_aof=true&prefix=app:`, `sqlite:///keys.db?busy_timeout=10`:
    the keyword options of `RedisKeyStore.from_url` / `SQLiteKeyStore.from_url`); a Redis URL's
    other options are redis-py's. An option neither knows raises `ValueError` naming it.
    """
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"a key store URL must be a non-empty string, not {url!r}")
    if url.startswith("memory:"):
        if url not in ("memory://", "memory:"):
            raise ValueError(f"the memory store takes no location or options: {url!r}")
        return MemoryKeyStore()
    if url.startswith("sqlite:"):
        return SQLiteKeyStore.from_url(url)
    if url.startswith(_REDIS_SCHEMES + _REDIS_CLUSTER_SCHEMES):
        # Imported here so that servers without Redis never load its client.
        from .redis.store import RedisKeyStore

        return RedisKeyStore.from_url(url)
    if "://" in url:
        scheme = url.split("://", 1)[0]
        raise ValueError(
            f"unknown key store scheme {scheme!r} in {url!r}; use memory://,"
            " sqlite:///path.db (or a plain file path), redis://, rediss://, unix://"
            " redis+sentinel:// or redis+cluster://"
        )
    return SQLiteKeyStore(url)
