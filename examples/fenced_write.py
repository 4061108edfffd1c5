"""Fence a downstream write with the claim's fence: `uv run python examples/fenced_write.py`.

A worker paused past its lease (SIGSTOP, a long GC pause, a frozen VM) resumes in the middle of
its tool and finishes the step it was in before mcp-once can stop it: cancellation reaches a tool
only at its next `await`. mcp-once's own fence keeps the *record* right; a write the tool makes
elsewhere needs the same fence, checked where the write lands. Inside a guarded tool,
`idempotency.current_claim()` gives the claim's `fence` (strictly increasing per record) and
`record` (the record's name, unique per tenant, server, tool and key). Two ways to use them:

- a conditional write that only a newer execution can overwrite:
  `UPDATE ... SET ..., fence = :fence WHERE id = :id AND fence < :fence` (`FencedTable` below);
- a provider's own idempotency key built from the claim (`Idempotency-Key:
  claim.downstream_key`): the provider then acts once per logical call, however many executions
  reach it, and again for a deliberate repeat (a new intent, rule 15).

This script plays the paused worker in one process. The first execution stops before its write
(the pause); the store's clock moves past its lease (the pause outlasts it); a retry with the same
key takes the record over (the tool is declared `naturally_idempotent`) and writes with fence 2;
then the first execution resumes, and its write, stamped with fence 1, is refused.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.client import Client
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, RequestParamsMeta, TextContent

from idempotency import MemoryKeyStore, current_claim, idempotent, wire

LEASE = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS writes (
    call TEXT PRIMARY KEY, fence INTEGER NOT NULL, value TEXT NOT NULL, pid INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS refused (
    call TEXT NOT NULL, fence INTEGER NOT NULL, value TEXT NOT NULL, pid INTEGER NOT NULL
);
"""


class StaleWrite(ToolError):
    """The table already holds a write from a later execution of the same call.

    A `ToolError`: an expected refusal, which the SDK reports as a tool error (logged at INFO,
    no traceback), not a crash of the tool."""


class FencedTable:
    """Stands in for the system a tool writes to. Per call it keeps the write with the highest
    fence, and refuses (and notes) any write whose fence is not higher than the one it holds.
    One SQLite file, so that server processes can share it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        db = self._connect()
        try:
            db.executescript(_SCHEMA)
        finally:
            db.close()

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30.0, isolation_level=None)

    def write(self, call: str, fence: int, value: str) -> None:
        """Store `value` for `call`, unless a write with a fence >= `fence` got there first
        (then `StaleWrite`)."""
        row = {"call": call, "fence": fence, "value": value, "pid": os.getpid()}
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            taken = db.execute(
                "INSERT INTO writes (call, fence, value, pid) VALUES (:call, :fence, :value, :pid)"
                " ON CONFLICT (call) DO UPDATE SET fence = :fence, value = :value, pid = :pid"
                " WHERE writes.fence < :fence",
                row,
            ).rowcount
            if not taken:
                db.execute(
                    "INSERT INTO refused (call, fence, value, pid)"
                    " VALUES (:call, :fence, :value, :pid)",
                    row,
                )
            db.execute("COMMIT")
        finally:
            db.close()
        if not taken:
            raise StaleWrite(f"a later execution of this call already wrote (fence > {fence})")

    def writes(self) -> list[tuple[str, int, str, int]]:
        """(call, fence, value, pid) of every write that stands."""
        return self._rows("SELECT call, fence, value, pid FROM writes ORDER BY call")

    def refusals(self) -> list[tuple[str, int, str, int]]:
        """(call, fence, value, pid) of every write refused as stale, oldest first."""
        return self._rows("SELECT call, fence, value, pid FROM refused ORDER BY rowid")

    def _rows(self, sql: str) -> list[tuple[str, int, str, int]]:
        db = self._connect()
        try:
            return [(str(c), int(f), str(v), int(p)) for c, f, v, p in db.execute(sql)]
        finally:
            db.close()


class StoreClock:
    """The key store's clock, moved forward by hand: how this script lets a pause outlast a
    lease without waiting for it."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def __call__(self) -> float:
        return time.time() + self.skipped


def build_server(
    table: FencedTable, store: MemoryKeyStore, paused: anyio.Event, resumed: anyio.Event
) -> MCPServer:
    server = MCPServer("shipping")

    @server.tool()
    @idempotent(store, lease=LEASE, naturally_idempotent=True)
    async def ship(order: str, address: str) -> str:
        claim = current_claim()
        assert claim is not None  # always set inside a guarded call with a key
        if claim.attempt == 1:
            paused.set()  # the first execution is the one that gets paused before its write
            await resumed.wait()
        table.write(claim.record, claim.fence, address)
        return f"shipped {order} to {address} (fence {claim.fence})"

    return server


def text(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def status(result: CallToolResult) -> Any:
    return (result.meta or {})[wire.IDEMPOTENCY_META]["status"]


async def main(path: Path) -> None:
    clock = StoreClock()
    store = MemoryKeyStore(clock=clock)
    table = FencedTable(path)
    paused, resumed = anyio.Event(), anyio.Event()
    server = build_server(table, store, paused, resumed)
    call = {"order": "o-7", "address": "2 Side St"}
    key: RequestParamsMeta = {wire.KEY_META: "ship-o-7"}  # type: ignore[typeddict-unknown-key]
    first: list[CallToolResult] = []
    async with (
        Client(server) as paused_caller,
        Client(server) as retrying_caller,
        anyio.create_task_group() as tg,
    ):

        async def first_attempt() -> None:
            first.append(await paused_caller.call_tool("ship", call, meta=key))

        tg.start_soon(first_attempt)
        await paused.wait()
        clock.skipped += LEASE + 1  # the pause outlasts the lease
        second = await retrying_caller.call_tool("ship", call, meta=key)
        print(f"execution 2 took the record over: {text(second)}")
        resumed.set()
    [(_, fence, _, _)] = table.refusals()
    print(f"execution 1 resumed: its write with fence {fence} was refused")
    print(f"the first caller got: {text(first[0])} ({status(first[0])})")
    [(_, fence, value, _)] = table.writes()
    print(f"the table holds: {value} (fence {fence})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, help="the table's SQLite file (default: a temporary)")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        anyio.run(main, arguments.db or Path(scratch) / "table.sqlite3")
