"""Experiment, not a benchmark of the library: how fast could an async Python client do our
claim+complete pairs if it were leaner than redis-py's asyncio client?

`RedisKeyStore` talks to Redis through `redis.asyncio`, whose per-command cost (connection pool
checkout, command packing, one write and one read per command) bounds the store's throughput:
the store runs at 0.8–1.2x raw redis-py (benchmark 3). This probe drives the *same two scripts*
over one connection with a minimal client: commands issued in the same event-loop iteration are
written together (automatic pipelining), replies are parsed by hiredis and matched in order.
If it is several times faster, the throughput targets are a client problem with a known fix.

    uv run python -m benchmarks.pipelined_client_probe
"""

from __future__ import annotations

import asyncio
import collections
import secrets
from typing import Any

import hiredis

from idempotency import _redis_lua as lua
from idempotency._redis_store import _pack_fingerprint

from . import _workload
from ._redis import RedisServer
from ._timing import async_rate


def _pack(*args: bytes | str | int) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        raw = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


class PipelinedClient:
    """One connection; writes coalesced per loop iteration; replies matched FIFO."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._parser = hiredis.Reader()
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._pending: list[bytes] = []
        self._flush_scheduled = False
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while data := await self._reader.read(65536):
            self._parser.feed(data)
            while (reply := self._parser.gets()) is not False:
                self._waiting.popleft().set_result(reply)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._writer.write(b"".join(self._pending))
        self._pending.clear()

    def call(self, *args: bytes | str | int) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._waiting.append(future)
        self._pending.append(_pack(*args))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return future

    async def aclose(self) -> None:
        self._task.cancel()
        self._writer.close()
        await self._writer.wait_closed()


async def _rates(port: int, window: float) -> dict[int, float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client = PipelinedClient(reader, writer)
    await client.call("SCRIPT", "LOAD", lua.CLAIM.source)
    await client.call("SCRIPT", "LOAD", lua.COMPLETE.source)
    result = _workload.result_bytes()
    lease_us, retention_us = int(_workload.LEASE * 1e6), int(_workload.RETENTION * 1e6)
    found: dict[int, float] = {}
    for callers in (1, 16, 64):
        run = secrets.token_hex(4)

        async def pair(n: int, run: str = run) -> None:
            key, fp = _workload.call_names(run, n)
            rkey = _workload.PREFIX.encode() + b"{" + key.encode() + b"}"
            token = _workload.new_token()
            claimed = await client.call(
                "EVALSHA", lua.CLAIM.sha, 1, rkey, 0, _pack_fingerprint(fp), lease_us, 0,
                retention_us, token,
            )  # fmt: skip
            assert claimed[0] == b"claimed", claimed
            done = await client.call(
                "EVALSHA", lua.COMPLETE.sha, 1, rkey, 0, token, retention_us, result
            )
            assert done == [b"ok"], done

        found[callers] = round(await async_rate(callers, window, pair))
    await client.aclose()
    return found


def main() -> None:
    from . import store_throughput
    from ._scale import QUICK

    with RedisServer() as server:
        probe = asyncio.run(_rates(server.port, 1.0))
    reference = store_throughput.measure(QUICK)["contenders"]
    print("claim+complete pairs/s (one process, same scripts, same server kind)")
    print("callers  pipelined-probe  mcp_once  raw_redis_py  powertools  redis_benchmark")
    for callers, rate in probe.items():
        row = [reference[c].get(str(callers), {}).get("median", "-") for c in reference]
        print(f"{callers:7d}  {rate:15.0f}  " + "  ".join(f"{v!s:>10}" for v in row))


if __name__ == "__main__":
    main()
