"""Shared helpers for the server-side tests: tools with countable effects, stores, HTTP serving.

Synchronisation is by events (in-process) or by MCP calls to helper tools (other processes);
nothing sleeps to let things settle.
"""

from __future__ import annotations

import inspect
import socket
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
import uvicorn
from fake_clock import FakeClock
from mcp import MCPError
from mcp_types import CallToolResult
from starlette.types import ASGIApp

from idempotency import (
    CallScope,
    KeyStore,
    MemoryKeyStore,
    RecordState,
    RedisKeyStore,
    SQLiteKeyStore,
    StoreUnavailable,
    default_scope,
    fingerprint,
    store_key,
    wire,
)

#: Generous bound for anything that should happen "soon" on a loaded 2-core machine.
SOON = 30.0

R = TypeVar("R")


def meta(key: object, **extra: Any) -> dict[str, Any]:
    return {wire.KEY_META: key, **extra}


def marker(result: CallToolResult) -> dict[str, Any]:
    """The `io.github.mcp-once/idempotency` entry of a result's `_meta`."""
    found = (result.meta or {}).get(wire.IDEMPOTENCY_META)
    assert isinstance(found, dict), f"no idempotency marker in {result.meta!r}"
    return found


def body(result: CallToolResult) -> dict[str, Any]:
    """What the tool produced: content, structuredContent and isError, without any `_meta`."""
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    dumped.pop("_meta", None)
    dumped.pop("resultType", None)
    return dumped


def answer(result: CallToolResult) -> dict[str, Any]:
    """The whole answer as a client compares it: body plus marker, apart from `status`."""
    mark = dict(marker(result))
    mark.pop("status")
    return {"body": body(result), "marker": mark}


def record_key(server: str, tool: str, key: str, principal: str | None = None) -> str:
    """The hashed store key the guard uses under the default scope (to reach around it)."""
    scope = default_scope(CallScope(server, tool, principal, None, None))
    return store_key(scope, tool, key)


def call_fingerprint(tool: str, arguments: Mapping[str, Any] | None) -> str:
    return fingerprint(tool, arguments)


@dataclass
class Effects:
    """A tool body's observable side: how often the effect happened, and events around it."""

    count: int = 0
    started: anyio.Event = field(default_factory=anyio.Event)
    gate: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)
    cancelled: int = 0

    def open(self) -> None:
        self.gate.set()

    async def charge(self, order: str, cents: int, *, gated: bool) -> str:
        """The effect tool's body: announce the start, hold at the gate (when `gated`), then
        count the effect once."""
        self.started.set()
        try:
            if gated:
                await self.gate.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        self.count += 1
        self.done.set()
        return f"charged {cents} for {order} (execution {self.count})"


async def burst(call: Callable[[], Awaitable[R]], effects: Effects, n: int = 50) -> list[R]:
    """`n` concurrent `call`s of the gated effect tool; the gate opens once the tool started."""
    results: list[R] = []
    async with anyio.create_task_group() as tg:

        async def one() -> None:
            results.append(await call())

        for _ in range(n):
            tg.start_soon(one)
        await effects.started.wait()
        effects.open()
    return results


async def lose_the_lease(
    call: Callable[[], Awaitable[object]],
    effects: Effects,
    store: KeyStore,
    clock: FakeClock,
    *,
    key: str,
    args: Mapping[str, Any],
    takeover: bool,
) -> list[MCPError]:
    """Run `call` (a `charge` of `args` under `key`, on server "shop") and, once its tool started,
    let the store's clock run past the lease while another worker claims the record (taking it
    over, or finding it UNKNOWN). Returns the errors `call` raised."""
    errors: list[MCPError] = []
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            try:
                await call()
            except MCPError as exc:
                errors.append(exc)

        tg.start_soon(run)
        await effects.started.wait()
        clock.now += 10
        other = await store.claim(
            record_key("shop", "charge", key),
            call_fingerprint("charge", args),
            lease=60,
            takeover=takeover,
        )
        assert other.status.value == ("claimed" if takeover else "unknown")
    return errors


@asynccontextmanager
async def serve_http(app: ASGIApp) -> AsyncIterator[str]:
    """Serve `app` with uvicorn on 127.0.0.1 (a free port) in this event loop; yields the base
    URL. The socket listens before uvicorn starts, so clients may connect at once: the kernel
    queues them until uvicorn accepts."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:

        async def serve() -> None:
            await server.serve(sockets=[sock])

        tg.start_soon(serve)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
    sock.close()


def effect_server(
    store: Any, effects: Effects, *, name: str = "shop", gated: bool = True, **options: Any
) -> Any:
    """An `MCPServer` with one guarded tool, `charge`, whose effect is `effects.count += 1`.

    With `gated`, the tool holds after `started` until the test opens `effects.gate`.
    """
    from mcp.server.mcpserver import MCPServer

    from idempotency import idempotent

    server = MCPServer(name)

    @server.tool()
    @idempotent(store, **options)
    async def charge(order: str, cents: int) -> str:
        return await effects.charge(order, cents, gated=gated)

    return server


class DownStore(MemoryKeyStore):
    """Every claim fails as an unreachable store's does."""

    async def claim(
        self,
        key: str,
        fingerprint: str,
        *,
        lease: float,
        takeover: bool,
        tool: str | None = None,
        resend_only: bool = False,
    ) -> Any:
        raise StoreUnavailable("connection refused")


async def caller_gave_up(store: KeyStore) -> int:
    """What the guard records when a caller gives up on an answer after it was stored (rule 15:
    `Guard._answered` calls `abandon`): every completed record is marked not delivered, so the
    caller's next identical keyless call is its re-send and replays. Returns how many.

    For tests of what a derived key merges (caller, window, rounds); the give-up signals
    themselves (a client's cancel, a closed stream, a dead connection) are proven end to end in
    `test_resends.py`."""
    marked = 0
    for record in await store.list_records(state=RecordState.COMPLETED, limit=10_000):
        marked += await store.abandon(record.key, record.fence)
    return marked


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[KeyStore]:
    """A fresh key store of each kind; tests taking it run once per backend (imported by the
    conftest of each folder that uses it)."""
    made: KeyStore
    if request.param == "memory":
        made = MemoryKeyStore()
    elif request.param == "sqlite":
        made = SQLiteKeyStore(tmp_path / "keys.db")
    else:
        made = RedisKeyStore.from_url(
            request.getfixturevalue("redis_url"), prefix=request.getfixturevalue("redis_namespace")
        )
    try:
        yield made
    finally:
        await made.aclose()


class Watched:
    """A key store proxy that counts renewals and can make them fail; everything else passes
    through to the real store."""

    def __init__(self, inner: Any, *, renewals_wanted: int = 0) -> None:
        self.inner = inner
        self.renewals = 0
        self.renewals_wanted = renewals_wanted
        self.renewed_enough = anyio.Event()
        self.fail_renewals = False

    async def claim(
        self, key: str, fingerprint: str, *, lease: float, takeover: bool, tool: str | None = None
    ) -> Any:
        return await self.inner.claim(key, fingerprint, lease=lease, takeover=takeover, tool=tool)

    async def renew(self, key: str, token: str, *, lease: float) -> bool:
        if self.fail_renewals:
            raise StoreUnavailable("renewal refused by the test")
        renewed = bool(await self.inner.renew(key, token, lease=lease))
        self.renewals += 1
        if self.renewals >= self.renewals_wanted:
            self.renewed_enough.set()
        return renewed

    async def complete(self, key: str, token: str, result: bytes, *, retention: float) -> bool:
        return bool(await self.inner.complete(key, token, result, retention=retention))

    async def release(self, key: str, token: str) -> bool:
        return bool(await self.inner.release(key, token))

    async def wait(self, key: str, *, timeout: float) -> Any:
        return await self.inner.wait(key, timeout=timeout)

    async def get(self, key: str) -> Any:
        return await self.inner.get(key)

    async def list_records(
        self, *, state: Any = None, tool: str | None = None, limit: int = 100
    ) -> Any:
        return await self.inner.list_records(state=state, tool=tool, limit=limit)

    async def settle(self, key: str, *, result: bytes | None, retention: float) -> bool:
        return bool(await self.inner.settle(key, result=result, retention=retention))

    async def purge_expired(self) -> int:
        return int(await self.inner.purge_expired())

    async def aclose(self) -> None:
        await self.inner.aclose()


class Outage(Watched):
    """A key store proxy that cuts the store off at the first `complete` — the instant between
    the tool's return and the write of its record — and counts what fails while it is cut off.

    `cut` and `mend` make the store unreachable and reachable again: for a real Redis, kill the
    server and start it again (AOF keeps the claim); by default the proxy itself refuses every
    call with `StoreUnavailable` meanwhile. The test decides when to mend, from the failures it
    has seen (`until`): no sleeping.
    """

    def __init__(
        self,
        inner: Any,
        *,
        cut: Callable[[], Awaitable[None]] | None = None,
        mend: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(inner)
        self.failures: Counter[str] = Counter()
        self.began = anyio.Event()
        self.refusing = False
        self._cut = cut
        self._mend = mend
        self._changed = anyio.Event()

    async def begin(self) -> None:
        if self._cut is not None:
            await self._cut()
        else:
            self.refusing = True
        self.began.set()

    async def end(self) -> None:
        if self._mend is not None:
            await self._mend()
        self.refusing = False

    async def until(self, **wanted: int) -> None:
        """Until at least `wanted[op]` calls of each `op` failed during the outage."""
        while any(self.failures[op] < n for op, n in wanted.items()):
            await self._changed.wait()

    async def _through(self, op: str, call: Awaitable[Any]) -> Any:
        from idempotency import StoreUnavailable

        try:
            if self.refusing:
                raise StoreUnavailable(f"{op} refused: the store is cut off by the test")
            return await call
        except StoreUnavailable:
            self.failures[op] += 1
            self._changed.set()
            self._changed = anyio.Event()
            raise
        finally:
            if inspect.iscoroutine(call):
                call.close()  # not awaited when refused

    async def claim(
        self, key: str, fingerprint: str, *, lease: float, takeover: bool, tool: str | None = None
    ) -> Any:
        call = super().claim(key, fingerprint, lease=lease, takeover=takeover, tool=tool)
        return await self._through("claim", call)

    async def renew(self, key: str, token: str, *, lease: float) -> bool:
        return bool(await self._through("renew", super().renew(key, token, lease=lease)))

    async def complete(self, key: str, token: str, result: bytes, *, retention: float) -> bool:
        if not self.began.is_set():
            await self.begin()
        call = super().complete(key, token, result, retention=retention)
        return bool(await self._through("complete", call))

    async def get(self, key: str) -> Any:
        return await self._through("get", super().get(key))

    async def wait(self, key: str, *, timeout: float) -> Any:
        return await self._through("wait", super().wait(key, timeout=timeout))
