"""Claim+complete pairs per second on a 3-master Redis Cluster vs one Redis, same run.

Both deployments are private and started here from the `redis-server`/`redis-cli` binaries: one
redis-server, and a 3-master + 3-replica cluster (`tests/redis_cluster.py`). The workload is
`store_throughput`'s `mcp_once` contender (one asyncio process, unique keys, 200-byte results)
at 1, 16 and 64 concurrent callers; rounds alternate which deployment goes first, and the ratio
is taken within each round (paired), then the median over rounds.

Issue 45's rows on a Cluster: `cluster_no_history` is the same cluster with `history=False`, in
the same rounds, and `cluster_history_on_vs_off` the paired ratio (histories on, the default, over
off). A cluster keeps no audit stream (`audit_stream=true` is refused there), so there is no
stream row.

What it shows on a small box: the store's client is one Python process, so a cluster does not
make one process faster; it spreads records and server work over masters (more memory, more
server CPU, more processes). On 2 cores the six cluster nodes and the client share the CPUs.

    uv run python -m benchmarks.cluster_throughput [--quick]
"""

from __future__ import annotations

from typing import Any

import anyio

from ._redis import LocalCluster, RedisServer
from ._scale import Scale
from ._stats import spread
from .store_throughput import CONCURRENCY, _mcp_once

DEPLOYMENTS = ("single", "cluster", "cluster_no_history")
#: Each deployment's store options beyond the URL.
HISTORY = {"single": True, "cluster": True, "cluster_no_history": False}


def measure(scale: Scale) -> dict[str, Any]:
    rounds = scale.throughput_rounds
    duration = scale.throughput_window
    samples: dict[str, dict[int, list[float]]] = {
        d: {n: [] for n in CONCURRENCY} for d in DEPLOYMENTS
    }
    cluster = LocalCluster()
    cluster.start()
    try:
        with RedisServer() as server:
            urls = {"single": server.url, "cluster": cluster.url, "cluster_no_history": cluster.url}
            for round_no in range(rounds):
                for concurrency in CONCURRENCY:
                    order = DEPLOYMENTS if round_no % 2 == 0 else DEPLOYMENTS[::-1]
                    for deployment in order:
                        run = f"r{round_no}c{concurrency}{deployment}"
                        rate = anyio.run(
                            _mcp_once, urls[deployment], concurrency, duration, run,
                            HISTORY[deployment],
                        )  # fmt: skip
                        samples[deployment][concurrency].append(rate)
    finally:
        cluster.cleanup()
    ratio = _paired(samples, "cluster", "single")
    return {
        "unit": "claim+complete pairs per second (median of rounds, with min and max)",
        "rounds": rounds,
        "window_seconds": duration,
        "cluster": "3 masters + 3 replicas, one asyncio client process",
        "deployments": {
            d: {str(n): spread(values, 0) for n, values in by.items()} for d, by in samples.items()
        },
        "cluster_vs_single": ratio,
        "cluster_history_on_vs_off": _paired(samples, "cluster", "cluster_no_history"),
        "command": "uv run python -m benchmarks.cluster_throughput",
    }


def _paired(
    samples: dict[str, dict[int, list[float]]], over: str, under: str
) -> dict[str, dict[str, float]]:
    """`over`'s pairs/s over `under`'s, taken within each round, by concurrency."""
    return {
        str(n): spread([a / b for a, b in zip(samples[over][n], samples[under][n], strict=True)])
        for n in CONCURRENCY
    }


if __name__ == "__main__":
    from ._standalone import standalone

    standalone(__doc__, measure)
