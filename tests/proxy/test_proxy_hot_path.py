"""The proxy's per-call work, held to its behaviour: the upstream's listing is adopted once per
distinct content (an unchanged listing serves the same tools, a changed one is adopted afresh and
guarded as it now says), and a call through the proxy costs the store exactly the guard's round
trips (two for a first execution, one for a replay). A stdio Python upstream with an effect
ledger (`changing_server.py`), the proxy in this process so its provider and store can be read
(the slow tier: each test starts the upstream as a child)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from proxy_kit import HERE, lines, meta_key, status

from idempotency import KeyStore, MemoryKeyStore, RedisKeyStore
from mcp_once.proxy import OnceProxy, Upstream, build_proxy
from mcp_once.proxy.tools import OnceProxyProvider

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]


@asynccontextmanager
async def _proxy(ledger: Path, store: KeyStore) -> AsyncIterator[tuple[OnceProxy, Client[Any]]]:
    upstream = Upstream.stdio(sys.executable, str(HERE / "changing_server.py"), str(ledger))
    proxy = build_proxy(upstream, store)
    async with proxy.opened(), Client(proxy) as client:
        yield proxy, client


def _provider(proxy: OnceProxy) -> OnceProxyProvider:
    return next(p for p in proxy.providers if isinstance(p, OnceProxyProvider))


async def test_a_listing_is_adopted_once_per_content_and_a_changed_one_afresh(
    anyio_backend: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "effects"
    async with _proxy(ledger, MemoryKeyStore()) as (proxy, client):
        provider = _provider(proxy)
        first = list(await provider.list_tools())
        again = list(await provider.list_tools())
        assert [t.name for t in first] == ["write", "turn_read_only"]
        assert all(a is b for a, b in zip(first, again, strict=True))  # nothing rebuilt
        for expected in ("executed", "replayed"):
            result = await client.call_tool_mcp("write", {"text": "a"}, meta=meta_key("k-1"))
            assert status(result) == expected
        assert lines(ledger) == 1
        await client.call_tool_mcp("turn_read_only", {}, meta=meta_key("flip"))
        listed = {t.name: t for t in await client.list_tools()}
        annotations = listed["write"].annotations
        assert annotations is not None and annotations.read_only_hint is True
        changed = {t.name: t for t in await provider.list_tools()}
        assert changed["write"] is not first[0] and changed["write"].annotations == annotations
        # Read-only now: the same key passes through to the upstream, no record, no replay.
        through = await client.call_tool_mcp("write", {"text": "b"}, meta=meta_key("k-1"))
        assert status(through) is None and not through.is_error
        assert lines(ledger) == 2


@pytest.mark.redis
async def test_the_proxy_adds_no_store_round_trip(
    anyio_backend: str, tmp_path: Path, redis_url: str, redis_namespace: str
) -> None:
    store = RedisKeyStore.from_url(redis_url, prefix=f"{redis_namespace}:")
    try:
        async with _proxy(tmp_path / "effects", store) as (_, client):
            await client.call_tool_mcp("write", {"text": "warm"}, meta=meta_key("warm"))
            trips = []
            for _ in ("first execution", "replay"):
                before = store._traffic.writes
                result = await client.call_tool_mcp("write", {"text": "a"}, meta=meta_key("k-1"))
                assert not result.is_error
                trips.append((status(result), store._traffic.writes - before))
            assert trips == [("executed", 2), ("replayed", 1)]
            assert lines(tmp_path / "effects") == 2
    finally:
        await store.aclose()
