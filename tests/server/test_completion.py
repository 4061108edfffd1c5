"""Rule 11: a finished result is not given up while its claim's lease holds.

The store goes away exactly between the tool's return and the write of its record (the proxy
cuts it off at the first `complete`): a real Redis (AOF) is killed and started again, the other
backends are cut off by the proxy. The outage ends when the test has seen the failures it wants
(completion tries, a failed renewal), never after a sleep. Shorter than the lease: the record
ends COMPLETED with the tool's own result, the caller gets it, a retry replays it, the tool ran
once, nothing is UNKNOWN. Longer than the lease (here: until the caller has its answer, which
comes when the guard gives up, two leases after the tool returned): the guard says so in the log
and in the result `_meta` (`stored: false`), and the record turns UNKNOWN at the next retry — or,
for a tool that may run twice, is taken over.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from mcp import MCPError
from mcp.client import Client
from redis_server import RedisServer, redis_server_binary
from server_kit import (
    SOON,
    Effects,
    Outage,
    Watched,
    answer,
    body,
    effect_server,
    marker,
    meta,
    record_key,
)

from idempotency import KeyStore, MemoryKeyStore, RecordState, RedisKeyStore, SQLiteKeyStore, wire

pytestmark = pytest.mark.anyio

ARGS: dict[str, Any] = {"order": "o-11", "cents": 1100}
#: Renewed every second; the outage that must be survived lasts about one renewal.
LEASE = 3.0
#: For the outage that outlasts the lease: short, so that the test does not wait long.
SHORT_LEASE = 1.0


@asynccontextmanager
async def cut_off_store(kind: str, tmp_path: Path) -> AsyncIterator[Outage]:
    """A store the test can cut off: a private Redis it kills, or a proxy that refuses."""
    if kind == "redis":
        if redis_server_binary() is None:
            pytest.skip("redis-server is not on PATH")
        with RedisServer(appendonly=True) as server:
            store = RedisKeyStore.from_url(server.url)

            async def kill() -> None:
                await anyio.to_thread.run_sync(server.kill)

            async def start() -> None:
                await anyio.to_thread.run_sync(server.start)

            try:
                yield Outage(store, cut=kill, mend=start)
            finally:
                await store.aclose()
        return
    inner: KeyStore = (
        SQLiteKeyStore(tmp_path / "keys.sqlite3") if kind == "sqlite" else MemoryKeyStore()
    )
    try:
        yield Outage(inner)
    finally:
        await inner.aclose()


BACKENDS = [pytest.param("redis", marks=pytest.mark.redis), "sqlite", "memory"]


@pytest.mark.parametrize("kind", BACKENDS)
async def test_an_outage_shorter_than_the_lease_loses_nothing(kind: str, tmp_path: Path) -> None:
    """Cut off from the tool's return until a renewal and four completion tries have failed
    (about a second: longer than the old 0.35 s of retries, shorter than the 3 s lease)."""
    effects = Effects()
    async with cut_off_store(kind, tmp_path) as outage:
        server = effect_server(outage, effects, gated=False, lease=LEASE)
        with anyio.fail_after(SOON):
            async with Client(server) as client, anyio.create_task_group() as tg:

                async def mend_when_seen() -> None:
                    await outage.until(renew=1, complete=4)
                    await outage.end()

                tg.start_soon(mend_when_seen)
                first = await client.call_tool("charge", ARGS, meta=meta("brief"))
                retry = await client.call_tool("charge", ARGS, meta=meta("brief"))
        record = await outage.get(record_key("shop", "charge", "brief"))
        unknown = await outage.list_records(state=RecordState.UNKNOWN)
    assert outage.failures["complete"] >= 4 and outage.failures["renew"] >= 1
    assert effects.count == 1
    assert marker(first)["status"] == "executed" and "stored" not in marker(first)
    assert body(first)["content"][0]["text"] == "charged 1100 for o-11 (execution 1)"
    assert marker(retry)["status"] == "replayed" and answer(retry) == answer(first)
    assert record is not None and record.state is RecordState.COMPLETED
    assert unknown == []


class Heard(logging.Handler):
    """Sets `event` when the guard logs a message containing `text` (it logs on the event loop)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.event = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


@pytest.mark.parametrize("kind", BACKENDS)
async def test_an_outage_past_the_lease_loses_nothing_if_no_retry_came_first(
    kind: str, tmp_path: Path
) -> None:
    """The lease can no longer be proven (the renewals failed until it ran out), yet nobody
    claimed the key meanwhile: once the store is back the write still lands under the token."""
    heard = Heard("lost its lease")
    logging.getLogger("idempotency").addHandler(heard)
    effects = Effects()
    try:
        async with cut_off_store(kind, tmp_path) as outage:
            server = effect_server(outage, effects, gated=False, lease=SHORT_LEASE)
            with anyio.fail_after(SOON):
                async with Client(server) as client, anyio.create_task_group() as tg:

                    async def mend_when_the_lease_is_gone() -> None:
                        await heard.event.wait()
                        await outage.end()

                    tg.start_soon(mend_when_the_lease_is_gone)
                    first = await client.call_tool("charge", ARGS, meta=meta("past"))
                    retry = await client.call_tool("charge", ARGS, meta=meta("past"))
            record = await outage.get(record_key("shop", "charge", "past"))
    finally:
        logging.getLogger("idempotency").removeHandler(heard)
    assert effects.count == 1
    assert marker(first)["status"] == "executed" and "stored" not in marker(first)
    assert marker(retry)["status"] == "replayed" and answer(retry) == answer(first)
    assert record is not None and record.state is RecordState.COMPLETED


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("may_run_twice", [False, True], ids=["unknown", "taken-over"])
async def test_an_outage_longer_than_the_lease_gives_the_result_up_and_says_so(
    kind: str, may_run_twice: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Cut off from the tool's return until the caller has its answer: the guard kept trying
    for two leases, then gave up. A retry after the store is back finds the record UNKNOWN, or
    takes it over and runs the tool again (`naturally_idempotent`)."""
    effects = Effects()
    async with cut_off_store(kind, tmp_path) as outage:
        server = effect_server(
            outage, effects, gated=False, lease=SHORT_LEASE, naturally_idempotent=may_run_twice
        )
        with anyio.fail_after(SOON):
            async with Client(server) as client:
                first = await client.call_tool("charge", ARGS, meta=meta("long"))
                await outage.end()
                if may_run_twice:
                    retry = await client.call_tool("charge", ARGS, meta=meta("long"))
                else:
                    with pytest.raises(MCPError) as refused:
                        await client.call_tool("charge", ARGS, meta=meta("long"))
        record = await outage.get(record_key("shop", "charge", "long"))
    assert marker(first)["status"] == "executed" and marker(first)["stored"] is False
    assert body(first)["content"][0]["text"] == "charged 1100 for o-11 (execution 1)"
    gave_up = [r.getMessage() for r in caplog.records if "gave up storing" in r.getMessage()]
    assert len(gave_up) == 1 and "within 2 leases" in gave_up[0], gave_up
    assert "the claim's lease ran out meanwhile" in gave_up[0]
    assert record is not None
    if may_run_twice:
        assert effects.count == 2
        assert marker(retry)["status"] == "executed" and marker(retry)["attempts"] == 2
        assert record.state is RecordState.COMPLETED and record.fence == 2
    else:
        assert effects.count == 1
        assert refused.value.code == wire.OUTCOME_UNKNOWN
        assert record.state is RecordState.UNKNOWN and record.fence == 1


class NeverStores(Watched):
    """Every write of a result fails (`hangs`: never answers, as over a black-holed
    connection; else refused at once); renewals as the test sets them."""

    def __init__(self, inner: KeyStore, *, hangs: bool, renewals_fail: bool) -> None:
        super().__init__(inner, renewals_wanted=1)
        self.hangs = hangs
        self.fail_renewals = renewals_fail

    async def complete(self, key: str, token: str, result: bytes, *, retention: float) -> bool:
        if self.hangs:
            await anyio.sleep_forever()
        from idempotency import StoreUnavailable

        raise StoreUnavailable("the write never lands")


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize(
    ("hangs", "renewals_fail"),
    [(False, False), (True, False), (True, True)],
    ids=["refused-renewed", "hangs-renewed", "hangs-lease-lost"],
)
async def test_a_store_that_never_stores_is_given_up_after_two_leases(
    hangs: bool, renewals_fail: bool, anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The bound on storing a result: two leases after the tool returned, not forever. Also for
    a first write that never answers: it runs inside the run's own shielded scope with no timer
    of its own, and the renewal service ends it at the give-up time, whether the lease holds
    meanwhile or is lost (renewals failing: no longer renewed, but its write still watched);
    on asyncio and trio alike."""
    store = NeverStores(MemoryKeyStore(), hangs=hangs, renewals_fail=renewals_fail)
    effects = Effects()
    server = effect_server(store, effects, gated=False, lease=0.6)
    with anyio.fail_after(SOON):
        async with Client(server) as client:
            first = await client.call_tool("charge", ARGS, meta=meta("stuck"))
    assert marker(first)["stored"] is False and effects.count == 1
    if not renewals_fail:
        assert store.renewals >= 1  # the claim was kept meanwhile
    gave_up = [r.getMessage() for r in caplog.records if "gave up storing" in r.getMessage()]
    assert len(gave_up) == 1 and "within 2 leases" in gave_up[0], gave_up
    assert ("lease ran out" in gave_up[0]) is renewals_fail
    assert ("after 1 tries" in gave_up[0]) is hangs
    record = await store.get(record_key("shop", "charge", "stuck"))
    assert record is not None and record.state is RecordState.IN_PROGRESS


class SlowWrite(Watched):
    """Completion stalls until the claim has been renewed `renewals_wanted` times."""

    def __init__(self, inner: KeyStore, renewals_wanted: int) -> None:
        super().__init__(inner, renewals_wanted=renewals_wanted)
        self.writing = anyio.Event()

    async def complete(self, key: str, token: str, result: bytes, *, retention: float) -> bool:
        self.writing.set()
        await self.renewed_enough.wait()
        return await super().complete(key, token, result, retention=retention)


async def test_the_lease_is_renewed_while_the_result_is_written(store: KeyStore) -> None:
    """A write slower than the whole lease (four renewals of a 0.3 s lease): a duplicate arriving
    meanwhile finds the claim alive, waits and replays — no takeover, no UNKNOWN."""
    slow = SlowWrite(store, renewals_wanted=4)
    effects = Effects()
    server = effect_server(slow, effects, gated=False, lease=0.3)
    results: list[Any] = []
    with anyio.fail_after(SOON):
        async with Client(server) as client, anyio.create_task_group() as tg:

            async def call() -> None:
                results.append(await client.call_tool("charge", ARGS, meta=meta("slow-write")))

            tg.start_soon(call)
            await slow.writing.wait()
            await slow.renewed_enough.wait()
            tg.start_soon(call)
    assert effects.count == 1
    assert sorted(marker(r)["status"] for r in results) == ["executed", "replayed"]
    assert answer(results[0]) == answer(results[1])
