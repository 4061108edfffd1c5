"""Rule 4 and rule 10: a running tool keeps its claim by renewing it; a lost claim stops the
tool; a tool that runs too long is stopped; a call cancelled before its tool started gives the
claim back. (Client cancellations during the run are covered by the lost-ack tests.)"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from fake_clock import FakeClock
from mcp import MCPError
from mcp.client import Client
from server_kit import (
    SOON,
    Effects,
    Watched,
    answer,
    effect_server,
    lose_the_lease,
    marker,
    meta,
    record_key,
)

from idempotency import KeyStore, MemoryKeyStore, RecordState, wire

pytestmark = pytest.mark.anyio

ARGS: dict[str, Any] = {"order": "long", "cents": 9}
LEASE = 0.3  # renewed every 0.1 s


async def test_renewal_keeps_a_slow_tools_claim(store: KeyStore) -> None:
    """The tool runs for more than its lease (four renewals = 0.4 s > 0.3 s). A duplicate that
    arrives then finds the claim alive (no takeover, no UNKNOWN), waits, and replays."""
    watched = Watched(store, renewals_wanted=4)
    effects = Effects()
    server = effect_server(watched, effects, lease=LEASE)
    with anyio.fail_after(SOON):
        async with Client(server) as client:
            results: list[Any] = []
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    results.append(await client.call_tool("charge", ARGS, meta=meta("slow")))

                tg.start_soon(call)
                await effects.started.wait()
                await watched.renewed_enough.wait()
                tg.start_soon(call)  # the duplicate: must wait, not take over
                record = await watched.get(record_key("shop", "charge", "slow"))
                assert record is not None and record.state is RecordState.IN_PROGRESS
                effects.open()
    assert effects.count == 1
    assert effects.cancelled == 0
    assert sorted(marker(r)["status"] for r in results) == ["executed", "replayed"]
    assert answer(results[0]) == answer(results[1])
    assert marker(results[0])["attempts"] == 1


@pytest.mark.parametrize(
    ("other_takes_over", "code"),
    [(False, wire.OUTCOME_UNKNOWN), (True, wire.IN_PROGRESS)],
    ids=["declared-lost", "taken-over"],
)
async def test_lost_lease_cancels_the_tool(other_takes_over: bool, code: int) -> None:
    clock = FakeClock()
    store = MemoryKeyStore(clock=clock)
    effects = Effects()
    server = effect_server(store, effects, lease=LEASE)
    with anyio.fail_after(SOON):
        async with Client(server) as client:
            errors = await lose_the_lease(
                lambda: client.call_tool("charge", ARGS, meta=meta("fragile")),
                effects,
                store,
                clock,
                key="fragile",
                args=ARGS,
                takeover=other_takes_over,
            )
    assert effects.cancelled == 1  # the next renewal found the token gone and stopped the tool
    assert effects.count == 0
    assert [e.code for e in errors] == [code]
    assert errors[0].error.data["key"] == "fragile"


async def test_unreachable_store_during_the_run_stops_the_tool_when_the_lease_runs_out() -> None:
    watched = Watched(MemoryKeyStore())
    effects = Effects()
    server = effect_server(watched, effects, lease=LEASE)
    with anyio.fail_after(SOON):
        async with Client(server) as client:
            watched.fail_renewals = True
            with pytest.raises(MCPError) as caught:
                await client.call_tool("charge", ARGS, meta=meta("cut-off"))
    assert effects.cancelled == 1
    assert effects.count == 0
    assert caught.value.code == wire.OUTCOME_UNKNOWN


@pytest.mark.parametrize(
    ("options", "code"),
    [({}, wire.OUTCOME_UNKNOWN), ({"naturally_idempotent": True}, wire.IN_PROGRESS)],
    ids=["default", "naturally-idempotent"],
)
async def test_max_run_time_stops_the_tool(options: dict[str, Any], code: int) -> None:
    store = MemoryKeyStore()
    effects = Effects()
    server = effect_server(store, effects, max_run_time=0.2, **options)
    with anyio.fail_after(SOON):
        async with Client(server) as client:
            with pytest.raises(MCPError) as caught:
                await client.call_tool("charge", ARGS, meta=meta("endless"))
    assert effects.cancelled == 1
    assert caught.value.code == code
    assert "maximum run time" in caught.value.message or code == wire.IN_PROGRESS
    record = await store.get(record_key("shop", "charge", "endless"))
    # Left for lease expiry to settle: the effect may have been partial.
    assert record is not None and record.state is RecordState.IN_PROGRESS


class HeldClaim(MemoryKeyStore):
    """Claims succeed in the store, but the answer is held until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.claimed = anyio.Event()
        self.proceed = anyio.Event()

    async def claim(
        self, key: str, fingerprint: str, *, lease: float, takeover: bool, tool: str | None = None
    ) -> Any:
        outcome = await super().claim(key, fingerprint, lease=lease, takeover=takeover, tool=tool)
        self.claimed.set()
        await self.proceed.wait()
        return outcome


async def test_call_cancelled_before_its_tool_started_gives_the_claim_back() -> None:
    """In-process direct dispatch: the caller's cancellation reaches the handler at once."""
    store = HeldClaim()
    effects = Effects()
    server = effect_server(store, effects, gated=False)
    with anyio.fail_after(SOON):
        async with Client(server) as client:
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    await client.call_tool("charge", ARGS, meta=meta("early"))

                tg.start_soon(call)
                await store.claimed.wait()
                tg.cancel_scope.cancel()
                store.proceed.set()
            assert not effects.started.is_set()
            assert await store.get(record_key("shop", "charge", "early")) is None
            retry = await client.call_tool("charge", ARGS, meta=meta("early"))
    assert effects.count == 1
    assert marker(retry)["status"] == "executed"


class RenewalLog(MemoryKeyStore):
    """Counts renewals per record; renewals of records in `lose` find their token gone."""

    def __init__(self) -> None:
        super().__init__()
        self.renewed: dict[str, int] = {}
        self.lose: set[str] = set()
        self._tick = anyio.Event()

    async def renew(self, key: str, token: str, *, lease: float) -> bool:
        renewed = False if key in self.lose else await super().renew(key, token, lease=lease)
        self.renewed[key] = self.renewed.get(key, 0) + 1
        self._tick.set()
        self._tick = anyio.Event()
        return renewed

    async def until(self, wanted: dict[str, int]) -> None:
        """Until every record in `wanted` was renewed at least that many times."""
        while any(self.renewed.get(k, 0) < n for k, n in wanted.items()):
            await self._tick.wait()


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_concurrent_claims_share_one_renewer_and_lose_their_leases_alone(
    anyio_backend: str,
) -> None:
    """Three slow tools run past their lease on one event loop: one renewal service keeps all
    three claims; one claim's token vanishing cancels that tool only; the service stops once
    nothing runs."""
    from idempotency._guard.lease import _renewal_service

    store = RenewalLog()
    effects = Effects()
    server = effect_server(store, effects, lease=LEASE)
    keys = {name: record_key("shop", "charge", f"k-{name}") for name in "abc"}
    results: dict[str, Any] = {}
    with anyio.fail_after(SOON):
        async with Client(server) as client, anyio.create_task_group() as tg:

            async def call(name: str) -> None:
                try:
                    results[name] = await client.call_tool(
                        "charge", {"order": name, "cents": 1}, meta=meta(f"k-{name}")
                    )
                except MCPError as exc:
                    results[name] = exc

            for name in "abc":
                tg.start_soon(call, name)
            await store.until({k: 4 for k in keys.values()})  # 0.4 s > the 0.3 s lease
            service = _renewal_service()
            assert service is not None
            assert service.claims == 3  # one service renews all three runs
            store.lose.add(keys["b"])
            lost_at = dict(store.renewed)
            await store.until({keys["b"]: lost_at[keys["b"]] + 1})
            with anyio.fail_after(SOON):
                while "b" not in results:
                    await store.until({keys["a"]: store.renewed[keys["a"]] + 1})
            # The others are still renewed (their claims alive) after b was cancelled.
            await store.until({keys[n]: store.renewed[keys[n]] + 2 for n in "ac"})
            assert service.claims == 2
            effects.open()
        await service.stopped.wait()
        assert _renewal_service() is None
    assert effects.cancelled == 1
    assert effects.count == 2
    lost = results["b"]
    assert isinstance(lost, MCPError) and lost.code == wire.OUTCOME_UNKNOWN
    assert [marker(results[n])["status"] for n in "ac"] == ["executed", "executed"]
    for name in "ac":
        record = await store.get(keys[name])
        assert record is not None and record.state is RecordState.COMPLETED


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_claim_due_sooner_wakes_the_sleeping_renewer(anyio_backend: str) -> None:
    """The service sleeps until a long lease's first renewal (20 s away); a claim with a short
    lease that starts meanwhile must be renewed on its own schedule, not 20 s later."""
    from idempotency._guard.lease import _renewal_service

    store = RenewalLog()
    slow_effects, quick_effects = Effects(), Effects()
    # max_run_time: should the renewer oversleep, the gated tools still end and the test fails.
    slow = effect_server(store, slow_effects, name="slow", lease=60.0, max_run_time=SOON)
    quick = effect_server(store, quick_effects, name="quick", lease=LEASE, max_run_time=SOON)
    with anyio.fail_after(SOON):
        async with (
            Client(slow) as slow_client,
            Client(quick) as quick_client,
            anyio.create_task_group() as tg,
        ):

            async def call(client: Client, key: str) -> None:
                result = await client.call_tool("charge", ARGS, meta=meta(key))
                assert marker(result)["status"] == "executed"

            tg.start_soon(call, slow_client, "long")
            await slow_effects.started.wait()
            tg.start_soon(call, quick_client, "short")
            with anyio.fail_after(10):  # far below the long lease's 20 s
                await store.until({record_key("quick", "charge", "short"): 4})
            service = _renewal_service()
            assert service is not None and service.claims == 2
            assert store.renewed.get(record_key("slow", "charge", "long"), 0) == 0
            slow_effects.open()
            quick_effects.open()
    assert slow_effects.count == quick_effects.count == 1
    assert slow_effects.cancelled == quick_effects.cancelled == 0
