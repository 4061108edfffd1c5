"""Rule 19 under FastMCP: `IdempotencyMiddleware(reconcile=...)` answers an in-doubt retry
from the system of record, its value converted as FastMCP converts the tool's return value."""

from __future__ import annotations

import pytest
from fastmcp_kit import charge_server, serving
from server_kit import Effects, body, call_fingerprint, marker, meta, record_key

from idempotency import InDoubt, MemoryKeyStore, Reconciled, history_saying, wire

pytestmark = pytest.mark.anyio

ARGS = {"order": "o-1", "cents": 500}


async def in_doubt(store: MemoryKeyStore, key: str) -> None:
    """A worker that claimed `key` and vanished: its lease already ran out."""
    name = record_key("shop", "charge", key)
    fp = call_fingerprint("charge", ARGS)
    with history_saying(server="shop"):  # as the guard of FastMCP("shop") claims
        lost = await store.claim(name, fp, lease=1e-9, takeover=False, tool="charge")
    assert lost.status.value == "claimed"


@pytest.mark.parametrize("says", ["happened", "not_happened"])
async def test_the_middleware_reconciles_an_in_doubt_retry(says: str) -> None:
    store = MemoryKeyStore()
    effects = Effects()
    asked: list[InDoubt] = []

    def provider(doubt: InDoubt) -> Reconciled:
        asked.append(doubt)
        if says == "happened":
            return Reconciled.happened("charged 500 for o-1 (provider)")
        return Reconciled.not_happened()

    server = charge_server(store, effects, gated=False, reconcile={"charge": provider})
    await in_doubt(store, "k-1")
    async with serving(server, "memory") as connect, connect() as client:
        first = await client.call_tool_mcp("charge", ARGS, meta=meta("k-1"))
        again = await client.call_tool_mcp("charge", ARGS, meta=meta("k-1"))
    assert len(asked) == 1 and asked[0].tool == "charge"
    assert body(again) == body(first)
    if says == "happened":
        assert effects.count == 0
        assert body(first)["content"][0]["text"] == "charged 500 for o-1 (provider)"
        assert marker(first)[wire.MARKER_RECONCILED] is True
    else:
        assert effects.count == 1 and marker(first)["status"] == "executed"


async def test_reconcile_unknown_finds_the_middlewares_reconciler() -> None:
    """What `mcp-once keys reconcile --app` runs, on a FastMCP server: the reconciler and the
    tool's return conversion are found through the middleware."""
    from idempotency import reconcile_unknown

    store = MemoryKeyStore()
    effects = Effects()
    server = charge_server(
        store, effects, gated=False, reconcile=lambda _: Reconciled.happened("found")
    )
    await in_doubt(store, "k-2")
    name = record_key("shop", "charge", "k-2")
    # The lease ran out, but no claim turned it UNKNOWN yet: reconcile_unknown does, as a
    # retry would.
    dry = await reconcile_unknown(server, store, dry_run=True)
    assert [(d.record, d.answer, d.applied) for d in dry] == [(name, "happened", False)]
    done = await reconcile_unknown(server, store)
    assert [(d.record, d.answer, d.applied) for d in done] == [(name, "happened", True)]
    async with serving(server, "memory") as connect, connect() as client:
        replay = await client.call_tool_mcp("charge", ARGS, meta=meta("k-2"))
    assert body(replay)["content"][0]["text"] == "found" and effects.count == 0
