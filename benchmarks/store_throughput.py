"""Benchmark 3: claim+complete pairs per second at 1, 16 and 64 concurrent callers.

Contenders, measured interleaved in each round on one private redis-server:

* `mcp_once` — `RedisKeyStore.claim` + `.complete` (asyncio tasks, one process).
* `raw_redis_py` — the same two scripts through plain `redis.asyncio` EVALSHA calls, no store
  code around them: what the store cost when it was built on redis-py's asyncio client.
* `bare_asyncio` — the same two scripts through the least an asyncio client can be (one
  connection, hiredis, replies matched in order, writes coalesced per loop turn; no
  configuration, reconnection or store logic): the gap to `mcp_once` is the store's own cost,
  the gap to `redis_benchmark` is the event loop's and the interpreter's.
* `powertools` — AWS Powertools' Redis layer, `save_inprogress` + `save_success` (threads).
* `redis_benchmark` — `redis-benchmark` running claim and complete as ONE script per request
  (the same server-side work at half the network cost): the practical limit of the server.

Every Python contender hashes the call and names the record as the server guard does and stores
the same 200-byte result; keys are unique, so every pair is a first execution. The database is
flushed before each measurement so no contender inherits another's records.
"""

from __future__ import annotations

import asyncio
import collections
import csv
import io
import random
import subprocess
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import hiredis
import redis
import redis.asyncio as aioredis

from idempotency import RedisKeyStore
from idempotency._stores.redis import lua
from idempotency._stores.redis.store import _pack_fingerprint
from idempotency._stores.redis.wire import command

from . import _powertools, _workload
from ._redis import RedisServer, redis_benchmark_binary
from ._scale import Scale
from ._stats import spread
from ._timing import async_rate, thread_rate

CONCURRENCY = (1, 16, 64)
CONTENDERS = ("mcp_once", "raw_redis_py", "bare_asyncio", "powertools", "redis_benchmark")


async def _mcp_once(url: str, concurrency: int, duration: float, run: str) -> float:
    store = RedisKeyStore.from_url(url, prefix=_workload.PREFIX)
    result = _workload.result_bytes()

    async def pair(n: int) -> None:
        key, fp = _workload.call_names(run, n)
        outcome = await store.claim(key, fp, lease=_workload.LEASE, takeover=False)
        assert outcome.token is not None, outcome
        stored = await store.complete(key, outcome.token, result, retention=_workload.RETENTION)
        assert stored

    try:
        return await async_rate(concurrency, duration, pair)
    finally:
        await store.aclose()


def _scripted_pairs(
    run: str, call: Callable[..., Awaitable[Any]]
) -> Callable[[int], Awaitable[None]]:
    """Pairs sent as the store's two scripts through `call(*command)`, with no store code."""
    result = _workload.result_bytes()
    lease_us = int(_workload.LEASE * 1e6)
    retention_us = int(_workload.RETENTION * 1e6)
    prefix = _workload.PREFIX.encode()

    async def pair(n: int) -> None:
        key, fp = _workload.call_names(run, n)
        rkey = prefix + b"{" + key.encode() + b"}"
        token = _workload.new_token()
        claimed = await call(
            b"EVALSHA", lua.CLAIM.sha, 1, rkey, 0, _pack_fingerprint(fp), lease_us, 0,
            retention_us, token,
        )  # fmt: skip
        assert claimed[0] == b"claimed", claimed
        done = await call(b"EVALSHA", lua.COMPLETE.sha, 1, rkey, 0, token, retention_us, result)
        assert done == [b"ok"], done

    return pair


async def _raw(url: str, concurrency: int, duration: float, run: str) -> float:
    client = aioredis.Redis.from_url(url)
    await client.script_load(lua.CLAIM.source)
    await client.script_load(lua.COMPLETE.source)
    try:
        return await async_rate(concurrency, duration, _scripted_pairs(run, client.execute_command))
    finally:
        await client.aclose()


class _Bare(asyncio.Protocol):
    """One connection; commands of one loop turn written together; replies matched FIFO."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._reader = hiredis.Reader()
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while (reply := self._reader.gets()) is not False:
            self._waiting.popleft().set_result(reply)

    def call(self, *args: bytes | str | int) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._waiting.append(future)
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append(command(*args))
        return future

    def _flush(self) -> None:
        assert self.transport is not None
        self.transport.write(b"".join(self._pending))
        self._pending.clear()


async def _bare(port: int, concurrency: int, duration: float, run: str) -> float:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(_Bare, "127.0.0.1", port)
    try:
        return await async_rate(concurrency, duration, _scripted_pairs(run, client.call))
    finally:
        assert client.transport is not None
        client.transport.close()


def _powertools_rate(url: str, concurrency: int, duration: float, run: str) -> float:
    layer = _powertools.PowertoolsLayer(url)
    result = _workload.powertools_result()

    def pair(n: int) -> None:
        data = {"key": f"{run}-{n}", **_workload.arguments(n)}
        layer.first_execution(data, result)

    try:
        return thread_rate(concurrency, duration, pair)
    finally:
        layer.close()


def redis_benchmark_command(port: int, sha: str, concurrency: int, requests: int) -> list[str]:
    binary = redis_benchmark_binary() or "redis-benchmark"
    return [
        binary,
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
        "-c",
        str(concurrency),
        "-n",
        str(requests),
        "-r",
        "1000000000",
        "--csv",
        "EVALSHA",
        sha,
        "1",
        _workload.PREFIX + "{key:__rand_int__}",
        "0",
        "f" * 33,  # a packed fingerprint is 33 bytes
        str(int(_workload.LEASE * 1e6)),
        "0",
        str(int(_workload.RETENTION * 1e6)),
        "t" * 32,  # tokens are 32 hex characters
        str(int(_workload.RETENTION * 1e6)),
        _workload.result_bytes().decode(),
    ]


def _redis_benchmark_rate(port: int, sha: str, concurrency: int, requests: int) -> float:
    command = redis_benchmark_command(port, sha, concurrency, requests)
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    rows = list(csv.reader(io.StringIO(done.stdout)))
    body = [row for row in rows if row and row[0] != "test"]
    if not body:
        raise RuntimeError(f"redis-benchmark printed no result: {done.stdout!r} {done.stderr!r}")
    return float(body[-1][1])


def measure(scale: Scale) -> dict[str, Any]:
    """Run all contenders, interleaved, for `scale.throughput_rounds` rounds; medians with
    min/max."""
    rounds = scale.throughput_rounds
    duration = scale.throughput_window
    have_powertools = _powertools.available()
    have_benchmark = redis_benchmark_binary() is not None
    pair_source = _workload.pair_script_source()
    samples: dict[str, dict[int, list[float]]] = {
        c: {n: [] for n in CONCURRENCY} for c in CONTENDERS
    }
    #: Sized from the last measured rate so each run lasts about `duration`.
    expected = {1: 30_000.0, 16: 80_000.0, 64: 90_000.0}
    shuffle = random.Random(7)
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url)
        pair_sha = admin.script_load(pair_source)
        for round_no in range(rounds):
            for concurrency in CONCURRENCY:
                order = list(CONTENDERS)
                shuffle.shuffle(order)
                for contender in order:
                    admin.flushall()
                    run = f"r{round_no}c{concurrency}{contender}"
                    if contender == "mcp_once":
                        rate = anyio.run(_mcp_once, server.url, concurrency, duration, run)
                    elif contender == "raw_redis_py":
                        rate = anyio.run(_raw, server.url, concurrency, duration, run)
                    elif contender == "bare_asyncio":
                        rate = anyio.run(_bare, server.port, concurrency, duration, run)
                    elif contender == "powertools":
                        if not have_powertools:
                            continue
                        rate = _powertools_rate(server.url, concurrency, duration, run)
                    else:
                        if not have_benchmark:
                            continue
                        requests = max(2_000, int(expected[concurrency] * duration))
                        rate = _redis_benchmark_rate(server.port, pair_sha, concurrency, requests)
                        expected[concurrency] = rate
                    samples[contender][concurrency].append(rate)
        admin.flushall()
        admin.close()
        port = server.port
    return _report(samples, rounds, duration, port, pair_sha, have_powertools)


def _report(
    samples: dict[str, dict[int, list[float]]],
    rounds: int,
    duration: float,
    port: int,
    pair_sha: str,
    have_powertools: bool,
) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for contender, by_level in samples.items():
        table[contender] = {
            str(level): spread(values, 0) for level, values in by_level.items() if values
        }
    # Ratios are paired: taken within each round (the contenders ran back to back), then the
    # median over rounds, so that load drifting between rounds cancels out.
    ratios: dict[str, dict[str, float]] = {"vs_powertools": {}, "vs_redis_benchmark": {}}
    ratio_spread: dict[str, dict[str, Any]] = {"vs_powertools": {}, "vs_redis_benchmark": {}}
    ours_vs_raw: dict[str, float] = {}
    ours_vs_bare: dict[str, float] = {}
    for level in CONCURRENCY:
        key = str(level)
        ours = samples["mcp_once"][level]
        for name, other in (
            ("vs_powertools", "powertools"),
            ("vs_redis_benchmark", "redis_benchmark"),
        ):
            theirs = samples[other][level]
            if theirs:
                paired = [a / b for a, b in zip(ours, theirs, strict=True)]
                ratio_spread[name][key] = spread(paired)
                ratios[name][key] = ratio_spread[name][key]["median"]
        raw = samples["raw_redis_py"][level]
        ours_vs_raw[key] = spread([a / b for a, b in zip(ours, raw, strict=True)])["median"]
        bare = samples["bare_asyncio"][level]
        ours_vs_bare[key] = spread([a / b for a, b in zip(ours, bare, strict=True)])["median"]
    out: dict[str, Any] = {
        "unit": "claim+complete pairs per second (median of rounds, with min and max)",
        "rounds": rounds,
        "window_seconds": duration,
        "result_bytes": _workload.RESULT_BYTES,
        "contenders": table,
        "ratios": ratios,
        "ratio_spread": ratio_spread,
        "mcp_once_vs_raw_redis_py": ours_vs_raw,
        "mcp_once_vs_bare_asyncio": ours_vs_bare,
        "redis_benchmark_command": " ".join(
            [
                *redis_benchmark_command(port, pair_sha, 16, 100_000)[:-1],
                f"<{_workload.RESULT_BYTES}-byte result>",
            ]
        ),
    }
    if have_powertools:
        out["powertools_version"] = _powertools.version()
    return out


if __name__ == "__main__":
    from ._standalone import standalone

    standalone(__doc__, measure)
