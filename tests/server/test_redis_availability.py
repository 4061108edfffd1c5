"""Rule 12 through real MCP calls: a healthy Redis is never reported unavailable.

Under load (a thousand waiting duplicates and unrelated keys in one process, in process and over
streamable HTTP) every duplicate waits and replays and no call gets STORE_UNAVAILABLE, while the
store holds a small, fixed number of Redis connections. After a restart (SIGKILL, AOF) every
call made once Redis answers PING again succeeds; calls made while it is down get
STORE_UNAVAILABLE and the tool does not run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
from mcp import MCPError
from mcp.client import Client
from mcp.server.mcpserver import MCPServer
from redis_server import RedisServer, redis_server_binary
from server_kit import marker, meta, serve_http

from idempotency import RedisKeyStore, idempotent, wire

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

#: The store's connections on one event loop: one for commands, one shared by every waiter.
STORE_CONNECTIONS = 2


class Shop:
    """A guarded tool that counts its executions per order and can hold them at a gate."""

    def __init__(self, store: RedisKeyStore, *, waiters_expected: int = 0) -> None:
        self.store = store
        self.executions: Counter[str] = Counter()
        self.gate = anyio.Event()
        self.waiters_expected = waiters_expected
        #: Set once that many duplicates wait with their subscription confirmed.
        self.all_waiting = anyio.Event()
        self.server = MCPServer("shop")

        @self.server.tool()
        @idempotent(store, wait=300.0)
        async def charge(order: str) -> str:
            await self.gate.wait()
            self.executions[order] += 1
            return f"charged {order}"

    def count_waiters(self) -> None:
        """Watch the store's waiter table on this event loop (call inside the test's loop)."""
        waiters = self.store._here().waiters()
        watching = waiters.watching
        subscribed = 0

        @asynccontextmanager
        async def counted(channel: bytes) -> AsyncIterator[Any]:
            nonlocal subscribed
            async with watching(channel) as watch:
                subscribed += 1
                if subscribed >= self.waiters_expected:
                    self.all_waiting.set()
                yield watch

        waiters.watching = counted  # type: ignore[method-assign]


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A server of our own, so that CLIENT LIST shows only this test's connections."""
    if redis_server_binary() is None:
        pytest.skip("redis-server is not on PATH")
    with RedisServer(appendonly=True) as server:
        yield server


@pytest.fixture
async def observer(private_redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(private_redis.url, single_connection_client=True)
    yield client
    await client.aclose()


async def others(observer: aioredis.Redis) -> int:
    """Client connections to Redis besides the observer's own."""
    return len(await observer.client_list()) - 1


async def burst(
    call: Any, shop: Shop, duplicates: int, distinct: int, observer: aioredis.Redis
) -> tuple[list[Any], int]:
    """`duplicates` calls with one key and `distinct` calls with keys of their own, all at
    once; the gate opens once every duplicate but the first waits, subscribed on the store's
    subscriber connection. Returns the answers and the most Redis connections seen at any moment."""
    answers: list[Any] = []
    peak = 0

    async def one(order: str, key: str) -> None:
        try:
            answers.append(await call(order, key))
        except MCPError as exc:
            answers.append(exc)

    async def monitor() -> None:
        nonlocal peak
        while True:
            peak = max(peak, await others(observer))
            await anyio.sleep(0.02)

    with anyio.fail_after(240):
        async with anyio.create_task_group() as watching:
            watching.start_soon(monitor)
            async with anyio.create_task_group() as tg:
                for _ in range(duplicates):
                    tg.start_soon(one, "dup", "dup-key")
                for n in range(distinct):
                    tg.start_soon(one, f"other-{n}", f"key-{n}")
                await shop.all_waiting.wait()
                peak = max(peak, await others(observer))
                shop.gate.set()
            watching.cancel_scope.cancel()
    return answers, peak


def check(answers: list[Any], shop: Shop, duplicates: int, distinct: int) -> None:
    errors = [a for a in answers if isinstance(a, MCPError)]
    unavailable = [e for e in errors if e.code == wire.STORE_UNAVAILABLE]
    assert not unavailable, f"{len(unavailable)} x STORE_UNAVAILABLE"
    assert not errors, errors[:3]
    assert len(answers) == duplicates + distinct
    assert shop.executions == Counter(
        {"dup": 1, **{f"other-{n}": 1 for n in range(distinct)}}
    )  # exactly one execution per key
    statuses = Counter((marker(a)["key"], marker(a)["status"]) for a in answers)
    assert statuses[("dup-key", "executed")] == 1
    assert statuses[("dup-key", "replayed")] == duplicates - 1  # every duplicate replayed


@asynccontextmanager
async def shop_on(redis: RedisServer, prefix: str, waiters_expected: int) -> AsyncIterator[Shop]:
    """A shop on its own store, counting its waiters; the store closed afterwards."""
    store = RedisKeyStore.from_url(redis.url, prefix=prefix)
    shop = Shop(store, waiters_expected=waiters_expected)
    shop.count_waiters()
    try:
        yield shop
    finally:
        await store.aclose()


async def test_a_thousand_duplicates_and_a_hundred_other_keys_in_process(
    private_redis: RedisServer, observer: aioredis.Redis
) -> None:
    async with shop_on(private_redis, "load:", 999) as shop, Client(shop.server) as client:

        async def call(order: str, key: str) -> Any:
            return await client.call_tool("charge", {"order": order}, meta=meta(key))

        answers, peak = await burst(call, shop, 1000, 100, observer)
        after = await others(observer)
    check(answers, shop, 1000, 100)
    print(f"\nRedis connections, most seen: {peak}; after: {after}")
    assert peak <= STORE_CONNECTIONS
    assert after <= STORE_CONNECTIONS


async def test_two_hundred_duplicates_over_streamable_http(
    private_redis: RedisServer, observer: aioredis.Redis
) -> None:
    async with (
        shop_on(private_redis, "http:", 199) as shop,
        serve_http(shop.server.streamable_http_app()) as base,
        Client(f"{base}/mcp") as first,
        Client(f"{base}/mcp") as second,
    ):
        clients = [first, second]
        sent = 0

        async def call(order: str, key: str) -> Any:
            nonlocal sent
            sent += 1
            client = clients[sent % 2]
            return await client.call_tool("charge", {"order": order}, meta=meta(key))

        answers, peak = await burst(call, shop, 200, 20, observer)
    check(answers, shop, 200, 20)
    print(f"\nRedis connections over HTTP, most seen: {peak}")
    assert peak <= STORE_CONNECTIONS


async def test_after_a_restart_every_call_succeeds(private_redis: RedisServer) -> None:
    """SIGKILL, restart on the same port with the AOF: calls made once Redis answers PING again
    succeed, 32 at a time, twice in a row (no stale connection fails one); calls made while it
    is down are refused with STORE_UNAVAILABLE and the tool does not run."""
    store = RedisKeyStore.from_url(private_redis.url, prefix="restart:")
    shop = Shop(store)
    shop.gate.set()

    async def wave(client: Client, name: str, count: int = 32) -> list[Any]:
        answers: list[Any] = []

        async def one(n: int) -> None:
            try:
                answers.append(
                    await client.call_tool(
                        "charge", {"order": f"{name}-{n}"}, meta=meta(f"{name}-{n}")
                    )
                )
            except MCPError as exc:
                answers.append(exc)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for n in range(count):
                    tg.start_soon(one, n)
        return answers

    try:
        async with Client(shop.server) as client:
            before = await wave(client, "before")  # every connection open and used
            assert all(marker(a)["status"] == "executed" for a in before)
            await anyio.to_thread.run_sync(private_redis.kill)
            down = await wave(client, "down")
            assert {a.code for a in down if isinstance(a, MCPError)} == {wire.STORE_UNAVAILABLE}
            assert len(down) == 32 and all(isinstance(a, MCPError) for a in down)
            assert not any(order.startswith("down") for order in shop.executions)
            await anyio.to_thread.run_sync(private_redis.start)  # returns once PING answers
            for round_no in range(2):
                after = await wave(client, f"after{round_no}")
                failed = [a for a in after if isinstance(a, MCPError)]
                assert not failed, f"{len(failed)} failed: {failed[:3]}"
                assert all(marker(a)["status"] == "executed" for a in after)
            again = await wave(client, "before")  # kept by the AOF: replayed, not re-run
            assert all(marker(a)["status"] == "replayed" for a in again)
    finally:
        await store.aclose()
    assert all(count == 1 for count in shop.executions.values())
