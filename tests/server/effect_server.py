"""A guarded MCP server in its own process (stdio), for the subprocess and multi-process tests.

Tools:
- `effect(order)`: guarded, default policy. Writes a `started` row to the ledger (a SQLite file
  shared by every process), holds until `open_gate` when started with `--gated`, then writes a
  `done` row and returns which execution of the order it was and which process ran it.
- `reentrant_effect(order)`: the same, declared `naturally_idempotent` (expired leases are taken
  over instead of turning UNKNOWN).
- `fenced_effect(order)`: guarded, default policy, with `--provider`: writes the order to the
  example's `FencedTable` (a SQLite "provider" shared by every process), stamped with the claim's
  fence (`current_claim()`). The write is the step a paused worker finishes when it resumes: it
  runs in a worker thread (held there until `open_gate` when `--gated`), out of cancellation's
  reach, as a blocking call to a provider would be.
- `wait_started(count)`: returns this process's pid once `count` effects have started here.
- `open_gate()`: lets a held `effect` or `fenced_effect` go on.
- `in_doubt_gauge(at_least)`, with `--metrics` (an OpenTelemetry SDK in this process, read by an
  in-memory reader, and the gauge's census counting at most every 0.1 s): the value of
  `mcp_once_records_in_doubt` once a collection reports at least `at_least`. Each collection
  asks for the next count, so it polls them.

The ledger survives SIGKILL, so a test can count effects across processes.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from mcp.server.mcpserver import MCPServer

from idempotency import KeyStore, RedisKeyStore, SQLiteKeyStore, current_claim, idempotent

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from fenced_write import FencedTable  # the README's example provider


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = path
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS effects"
                " (id INTEGER PRIMARY KEY, order_id TEXT, pid INTEGER, phase TEXT)"
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    def write(self, order: str, phase: str) -> int:
        """Append a row; returns how many rows of this order and phase exist now."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "INSERT INTO effects (order_id, pid, phase) VALUES (?, ?, ?)",
                (order, os.getpid(), phase),
            )
            (count,) = db.execute(
                "SELECT COUNT(*) FROM effects WHERE order_id = ? AND phase = ?", (order, phase)
            ).fetchone()
            db.execute("COMMIT")
            return int(count)
        finally:
            db.close()


class Progress:
    """A count of what this process did that a test waits for over MCP (`wait_for`), without
    polling: each step wakes the waiters."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = anyio.Event()

    def step(self) -> None:
        self.count += 1
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, count: int) -> int:
        """This process's pid, once `count` steps happened here."""
        while self.count < count:
            await self._changed.wait()
        return os.getpid()


async def serve_stdio(server: MCPServer, store: KeyStore) -> None:
    """Serve over stdio until the client leaves; the store is closed even on cancellation."""
    try:
        await server.run_stdio_async()
    finally:
        with anyio.CancelScope(shield=True):
            await store.aclose()


def _store(args: argparse.Namespace) -> KeyStore:
    if args.store.startswith("redis://"):
        return RedisKeyStore.from_url(args.store, prefix=args.redis_prefix)
    return SQLiteKeyStore(args.store)


async def serve(args: argparse.Namespace) -> None:
    ledger = Ledger(Path(args.ledger))
    store = _store(args)
    started = Progress()
    gate = anyio.Event()
    thread_gate = threading.Event()
    provider = FencedTable(args.provider) if args.provider else None
    server = MCPServer(args.name)

    async def act(order: str) -> str:
        ledger.write(order, "started")
        started.step()
        if args.gated:
            await gate.wait()
        execution = ledger.write(order, "done")
        return f"order {order}: execution {execution} by process {os.getpid()}"

    @server.tool()
    @idempotent(store, lease=args.lease, wait=args.wait)
    async def effect(order: str) -> str:
        return await act(order)

    @server.tool()
    @idempotent(store, lease=args.lease, wait=args.wait, naturally_idempotent=True)
    async def reentrant_effect(order: str) -> str:
        return await act(order)

    @server.tool()
    @idempotent(store, lease=args.lease, wait=args.wait)
    async def fenced_effect(order: str) -> str:
        claim = current_claim()
        assert claim is not None and provider is not None
        ledger.write(order, "started")
        started.step()

        def write() -> None:
            if args.gated:
                thread_gate.wait()
            provider.write(claim.record, claim.fence, order)

        await anyio.to_thread.run_sync(write)
        ledger.write(order, "done")
        return f"order {order}: written with fence {claim.fence} by process {os.getpid()}"

    @server.tool()
    async def wait_started(count: int = 1) -> int:
        return await started.wait_for(count)

    @server.tool()
    async def open_gate() -> str:
        gate.set()
        thread_gate.set()
        return "open"

    if args.metrics:
        reader = _collect_metrics()

        @server.tool()
        async def in_doubt_gauge(at_least: int) -> int:
            while True:
                found = _gauge(reader, "mcp_once_records_in_doubt")
                if found is not None and found >= at_least:
                    return found
                await anyio.sleep(0.05)  # the next collection, and the count it asks for

    await serve_stdio(server, store)


def _collect_metrics() -> Any:
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from idempotency._guard import in_doubt_gauge

    in_doubt_gauge.CENSUS_INTERVAL = 0.1  # a test's patience, not an operator's
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader


def _gauge(reader: Any, name: str) -> int | None:
    """The value a collection of `reader` reports for the gauge `name` (None: none)."""
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name and metric.data.data_points:
                    return int(metric.data.data_points[0].value)
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True, help="SQLite file path or redis:// URL")
    parser.add_argument("--redis-prefix", default="mcp-once:")
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--wait", type=float, default=10.0)
    parser.add_argument("--gated", action="store_true")
    parser.add_argument("--provider", help="the FencedTable's SQLite file, for fenced_effect")
    parser.add_argument("--name", default="effects")
    parser.add_argument("--metrics", action="store_true", help="an OpenTelemetry SDK, in memory")
    anyio.run(serve, parser.parse_args())


if __name__ == "__main__":
    main()
