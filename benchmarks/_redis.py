"""A private redis-server per benchmark, and Redis's own counters read around a measurement.

The server helper lives with the tests (`tests/redis_server.py`) and is imported from there by
path, so that tests, chaos runs and benchmarks start Redis the same way from one definition.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

REPO = Path(__file__).resolve().parent.parent
_TESTS = str(REPO / "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from redis_cluster import LocalCluster  # type: ignore[import-not-found]  # noqa: E402
from redis_server import RedisServer, free_port  # type: ignore[import-not-found]  # noqa: E402

__all__ = [
    "Counters",
    "LocalCluster",
    "RedisServer",
    "free_port",
    "read_counters",
    "redis_benchmark_binary",
]


def redis_benchmark_binary() -> str | None:
    return shutil.which("redis-benchmark")


@dataclass(frozen=True, slots=True)
class Counters:
    """`total_reads_processed` counts socket reads of client requests: one per round trip for a
    request that fits one read (pipelined commands share one). `commands` is `INFO
    commandstats` (calls per command; commands a Lua script issues are counted there too).
    `keys` counts key lookups (`keyspace_hits` + `keyspace_misses`: an MGET of ten keys is ten,
    a SCAN none): how many records a command read."""

    reads: int
    commands: dict[str, int]
    keys: int = 0

    def minus(self, before: Counters) -> dict[str, Any]:
        """The delta, less the one read of the INFO request that took `self`."""
        changed = {
            name: calls - before.commands.get(name, 0)
            for name, calls in self.commands.items()
            if calls != before.commands.get(name, 0) and name != "info"
        }
        return {
            "round_trips": self.reads - before.reads - 1,
            "commands": changed,
            "keys_looked_up": self.keys - before.keys,
        }


def read_counters(client: redis.Redis) -> Counters:
    """One INFO request for both sections, so the measurement costs exactly one read."""
    info = client.info("stats", "commandstats")
    commands = {
        name.removeprefix("cmdstat_"): int(value["calls"])
        for name, value in info.items()
        if name.startswith("cmdstat_") and isinstance(value, dict)
    }
    keys = int(info["keyspace_hits"]) + int(info["keyspace_misses"])
    return Counters(int(info["total_reads_processed"]), commands, keys)
