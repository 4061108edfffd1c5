"""The guard names the tool in the record it claims, so `mcp-once keys list` can show and filter by
it: for a key the client sent and for one the server derived, while the tool runs and after, on
every backend (`store` fixture). Never the arguments: the record holds them only as the
fingerprint it always held."""

from __future__ import annotations

import functools
import json
from typing import Any

import anyio
import pytest
from mcp.client import Client
from server_kit import SOON, Effects, effect_server, marker, meta, record_key

from idempotency import ClaimOutcome, KeyStore, MemoryKeyStore, RecordState

pytestmark = pytest.mark.anyio

ARGS = {"order": "o-secret-order", "cents": 4242}


async def test_a_guarded_call_records_its_tool_name_and_no_argument(store: KeyStore) -> None:
    effects = Effects()
    server = effect_server(store, effects)
    name = record_key("shop", "charge", "k-1")
    with anyio.fail_after(SOON):
        async with Client(server, mode="legacy") as client, anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(client.call_tool, "charge", ARGS, meta=meta("k-1")))
            await effects.started.wait()
            try:
                running = await store.get(name)
            finally:
                effects.open()  # a failed assertion must not leave the tool held
            assert running is not None and running.state is RecordState.IN_PROGRESS
            assert running.tool == "charge"  # named at claim, before the tool ran
        async with Client(server, mode="legacy") as client:
            keyless = await client.call_tool("charge", {"order": "o-2", "cents": 1})
    completed = await store.get(name)
    assert completed is not None and completed.state is RecordState.COMPLETED
    assert completed.tool == "charge"
    derived = marker(keyless)
    assert derived["keySource"] == "derived"
    listed = await store.list_records(tool="charge")
    assert {r.key for r in listed} == {name, record_key("shop", "charge", derived["key"])}
    assert effects.count == 2
    for record in listed:
        stored = json.dumps([record.tool, record.fingerprint, record.key])
        assert "o-secret-order" not in stored and "4242" not in stored


class StoreOfAnEarlierRelease:
    """A `KeyStore` of one's own, written before records named their tool: its `claim` takes
    no `tool=` (everything else is the memory store's)."""

    def __init__(self) -> None:
        self.inner = MemoryKeyStore()

    async def claim(
        self, key: str, fingerprint: str, *, lease: float, takeover: bool
    ) -> ClaimOutcome:
        return await self.inner.claim(key, fingerprint, lease=lease, takeover=takeover)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_store_whose_claim_takes_no_tool_name_still_guards() -> None:
    """Such a store keeps working after the upgrade (one effect, the retry replayed), its records
    naming no tool, instead of every call failing with -32013."""
    store = StoreOfAnEarlierRelease()
    effects = Effects()
    server = effect_server(store, effects)  # type: ignore[arg-type]
    effects.open()
    with anyio.fail_after(SOON):
        async with Client(server, mode="legacy") as client:
            first = await client.call_tool("charge", ARGS, meta=meta("k-old"))
            again = await client.call_tool("charge", ARGS, meta=meta("k-old"))
    assert marker(first)["status"] == "executed" and marker(again)["status"] == "replayed"
    assert effects.count == 1
    record = await store.inner.get(record_key("shop", "charge", "k-old"))
    assert record is not None and record.tool is None
