"""Rule 25's alert in the log: a record turned UNKNOWN leaves exactly one WARNING line under the
`idempotency` logger (event `in_doubt`), from the call that turned it, naming the record (its
short digest), the tool and the server, never the key, an argument or a result. A retry that
finds it UNKNOWN already adds no line of this kind (only the one every -32012 answer has,
event `unknown`). (The gauge `mcp_once_records_in_doubt` is shown on real processes:
tests/server/test_processes.py.)"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from fake_clock import FakeClock
from mcp import MCPError
from mcp.client import Client
from server_kit import SOON, Effects, call_fingerprint, effect_server, meta, record_key

from idempotency import ClaimStatus, MemoryKeyStore, OutcomeLost, wire
from idempotency._guard import in_doubt_gauge
from idempotency._guard.telemetry import record_name

pytestmark = pytest.mark.anyio

ARGS: dict[str, Any] = {"order": "order-5521", "cents": 4242}
KEY = "client-key-7f3a"


async def the_one_line(caplog: pytest.LogCaptureFixture, server: Any, tool: str) -> str:
    """Call `tool` twice with the same key (each answered -32012) with logging at WARNING; the
    one in-doubt line they left (beside one line per answer), checked to name neither the key
    nor an argument."""
    caplog.set_level(logging.WARNING, logger="idempotency")
    with anyio.fail_after(SOON):
        async with Client(server) as client:
            for _ in range(2):
                with pytest.raises(MCPError) as unknown:
                    await client.call_tool(tool, ARGS, meta=meta(KEY))
                assert unknown.value.code == wire.OUTCOME_UNKNOWN

    def lines(event: str) -> list[str]:
        return [
            r.message
            for r in caplog.records
            if r.name == "idempotency"
            and r.levelno == logging.WARNING
            and getattr(r, "mcp_once_event", None) == event
        ]

    [line] = lines("in_doubt")
    assert len(lines("unknown")) == 2  # one per answer
    for secret in (KEY, ARGS["order"], str(ARGS["cents"])):
        assert secret not in line
    return line


async def test_a_record_whose_worker_died_turns_unknown_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker claimed the record and died (its claim is made here, as the dead worker's was);
    its lease ran out. The first retry turns the record UNKNOWN and says so once; the second
    finds it UNKNOWN and says nothing more of the kind."""
    clock = FakeClock()
    store = MemoryKeyStore(clock=clock)
    server = effect_server(store, Effects(), name="shop", gated=False)
    stored = record_key("shop", "charge", KEY)
    dead = await store.claim(stored, call_fingerprint("charge", ARGS), lease=30, takeover=False)
    assert dead.status is ClaimStatus.CLAIMED
    clock.advance(31)
    said = await the_one_line(caplog, server, "charge")
    assert record_name(stored) in said and "'charge'" in said and "'shop'" in said
    assert "lease ran out" in said and stored not in said


async def test_a_call_given_up_as_unknown_by_its_holder_leaves_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The other way a record turns UNKNOWN: its own holder gives the call up (`OutcomeLost`)."""
    from mcp.server.mcpserver import MCPServer

    from idempotency import idempotent

    store = MemoryKeyStore()
    server = MCPServer("relay")

    @server.tool()
    @idempotent(store)
    async def forward(order: str, cents: int) -> str:
        raise OutcomeLost("the upstream connection broke after the request was written")

    said = await the_one_line(caplog, server, "forward")
    stored = record_key("relay", "forward", KEY)
    assert record_name(stored) in said and "'forward'" in said and "'relay'" in said
    assert stored not in said


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_census_counts_again_when_a_collection_asks_from_another_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gauge's count (`in_doubt_gauge`): a census task counts the store's records in doubt
    when a metrics collection, on the exporter's thread, asked for it; under asyncio and trio.
    (End to end, with an SDK and a killed worker: tests/server/test_processes.py.)"""
    monkeypatch.setattr(in_doubt_gauge, "CENSUS_INTERVAL", 0.0)
    clock = FakeClock()
    store = MemoryKeyStore(clock=clock)
    census = in_doubt_gauge._Census(store)
    with anyio.fail_after(SOON):
        async with anyio.create_task_group() as tg:
            tg.start_soon(census.run)
            while census.value is None:
                await anyio.lowlevel.checkpoint()
            assert census.value == 0
            await store.claim("k", "fp", lease=30, takeover=False)
            clock.advance(31)
            lost = await store.claim("k", "fp", lease=30, takeover=False)
            assert lost.status is ClaimStatus.UNKNOWN
            await anyio.to_thread.run_sync(census.ask)
            while census.value != 1:
                await anyio.lowlevel.checkpoint()
            tg.cancel_scope.cancel()


async def test_no_census_runs_while_no_meter_provider_is_set() -> None:
    """Counting reads the store: with no meter provider (the default), nothing is counted."""
    store = MemoryKeyStore()
    in_doubt_gauge.watch(store)
    assert id(store) not in in_doubt_gauge._censuses
