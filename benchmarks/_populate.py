"""Stores of many records, written in bulk by the stores' own encoders: a million in a minute.

Claiming and completing a million records through the store API would take minutes (two
transitions each, ~10k pairs/s). These write the same bytes directly:

* Redis: one script per 10,000 records, built from the store's own `scripts/lib.lua`
  (`record_event` adds the events to the record's history, `save` writes the record, its history
  inside it (format 3), and keeps the in-doubt index, exactly as the transitions do), so every
  record and history is one the store could have written (no audit stream: off by default); the
  index is then marked complete (every record in doubt went through `save`);
* SQLite: the file's schema made by the store itself (`SQLiteKeyStore`, of the checkout under
  test), then one `executemany` per table inside one transaction: rows from the store's
  `_encode`, histories from `history.append` (the reference the scripts mirror).

The records: every `unknown_every`-th one UNKNOWN (its worker's lease ran out), every
`running_every`-th one IN_PROGRESS under a live lease, the rest COMPLETED with a 200-byte
result, delivered, kept 24 h. Created 5 ms apart, oldest first by number, tool `charge`; store
keys are 64 hex digits, as the guard's are. Each store is then marked (`MarkedStore`) as its
first claim would have marked it, so that the reading commands read it.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import anyio
import redis
from mcp_types import CallToolResult, TextContent

from idempotency import KeyStore, Policy, Record, RecordState, RedisKeyStore, encode_result
from idempotency._stores import history as chain
from idempotency._stores import sqlite as sqlite_store
from idempotency._stores.redis.store import IN_DOUBT_INDEX

_HERE = Path(__file__).resolve().parents[1]
#: Records one script writes: ~0.2 s of Redis time, short enough not to starve a health check.
REDIS_BATCH = 10_000
#: Seconds between two records' creation times.
SPACING = 0.005
#: A stored result as the guard writes one: a text answer, about 200 bytes in all.
RESULT = encode_result(
    CallToolResult(content=[TextContent(type="text", text="charged 500 for order o-1; " * 3)]),
    1_700_000_000.0,
)
TOOL = "charge"
#: Seconds a completed record is kept (the guard's default retention).
RETENTION = Policy().retention
#: Seconds an IN_PROGRESS record's lease still runs.
LEASE = 3600.0

_FILL = """
-- fill(ARGV: offset_us, prefix, first, count, total, unknown_every, running_every, result,
--      then the audited scripts' trailer: in-doubt index, said, audit stream, mac):
--      records first..first+count-1 of `total`, with their histories.
local prefix, result = ARGV[2], ARGV[8]
local first, count, total = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local unknown_every, running_every = tonumber(ARGV[6]), tonumber(ARGV[7])
local now = clock()
local fp = '\\255' .. string.rep('\\171', 32)
for i = first, first + count - 1 do
    local key = prefix .. '{' .. redis.sha1hex(tostring(i)) .. string.format('%024x', i) .. '}'
    local created = now - (total - i) * SPACING_US
    local r = {
        state = COMPLETED, fence = 1, attempts = 1, created = created, updated = created + 1000,
        lease = DELIVERED, completed = created + 1000, expires = now + RETENTION_US, fp = fp,
        token = '', tool = TOOL, result = result,
    }
    if i % unknown_every == 0 then
        r.state, r.lease, r.completed, r.expires, r.result = UNKNOWN, created + 30000000, 0, 0, ''
    elseif i % running_every == 0 then
        r.state, r.token, r.lease = IN_PROGRESS, string.format('%032x', i), now + LEASE_US
        r.completed, r.expires, r.result = 0, now + LEASE_US + RETENTION_US, ''
    end
    record_event(key, r, 'C', '', created, false)
    if r.state == COMPLETED then
        record_event(key, r, 'D', 's=' .. int(#result), created + 1000, false)
    elseif r.state == UNKNOWN then
        record_event(key, r, 'L', '', created + 30000000, false)
    end
    save(key, r, now)
end
return count
"""


def _fill_script() -> str:
    scripts = resources.files("idempotency._stores.redis").joinpath("scripts")
    body = (
        _FILL.replace("SPACING_US", str(round(SPACING * 1e6)))
        .replace("RETENTION_US", str(round(RETENTION * 1e6)))
        .replace("LEASE_US", str(round(LEASE * 1e6)))
        .replace("TOOL", f"'{TOOL}'")
    )
    return scripts.joinpath("lib.lua").read_text(encoding="utf-8") + "\n" + body


def fill_redis(
    url: str,
    count: int,
    *,
    prefix: str = "mcp-once:",
    unknown_every: int = 100_000,
    running_every: int = 100_003,
) -> float:
    """Write `count` records (their histories inside them) under `prefix` of the Redis at
    `url`; returns the seconds it took."""
    started = time.monotonic()
    client = redis.Redis.from_url(url, socket_timeout=None)
    index = prefix.encode() + IN_DOUBT_INDEX
    try:
        fill = client.register_script(_fill_script())
        for first in range(1, count + 1, REDIS_BATCH):
            size = min(REDIS_BATCH, count + 1 - first)
            args = [0, prefix, first, size, count, unknown_every, running_every, RESULT]
            fill(keys=[], args=[*args, index, "", "-", ""])
        # Every record in doubt went into the index as it was saved: the index is complete.
        client.sadd(index, "")
    finally:
        client.close()
    anyio.run(_mark, RedisKeyStore.from_url(url, prefix=prefix))
    return time.monotonic() - started


async def _mark(store: KeyStore) -> None:
    """Mark the store as its first claim would (`MarkedStore`), so that reading commands read it."""
    try:
        await store._write_mark()  # type: ignore[attr-defined]
    finally:
        await store.aclose()


def make_sqlite_store(path: Path, tree: Path | None = None) -> None:
    """Create the SQLite store file at `path` with the schema of the store of `tree` (a
    checkout; this one by default), in a process of its own so that it is that tree's code."""
    code = (
        "import sys, anyio\n"
        "from idempotency import SQLiteKeyStore\n"
        "store = SQLiteKeyStore(sys.argv[1])\n"
        "async def main():\n"
        "    try:\n"
        "        await store.get('mcp-once-schema')\n"
        "        mark = getattr(store, '_write_mark', None)  # as its first claim would\n"
        "        if mark is not None:\n"
        "            await mark()\n"
        "    finally:\n"
        "        await store.aclose()\n"
        "anyio.run(main)\n"
    )
    env_path = str(tree) if tree is not None else ""
    subprocess.run(
        [sys.executable, "-c", code, str(path)],
        check=True,
        cwd=path.parent,
        env=_with_pythonpath(env_path),
        timeout=120,
    )


def _with_pythonpath(tree: str) -> dict[str, str]:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _sqlite_records(
    count: int, unknown_every: int, running_every: int, now: float
) -> Iterator[tuple[Record, str]]:
    for i in range(1, count + 1):
        created = now - (count - i) * SPACING
        key = f"{i:064x}"
        fp = f"{i:064x}"
        if i % unknown_every == 0:
            record = Record(key, RecordState.UNKNOWN, fp, 1, 1, None, created, created + 30,
                            created + 30, None, None, None, TOOL)  # fmt: skip
            text = chain.append("", "C", 1, 1, "", created)
            text = chain.append(text, "L", 1, 1, "", created + 30)
        elif i % running_every == 0:
            record = Record(key, RecordState.IN_PROGRESS, fp, 1, 1, f"{i:032x}", created, created,
                            now + LEASE, None, now + LEASE + RETENTION, None, TOOL)  # fmt: skip
            text = chain.append("", "C", 1, 1, "", created)
        else:
            record = Record(key, RecordState.COMPLETED, fp, 1, 1, None, created, created + 0.001,
                            None, created + 0.001, now + RETENTION, RESULT, TOOL, True)  # fmt: skip
            text = chain.append("", "C", 1, 1, "", created)
            text = chain.append(text, "D", 1, 1, f"s={len(RESULT)}", created + 0.001)
        yield record, text


def fill_sqlite(
    path: Path,
    count: int,
    *,
    tree: Path | None = None,
    unknown_every: int = 100_000,
    running_every: int = 100_003,
) -> float:
    """Make the store file at `path` (`make_sqlite_store`) and write `count` records with
    their histories (the audit table gets the events of the last records, fewer than the
    store's cap). Returns the seconds it took."""
    started = time.monotonic()
    make_sqlite_store(path, tree)
    now = time.time()

    rows, histories = [], []
    for record, text in _sqlite_records(count, unknown_every, running_every, now):
        rows.append(sqlite_store._encode(record))
        histories.append((record.key, record.tool, text, record.expires_at))
    # The events of the last records, as many as the store's cap keeps at most.
    audit = [
        (created_at, key, tool, line)
        for key, tool, text, _ in histories[-chain.AUDIT_MAX_ENTRIES // 2 :]
        for line in text.split("\n")
        for created_at in (int(line.split("|", 1)[0]) / 1000,)
    ]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(sqlite_store._UPSERT, rows)
        conn.executemany(
            "INSERT INTO history (key, tool, lines, forget_at) VALUES (?,?,?,?)", histories
        )
        conn.executemany("INSERT INTO audit (at, key, tool, line) VALUES (?,?,?,?)", audit)
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return time.monotonic() - started


def fill_elsewhere(store: str, where: str, count: int, tree: Path | None = None) -> float:
    """`fill_redis` (`where`: its URL) or `fill_sqlite` (`where`: the file) in a process of its
    own, so that the caller stays small: a child forked from a big parent counts the parent's
    pages in its peak memory (`ru_maxrss`), which the benchmark reports per command."""
    argv = [sys.executable, "-m", "benchmarks._populate", store, where, str(count)]
    if tree is not None:
        argv += ["--tree", str(tree)]
    done = subprocess.run(argv, cwd=_HERE, capture_output=True, text=True, check=True, timeout=3600)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description="Fill a store in bulk (see the module doc).")
    parser.add_argument("store", choices=["redis", "sqlite"])
    parser.add_argument("where", help="the Redis URL, or the SQLite file")
    parser.add_argument("count", type=int)
    parser.add_argument("--tree", type=Path, help="the checkout whose SQLite schema to make")
    args = parser.parse_args()
    if args.store == "redis":
        print(fill_redis(args.where, args.count))
    else:
        print(fill_sqlite(Path(args.where), args.count, tree=args.tree))


if __name__ == "__main__":
    main()
