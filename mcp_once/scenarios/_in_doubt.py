"""The in-doubt payment (rule 19): a shop server SIGKILLed after `pay` charged and before its record
completed, restarted on the same key store, and the payment retried with the same key.

Without `reconcile=` the retry gets OUTCOME_UNKNOWN (-32012) and the record stays UNKNOWN for an
operator; with it, `pay`'s reconciler asks the ledger (the payment made under the record, as a
provider is asked by its idempotency key) and the retry gets the payment. Either way the ledger,
which the server cannot fake, holds one payment. Shared by `mcp-once demo` and its tests.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from mcp import MCPError
from mcp.client import Client
from mcp_types import RequestParamsMeta

from idempotency import CallScope, RecordState, default_scope, open_store, store_key, wire
from mcp_once.scenarios._endpoints import ServerProcess, server_command
from mcp_once.scenarios._ledger import Ledger
from orchestrator import streamable_http_transport

__all__ = ["InDoubtRun", "run_in_doubt"]

#: Short, so the restarted server finds the dead one's lease over within its wait.
LEASE = 1.0
#: The first attempt holds this long after its payment: the window the kill strikes in.
HOLD = 30.0
#: Bound on the whole scenario (two server starts, the lease, the retry).
TIMEOUT = 120.0


@dataclass(frozen=True, slots=True)
class InDoubtRun:
    """What one run of the scenario left behind."""

    reconcile: bool
    #: Payments the ledger holds for the call (the server cannot fake it).
    effects: int
    #: Records of the call left UNKNOWN (or IN_PROGRESS with nobody running them).
    unknown_left: int
    #: What the retry got: `reconciled` (the payment, marked reconciled), `replayed`,
    #: `executed`, or the JSON-RPC error code (-32012).
    answer: str

    @property
    def duplicates(self) -> int:
        return max(0, self.effects - 1)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "duplicates": self.duplicates}


async def _pay(url: str, call: dict[str, Any], key: str) -> str:
    meta: RequestParamsMeta = {wire.KEY_META: key}  # type: ignore[typeddict-unknown-key]
    async with Client(streamable_http_transport(url)) as client:
        try:
            result = await client.call_tool("pay", call, meta=meta)
        except MCPError as exc:
            return str(exc.error.code)
    marker = (result.meta or {}).get(wire.IDEMPOTENCY_META) or {}
    if marker.get(wire.MARKER_RECONCILED):
        return "reconciled"
    return str(marker.get("status", "unmarked"))


async def _left(store_url: str, key: str) -> int:
    record = store_key(default_scope(CallScope("chaos-shop", "pay", None, None, None)), "pay", key)
    store = open_store(store_url)
    try:
        found = await store.get(record)
    finally:
        await store.aclose()
    doubtful = (RecordState.UNKNOWN, RecordState.IN_PROGRESS)
    return int(found is not None and found.state in doubtful)


async def run_in_doubt(folder: Path, store_url: str, *, reconcile: bool) -> InDoubtRun:
    """One run: the server killed mid-`pay` after the payment, restarted, the payment retried."""
    ledger = Ledger(folder / f"in-doubt-{'reconcile' if reconcile else 'plain'}.sqlite3")

    def argv(port: int) -> list[str]:
        return server_command(
            "http", ledger, store_url, port=port, lease=LEASE, hold=HOLD, reconcile=reconcile
        )

    server = ServerProcess(argv)
    call_id = f"in-doubt-{uuid.uuid4().hex[:8]}"
    call: dict[str, Any] = {"call_id": call_id, "account": "acct-9", "cents": 500}
    key = f"in-doubt-{uuid.uuid4().hex}"
    with anyio.fail_after(TIMEOUT):
        try:
            await anyio.to_thread.run_sync(server.start)
            async with anyio.create_task_group() as tg:

                async def first() -> None:
                    with contextlib.suppress(Exception):  # its server dies under it
                        await _pay(server.url, call, key)

                tg.start_soon(first)
                await ledger.next_event("started", timeout=TIMEOUT)  # paid, now holding
                await anyio.to_thread.run_sync(server.kill)
            await anyio.to_thread.run_sync(server.start)
            answer = await _pay(server.url, call, key)
        finally:
            await anyio.to_thread.run_sync(server.stop)
    effects = len(ledger.by_call().get(call_id, []))
    return InDoubtRun(reconcile, effects, await _left(store_url, key), answer)
