"""Framework-integration fixtures: the shop server (guarded or not) over stdio and streamable HTTP,
its effect ledger, and testing mode (no backoff sleeps)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import orchestrator

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "server"))  # server_kit.serve_http

from _kit import Shop, TransportName, open_shop


@pytest.fixture(autouse=True)
def _no_sleeps() -> Iterator[None]:
    with orchestrator.testing():
        yield


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest) -> TransportName:
    name: TransportName = request.param
    return name


@pytest.fixture
async def guarded_shop(transport: TransportName, tmp_path: Path) -> AsyncIterator[Shop]:
    """The shop with every effect tool but `notify` guarded by mcp-once (a SQLite key store)."""
    async with open_shop(transport, tmp_path, guarded=True) as shop:
        yield shop


@pytest.fixture
async def plain_shop(transport: TransportName, tmp_path: Path) -> AsyncIterator[Shop]:
    """The same shop without mcp-once on the server: `notify` is a plain non-idempotent tool."""
    async with open_shop(transport, tmp_path, guarded=False) as shop:
        yield shop
