"""The guard names the tool in the record it claims, so `mcp-once keys list` can show and filter by
it: for a key the client sent and for one the server derived, while the tool runs and after, on
every backend (`store` fixture). Never the arguments: the record holds them only as the
fingerprint it always held."""

from __future__ import annotations

import functools
import json

import anyio
import pytest
from mcp.client import Client
from server_kit import SOON, Effects, effect_server, marker, meta, record_key

from idempotency import KeyStore, RecordState

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
