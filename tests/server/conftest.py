"""Fixtures for the server-side tests: one `store` per test, over every backend that exists."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from idempotency import KeyStore, MemoryKeyStore, SQLiteKeyStore


def _redis_store(url: str, namespace: str) -> KeyStore:
    from idempotency import RedisKeyStore

    return RedisKeyStore.from_url(url, prefix=namespace)


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[KeyStore]:
    """A fresh key store of each kind; tests taking it run once per backend."""
    made: KeyStore
    if request.param == "memory":
        made = MemoryKeyStore()
    elif request.param == "sqlite":
        made = SQLiteKeyStore(tmp_path / "keys.db")
    else:
        made = _redis_store(
            request.getfixturevalue("redis_url"), request.getfixturevalue("redis_namespace")
        )
    try:
        yield made
    finally:
        await made.aclose()
