"""Rule 4 and rule 10: a running tool keeps its claim by renewing it; a lost claim stops the
tool; a tool that runs too long is stopped; a call cancelled before its tool started gives the
claim back. (Client cancellations during the run are covered by the lost-ack tests.)"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import MCPError
from mcp.client import Client
from server_kit import (
    SOON,
    Effects,
    Watched,
    answer,
    call_fingerprint,
    effect_server,
    marker,
    meta,
    record_key,
)

from idempotency import KeyStore, MemoryKeyStore, RecordState, wire

pytestmark = pytest.mark.anyio

ARGS: dict[str, Any] = {"order": "long", "cents": 9}
LEASE = 0.3  # renewed every 0.1 s


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_750_000_000.0

    def __call__(self) -> float:
        return self.now


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
        async with Client(server) as client, anyio.create_task_group() as tg:
            errors: list[MCPError] = []

            async def call() -> None:
                try:
                    await client.call_tool("charge", ARGS, meta=meta("fragile"))
                except MCPError as exc:
                    errors.append(exc)

            tg.start_soon(call)
            await effects.started.wait()
            # The store's clock says the lease ran out; another worker claims the record.
            clock.now += 10
            other = await store.claim(
                record_key("shop", "charge", "fragile"),
                call_fingerprint("charge", ARGS),
                lease=60,
                takeover=other_takes_over,
            )
            assert other.status.value == ("claimed" if other_takes_over else "unknown")
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

    async def claim(self, key: str, fingerprint: str, *, lease: float, takeover: bool) -> Any:
        outcome = await super().claim(key, fingerprint, lease=lease, takeover=takeover)
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
