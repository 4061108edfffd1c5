"""Benchmark 2: Redis round trips per first execution and per replay, read from Redis itself.

The count is Redis's own `total_reads_processed` (socket reads of client requests; one per round
trip for requests of this size) around each call, on a private redis-server that only the
benchmark talks to, with the per-command breakdown from `INFO commandstats`. Measured:

* call: a real MCP `tools/call` (in-process client) to a tool guarded by `@idempotent` on a
  `RedisKeyStore`, fresh keys (first execution) then the same keys again (replay);
* renewals: a guarded tool that runs shorter, then longer, than a third of its lease;
* AWS Powertools' Redis layer doing the same first execution and replay.
"""

from __future__ import annotations

from typing import Any

import anyio
import redis
from mcp.client import Client

from idempotency import RedisKeyStore
from idempotency._stores.redis import lua

from . import _powertools, _workload
from ._redis import Counters, RedisServer, read_counters
from ._scale import Scale
from ._servers import bench_server, key_meta

CALLS = 20


def _per_call(before: Counters, after: Counters, calls: int) -> dict[str, Any]:
    delta = after.minus(before)
    return {
        "round_trips_per_call": delta["round_trips"] / calls,
        "commands_per_call": {k: v / calls for k, v in sorted(delta["commands"].items())},
    }


async def _calls(url: str, admin: redis.Redis) -> dict[str, Any]:
    store = RedisKeyStore.from_url(url, prefix=_workload.PREFIX)
    lease = 0.9
    renewing = RedisKeyStore.from_url(url, prefix=_workload.PREFIX + "lease:")
    server = bench_server(store)
    lease_server = bench_server(renewing, lease=lease)
    out: dict[str, Any] = {}
    try:
        async with Client(server) as client, Client(lease_server) as lease_client:
            # Warm up: connections open, scripts cached, tool list fetched.
            await client.call_tool("keyed", {"text": "warm"}, meta=key_meta("warm"))
            await lease_client.call_tool("slow", {"text": "w", "seconds": 0}, meta=key_meta("w"))
            for phase in ("first", "replay"):
                before = read_counters(admin)
                for n in range(CALLS):
                    result = await client.call_tool(
                        "keyed", {"text": f"t{n}"}, meta=key_meta(f"rt-{n}")
                    )
                    assert not result.is_error, result
                out[phase] = _per_call(before, read_counters(admin), CALLS)
            # Renewals happen every lease/3 while a tool runs: none below that, one per third.
            runs = {"short": lease / 3 * 0.6, "long": lease / 3 * 1.6}
            for name, seconds in runs.items():
                before = read_counters(admin)
                await lease_client.call_tool(
                    "slow", {"text": name, "seconds": seconds}, meta=key_meta(f"lease-{name}")
                )
                delta = read_counters(admin).minus(before)
                out[f"renewal_{name}"] = {
                    "lease_seconds": lease,
                    "tool_seconds": round(seconds, 3),
                    "round_trips": delta["round_trips"],
                    "renewals": delta["round_trips"] - 2,
                    "expected_renewals": int(seconds // (lease / 3)),
                    "commands": delta["commands"],
                }
    finally:
        await store.aclose()
        await renewing.aclose()
    return out


def _powertools_counts(url: str, admin: redis.Redis) -> dict[str, Any]:
    layer = _powertools.PowertoolsLayer(url)
    result = _workload.powertools_result()
    out: dict[str, Any] = {}
    try:
        layer.first_execution({"key": "warm"}, result)
        for phase in ("first", "replay"):
            before = read_counters(admin)
            for n in range(CALLS):
                data = {"key": f"rt-{n}", **_workload.arguments(n)}
                if phase == "first":
                    layer.first_execution(data, result)
                else:
                    assert layer.replay(data) == result
            out[phase] = _per_call(before, read_counters(admin), CALLS)
    finally:
        layer.close()
    return out


def measure(scale: Scale | None = None) -> dict[str, Any]:
    """The same at every scale: counts are exact, not statistical."""
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url)
        # A server that has run a while has every script cached; a fresh one pays one extra
        # round trip (NOSCRIPT, then EVAL) the first time each script runs.
        for script in (lua.CLAIM, lua.COMPLETE, lua.RENEW, lua.RELEASE, lua.READ):
            admin.script_load(script.source)
        try:
            calls = anyio.run(_calls, server.url, admin)
            powertools = _powertools_counts(server.url, admin) if _powertools.available() else None
        finally:
            admin.close()
    out: dict[str, Any] = {
        "method": "Redis INFO stats total_reads_processed delta per call (private server)",
        "calls_per_phase": CALLS,
        "mcp_once": calls,
        "redis_round_trips_first": calls["first"]["round_trips_per_call"],
        "redis_round_trips_replay": calls["replay"]["round_trips_per_call"],
        "target": {"first": 2, "replay": 1},
    }
    if powertools is not None:
        out["powertools"] = powertools
    return out


if __name__ == "__main__":
    from ._standalone import standalone

    standalone(__doc__, measure)
