"""Benchmark 7: what journalling a run costs per call (`RetryingSession(..., run=run)`), against
the same calls without a run, and the journal's bytes per entry.

The same guarded tool (`keyed` of the benchmark server, a memory key store) is called through
`RetryingSession(client)` (`plain`: a fresh key per call) and through `RetryingSession(client,
run=run)` for each journal: `memory` (`MemoryJournal`, the floor: the bookkeeping without
storage), `sqlite` (`SQLiteJournal`, the embedded default: the intent committed and fsynced
before the request leaves, the done mark after) and `redis` (`RedisJournal` on a private
redis-server on loopback). Every call is a first execution on the server, journalled or not.
Transports: `in_process` (`mcp.client.Client(server)`, no wire: the call is cheapest, so the
ratio is the worst) and `http` (streamable HTTP on 127.0.0.1, the server its own process).

Latency is one caller issuing calls back to back, the variants interleaved call by call
(rotating which goes first); each round enters one `Run` per journal (a new run id) and keeps
it for the round's calls. Ratios are taken per round (variant p50 / plain p50 of the same
round) and reported as median with min/max, next to the difference in milliseconds.

Bytes per entry, of the entries the rounds wrote (realistic ones: a 45-character derived key,
the argument fingerprint, server `bench`, tool `keyed`): the growth of the checkpointed SQLite
file over all of them (the per-run row included, amortized), and Redis `MEMORY USAGE` (every
field counted: `SAMPLES 0`) of each run's entries hash, per entry. The target is at most 300.
"""

from __future__ import annotations

import contextlib
import sqlite3
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import redis

from orchestrator import Journal, MemoryJournal, RetryingSession, Run, SQLiteJournal
from orchestrator._journal.redis import RedisJournal

from ._redis import RedisServer
from ._scale import Scale, run_async
from .call_overhead import Call, _http_servers, _latencies, latency_summary, open_client

TRANSPORTS = ("in_process", "http")
JOURNALS = ("memory", "sqlite", "redis")
VARIANTS = ("plain", *JOURNALS)
RESULT_SIZE = 200
REDIS_PREFIX = "bench:journal:"
TARGET_BYTES = 300


def _sqlite_size(path: Path) -> int:
    """The file's bytes once the write-ahead log is folded in."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        count = conn.execute("PRAGMA page_count").fetchone()[0]
        page = conn.execute("PRAGMA page_size").fetchone()[0]
    return int(count * page)


def _page_size(path: Path) -> int:
    """The file grows by whole pages: the figure per entry is good to a page over the count."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("PRAGMA page_size").fetchone()[0])


class _Journals:
    """The journals under test, each opened once for the whole benchmark."""

    def __init__(self, folder: Path, redis_url: str) -> None:
        self.sqlite_path = folder / "journal.db"
        self.redis_url = redis_url
        self.by_name: dict[str, Journal] = {
            "memory": MemoryJournal(),
            "sqlite": SQLiteJournal(self.sqlite_path),
            "redis": RedisJournal.from_url(redis_url, prefix=REDIS_PREFIX),
        }
        self.runs: dict[str, list[str]] = {name: [] for name in JOURNALS}

    async def aclose(self) -> None:
        for journal in self.by_name.values():
            await journal.aclose()


@contextlib.asynccontextmanager
async def _endpoint(
    transport: str, target: str, journals: _Journals, label: str, warmup: int
) -> AsyncIterator[Callable[[int], contextlib.AbstractAsyncContextManager[Call]]]:
    """For one transport (`target`: the server's key store URL in process, its endpoint over
    HTTP): `round_(n)` enters one `Run` per journal (run ids named by `label` and the round)
    and yields `call(variant, n, size)`."""
    async with contextlib.AsyncExitStack() as stack:
        client = await open_client(stack, transport, target)
        plain = RetryingSession(client)
        await plain.refresh_tools()

        @contextlib.asynccontextmanager
        async def round_(number: int) -> AsyncIterator[Call]:
            async with contextlib.AsyncExitStack() as runs:
                sessions: dict[str, RetryingSession] = {"plain": plain}
                for name in JOURNALS:
                    run_id = f"{label}-{transport}-{name}-{number}"
                    journals.runs[name].append(run_id)
                    run = await runs.enter_async_context(
                        Run(run_id, journal=journals.by_name[name])
                    )
                    sessions[name] = RetryingSession(client, run=run)
                    await sessions[name].refresh_tools()

                async def call(variant: str, n: int, size: int) -> None:
                    args = {"text": f"{number}-{n}", "size": size}
                    result = await sessions[variant].call_tool("keyed", args)
                    if result.is_error:
                        raise RuntimeError(f"the benchmark tool failed: {result}")

                yield call

        async with round_(-1) as warm:  # connections, scripts, tool lists, the journal files
            for n in range(warmup):
                for variant in VARIANTS:
                    await warm(variant, n, RESULT_SIZE)
        yield round_


async def _bytes_per_entry(journals: _Journals, empty_sqlite: int) -> dict[str, Any]:
    sqlite_entries = 0
    for run_id in journals.runs["sqlite"]:
        sqlite_entries += len(await journals.by_name["sqlite"].entries(run_id))
    grown = _sqlite_size(journals.sqlite_path) - empty_sqlite
    raw = redis.Redis.from_url(journals.redis_url)
    redis_bytes = redis_entries = 0
    try:
        for run_id in journals.runs["redis"]:
            count = len(await journals.by_name["redis"].entries(run_id))
            used = raw.memory_usage(f"{REDIS_PREFIX}{{{run_id}}}:e", samples=0)
            if count and used is not None:
                redis_bytes += int(used)
                redis_entries += count
    finally:
        raw.close()
    return {
        "sqlite": {
            "entries": sqlite_entries,
            "file_growth_bytes": grown,
            "page_size": _page_size(journals.sqlite_path),
            "bytes_per_entry": round(grown / sqlite_entries, 1),
        },
        "redis": {
            "entries": redis_entries,
            "memory_usage_bytes": redis_bytes,
            "bytes_per_entry": round(redis_bytes / redis_entries, 1),
        },
        "target": TARGET_BYTES,
    }


async def _measure(scale: Scale) -> dict[str, Any]:
    rounds, calls = scale.journal_rounds, scale.journal_calls
    latency: dict[str, list[dict[str, list[float]]]] = {t: [] for t in TRANSPORTS}
    label = f"bench-{int(time.time())}"
    with RedisServer() as redis_server, tempfile.TemporaryDirectory() as tmp:
        journals = _Journals(Path(tmp), redis_server.url)
        try:
            await journals.by_name["sqlite"].runs()  # the file and its tables
            empty_sqlite = _sqlite_size(journals.sqlite_path)
            async with contextlib.AsyncExitStack() as stack:
                (url,) = await stack.enter_async_context(
                    _http_servers(["memory://"], uvloop=scale.uvloop)
                )
                targets = {"in_process": "memory://", "http": url}
                warmup = scale.journal_warmup
                endpoints = {
                    transport: await stack.enter_async_context(
                        _endpoint(transport, targets[transport], journals, label, warmup)
                    )
                    for transport in TRANSPORTS
                }
                for round_no in range(rounds):
                    order = VARIANTS if round_no % 2 == 0 else tuple(reversed(VARIANTS))
                    for transport in TRANSPORTS:
                        async with endpoints[transport](round_no) as call:
                            latency[transport].append(
                                await _latencies(call, order, calls, RESULT_SIZE)
                            )
            sizes = await _bytes_per_entry(journals, empty_sqlite)
        finally:
            await journals.aclose()
    out: dict[str, Any] = {
        "result_size_bytes": RESULT_SIZE,
        "calls_per_round": calls,
        "rounds": rounds,
        "latency": {
            transport: latency_summary(runs, VARIANTS, JOURNALS)
            for transport, runs in latency.items()
        },
        "bytes_per_entry": sizes,
    }
    out["journal_ratio_by_transport"] = {
        transport: {name: summary[f"{name}_vs_plain_p50"]["median"] for name in JOURNALS}
        for transport, summary in out["latency"].items()
    }
    out["journal_bytes_per_entry_sqlite"] = sizes["sqlite"]["bytes_per_entry"]
    out["journal_bytes_per_entry_redis"] = sizes["redis"]["bytes_per_entry"]
    return out


def measure(scale: Scale) -> dict[str, Any]:
    return run_async(scale, _measure, scale)


if __name__ == "__main__":
    from ._standalone import standalone

    standalone(__doc__, measure)
