"""The `kind` fixture: every journal contract test runs against the memory, SQLite and Redis
journals (SQLite under trio once more), each with a fake clock, so leases and retention are moved
through, never slept through. Redis is the session's real redis-server (tests/conftest.py: a
missing one skips loudly, and fails under CI)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from journal_kinds import Kind, make_memory, make_redis, make_sqlite

KINDS = [
    "memory",
    "sqlite",
    pytest.param("sqlite-trio"),
    pytest.param("redis", marks=pytest.mark.redis),
]


@pytest.fixture
def anyio_backend(request: pytest.FixtureRequest) -> str:
    callspec = getattr(request.node, "callspec", None)
    chosen = callspec.params.get("kind") if callspec is not None else None
    return "trio" if chosen == "sqlite-trio" else "asyncio"


@pytest.fixture(params=KINDS)
async def kind(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Kind]:
    if request.param == "memory":
        made = make_memory()
    elif str(request.param).startswith("sqlite"):
        made = make_sqlite(tmp_path / "journal.db")
    else:
        url = request.getfixturevalue("redis_url")
        made = make_redis(url, request.getfixturevalue("redis_namespace"))
    try:
        yield made
    finally:
        await made.close()
