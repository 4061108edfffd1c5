"""The `backend` fixture: each contract test runs against every key store (memory, SQLite,
Redis, a 3-master Redis Cluster, Redis through Sentinel), and against Redis and the cluster once
more under trio; see `store_backends.py` for how each one is built and moved through time. The
cluster backends are the same `redis` backend (same name, same checks) given a
`redis+cluster://` URL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from store_backends import Backend, make_memory, make_redis, make_redis_sentinel, make_sqlite

BACKENDS = [
    "memory",
    "sqlite",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-trio", marks=pytest.mark.redis),
    pytest.param("redis-cluster", marks=[pytest.mark.redis, pytest.mark.slow]),
    pytest.param("redis-cluster-trio", marks=[pytest.mark.redis, pytest.mark.slow]),
    pytest.param("redis-sentinel", marks=pytest.mark.redis),
]


@pytest.fixture
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """trio for the `redis-trio` backend, asyncio for everything else."""
    callspec = getattr(request.node, "callspec", None)
    chosen = callspec.params.get("backend") if callspec is not None else None
    return "trio" if chosen in ("redis-trio", "redis-cluster-trio") else "asyncio"


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "memory":
        made = make_memory()
    elif request.param == "sqlite":
        made = make_sqlite(tmp_path / "keys.db")
    elif request.param == "redis-sentinel":
        made = sentinel_backend(request)
    else:
        cluster = str(request.param).startswith("redis-cluster")
        url = request.getfixturevalue("redis_cluster_url" if cluster else "redis_url")
        made = make_redis(url, request.getfixturevalue("redis_namespace"))
    try:
        yield made
    finally:
        await made.close()


def sentinel_backend(request: pytest.FixtureRequest) -> Backend:
    """The Redis store through the session's Sentinel deployment."""
    url = request.getfixturevalue("redis_sentinel_url")
    return make_redis_sentinel(url, request.getfixturevalue("redis_namespace"))


@pytest.fixture
def prefix(redis_namespace: str) -> str:
    """This test's key prefix on a shared Redis or cluster."""
    return f"{redis_namespace}:"
