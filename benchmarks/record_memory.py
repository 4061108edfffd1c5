"""Benchmark 5: Redis memory per completed record (`MEMORY USAGE`) against the result it keeps.

A record is completed through `RedisKeyStore` with a result of exactly N bytes, under the key
name the server guard uses (prefix + hashed 64-hex key), and read with `MEMORY USAGE key SAMPLES
0`. Two overheads are reported:

* total: MEMORY USAGE − N. Includes the key name, Redis's per-key bookkeeping and the
  allocator's rounding of the value up to a jemalloc size class (up to ~20 % of N for large N):
  what any Redis string costs.
* beyond a bare string: the record's MEMORY USAGE minus that of the same N bytes stored as a
  plain Redis string under the same key name, i.e. what our record format itself adds (header,
  packed fingerprint). Allocator rounding makes single sizes jump; the mean over a sweep of
  sizes is the fair figure.

AWS Powertools' record for the same N-byte result is measured alongside.

The table and the sweep measure the record format itself: records written with `history=False`.
Issue 45: by default each record carries its history (claimed, completed) inside it (format 3).
`history` reports a completed record with its history against the same record without one, its
fence memo (`{key}:f`, kept a day past the record: rule 25) counted on both sides and shown apart
(target: at most `HISTORY_TARGET` times), and the opt-in audit stream's bytes per entry (MEMORY
USAGE of the stream over its length), separately: the stream is capped, the history is not.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from typing import Any

import anyio
import redis.asyncio as aioredis

from idempotency import RedisKeyStore

from . import _powertools, _workload
from ._redis import RedisServer
from ._scale import Scale

SIZES = (16, 200, 1_000, 10_000, 100_000)
TARGET_OVERHEAD = 300
HISTORY_TARGET = 1.5


def sweep_sizes(count: int) -> list[int]:
    """Log-uniform sizes from 16 B to 64 KiB, fixed seed: the same sweep every run."""
    rng = random.Random(5)
    return sorted(int(math.exp(rng.uniform(math.log(16), math.log(65_536)))) for _ in range(count))


async def _ours(
    url: str, sizes: list[int], run: str, *, history: bool = False, stream: bool = False
) -> list[tuple[int, int, int]]:
    """(N, record MEMORY USAGE, bare string MEMORY USAGE) per size, records written with their
    history or without (`history`), with the audit stream or not (`stream`); each record's fence
    memo's MEMORY USAGE is noted in `_MEMOS` (N -> bytes)."""
    store = RedisKeyStore.from_url(
        url, prefix=_workload.PREFIX, history=history, audit_stream=stream
    )
    admin = aioredis.Redis.from_url(url)
    found = []
    try:
        for n, size in enumerate(sizes):
            key, fp = _workload.call_names(run, n)
            outcome = await store.claim(key, fp, lease=_workload.LEASE, takeover=False)
            assert outcome.token is not None
            result = _workload.result_bytes(size)
            assert len(result) == size
            await store.complete(key, outcome.token, result, retention=_workload.RETENTION)
            rkey = _workload.PREFIX + "{" + key + "}"
            record = int(await admin.memory_usage(rkey, samples=0) or 0)
            _MEMOS[size] = int(await admin.memory_usage(rkey + ":f", samples=0) or 0)
            await admin.delete(rkey)
            await admin.set(rkey, result, ex=int(_workload.RETENTION))
            bare = int(await admin.memory_usage(rkey, samples=0) or 0)
            found.append((size, record, bare))
    finally:
        await store.aclose()
        await admin.aclose()
    return found


#: The last `_ours` run's fence memo MEMORY USAGE per result size.
_MEMOS: dict[int, int] = {}


async def _stream_bytes_per_entry(url: str) -> float | None:
    """The audit stream's MEMORY USAGE over its length, after `_ours` filled it."""
    admin = aioredis.Redis.from_url(url)
    try:
        stream = _workload.PREFIX + "audit"
        length = int(await admin.xlen(stream))
        if not length:
            return None
        return round(int(await admin.memory_usage(stream, samples=0) or 0) / length, 1)
    finally:
        await admin.aclose()


def _powertools_usage(url: str, sizes: tuple[int, ...]) -> dict[int, int]:
    layer = _powertools.PowertoolsLayer(url)
    usage: dict[int, int] = {}
    try:
        for n, size in enumerate(sizes):
            data = {"key": f"memory-{n}", **_workload.arguments(n)}
            layer.first_execution(data, _workload.powertools_result(size))
            record_key = layer.layer._get_hashed_idempotency_key(data)
            assert record_key is not None
            usage[size] = int(layer.client.memory_usage(record_key, samples=0) or 0)
    finally:
        layer.close()
    return usage


def _median_or_none(values: list[int]) -> float | None:
    return statistics.median(values) if values else None


def measure(scale: Scale) -> dict[str, Any]:
    sweep = sweep_sizes(scale.memory_sweep)
    with RedisServer() as server:
        rows_raw = anyio.run(_ours, server.url, list(SIZES), "table")
        memo = _MEMOS[_workload.RESULT_BYTES]
        sweep_raw = anyio.run(_ours, server.url, sweep, "sweep")
        typical_size = [_workload.RESULT_BYTES]
        ((_, with_history, _),) = anyio.run(
            functools.partial(_ours, server.url, typical_size, "history", history=True)
        )
        anyio.run(
            functools.partial(
                _ours, server.url, typical_size * 50, "stream", history=True, stream=True
            )
        )
        per_entry = anyio.run(_stream_bytes_per_entry, server.url)
        powertools = _powertools_usage(server.url, SIZES) if _powertools.available() else {}
    rows = []
    for size, record, bare in rows_raw:
        row: dict[str, Any] = {
            "result_bytes": size,
            "mcp_once_memory_usage": record,
            "mcp_once_overhead": record - size,
            "bare_string_memory_usage": bare,
            "mcp_once_beyond_bare_string": record - bare,
        }
        if size in powertools:
            row["powertools_memory_usage"] = powertools[size]
            row["powertools_overhead"] = powertools[size] - size
        rows.append(row)
    typical = next(row for row in rows if row["result_bytes"] == _workload.RESULT_BYTES)
    beyond = [record - bare for _, record, bare in sweep_raw]
    total = [record - size for size, record, _ in sweep_raw]
    record = typical["mcp_once_memory_usage"]
    return {
        "history": {
            "record_with_history_bytes": with_history,
            "record_without_history_bytes": record,
            "history_bytes_per_completed_record": with_history - record,
            "fence_memo_bytes": memo,
            # The figure against the target: a completed record as it costs the store, its
            # fence memo (there with or without a history) counted on both sides.
            "with_vs_without_memo_counted": round((with_history + memo) / (record + memo), 3),
            "with_vs_without_record_alone": round(with_history / record, 3),
            "audit_stream_bytes_per_event": per_entry,
            "target": HISTORY_TARGET,
        },
        "unit": "bytes (Redis MEMORY USAGE key SAMPLES 0; jemalloc)",
        "rows": rows,
        "typical_result_bytes": _workload.RESULT_BYTES,
        "record_overhead_bytes": typical["mcp_once_overhead"],
        "sweep": {
            "sizes": len(sweep),
            "range_bytes": [sweep[0], sweep[-1]],
            "beyond_bare_string_mean": round(statistics.mean(beyond), 1),
            "beyond_bare_string_median": statistics.median(beyond),
            "total_overhead_median": statistics.median(total),
            "total_overhead_median_up_to_1k": _median_or_none(
                [t for (size, _, _), t in zip(sweep_raw, total, strict=True) if size <= 1024]
            ),
        },
        "target_overhead": TARGET_OVERHEAD,
    }


if __name__ == "__main__":
    from ._standalone import standalone

    standalone(__doc__, measure)
