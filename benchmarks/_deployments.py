"""Replicated Redis deployments the failover benchmark can crash: a small protocol, and Sentinel.

The benchmark needs five things of a deployment, all blocking (it calls them in a worker
thread): start it, the store URL that reaches it, SIGKILL the primary that serves the workload,
wait until it serves writes again, clean it up. Anything that can do these five plugs in (Redis
Cluster: kill one of the masters, wait for the cluster to be healthy again).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ._redis import REPO  # noqa: F401  (puts tests/ on sys.path for the launchers)


class Deployment(Protocol):
    """A replicated Redis the benchmark can crash. Methods block; `kill_primary` returns a
    handle that `wait_recovered` takes back."""

    #: A short label for the results ("sentinel", "cluster").
    name: str

    def start(self) -> None: ...

    def store_url(self) -> str: ...

    def kill_primary(self) -> object: ...

    def wait_recovered(self, killed: object, timeout: float) -> None:
        """Return once a primary other than `killed` accepts writes; TimeoutError after
        `timeout` seconds."""
        ...

    def cleanup(self) -> None: ...


@runtime_checkable
class Stallable(Protocol):
    """A deployment whose replicas can be frozen, so that the writes the primary takes just
    before it dies reach no replica (replication lag, made certain instead of left to luck)."""

    def stall_replicas(self) -> object:
        """Cut the serving primary's replicas off (they get nothing more from it) until
        `resume_replicas`; returns a handle for it."""
        ...

    def resume_replicas(self, stalled: object) -> None: ...


class SentinelDeployment:
    """1 primary + 2 replicas + 3 Sentinels on loopback (`tests/redis_sentinel.py`), every node
    with `appendfsync always`."""

    name = "sentinel"

    def __init__(self) -> None:
        from redis_sentinel import RedisSentinel  # type: ignore[import-not-found]

        self._sentinel = RedisSentinel()

    def start(self) -> None:
        self._sentinel.start()

    def store_url(self) -> str:
        url: str = self._sentinel.url
        return url

    def kill_primary(self) -> object:
        return self._sentinel.kill_master()

    def wait_recovered(self, killed: object, timeout: float) -> None:
        self._sentinel.wait_failover(killed, timeout)

    def cleanup(self) -> None:
        self._sentinel.cleanup()

    def stall_replicas(self) -> object:
        """Freeze the replicas and cut them off (`_cut_off`)."""
        primary = self._sentinel.master()
        replicas = [n for n in self._sentinel.nodes if n is not primary and n.proc is not None]
        return _cut_off(primary.port, replicas)

    def resume_replicas(self, stalled: object) -> None:
        _resume(stalled)


class ClusterDeployment:
    """A Redis Cluster of 3 masters with 2 replicas each on loopback (`tests/redis_cluster.py`),
    every node with `appendfsync always`. The primary crashed is the first master; the
    workload's keys spread over all three, so about a third of the calls meet the failover.

    Two replicas a master, as Sentinel's primary has: with one, the promoted replica has none
    left, and `wait_replicas=1` refuses every write to its slots (`ReplicationUnconfirmed`)
    until the crashed node rejoins as a replica."""

    name = "cluster"

    def __init__(self) -> None:
        from redis_cluster import LocalCluster  # type: ignore[import-not-found]

        self._cluster = LocalCluster(replicas_per_master=2, appendonly=True)
        self._victim: Any = None

    def start(self) -> None:
        self._cluster.start()

    def store_url(self) -> str:
        url: str = self._cluster.url
        return url

    def _primary(self) -> Any:
        if self._victim is None:
            self._victim = self._cluster.masters()[0]
        return self._victim

    def kill_primary(self) -> object:
        victim, self._victim = self._primary(), None
        self._cluster.kill(victim)
        return victim

    def wait_recovered(self, killed: object, timeout: float) -> None:
        self._cluster.wait_healthy(timeout)

    def cleanup(self) -> None:
        self._cluster.cleanup()

    def stall_replicas(self) -> object:
        """The crashed master's replica frozen and cut off (see `SentinelDeployment`); the
        other shards keep replicating."""
        primary = self._primary()
        replicas = []
        for node in self._cluster.replicas():
            with self._cluster.client(node) as admin:
                if int(admin.info("replication").get("master_port", 0)) == primary.port:
                    replicas.append(node)
        return _cut_off(primary.port, replicas)

    def resume_replicas(self, stalled: object) -> None:
        _resume(stalled)


def _cut_off(primary_port: int, replicas: list[Any]) -> list[Any]:
    """Freeze `replicas`, then close their links on the primary: a frozen process's kernel
    would still take in what the primary sends over loopback, so freezing alone loses nothing.
    The primary keeps writes for them in its backlog until it dies."""
    import redis

    for replica in replicas:
        replica.pause()
    with redis.Redis(port=primary_port) as client:
        client.client_kill_filter(_type="replica")
    return replicas


def _resume(stalled: object) -> None:
    assert isinstance(stalled, list)
    for replica in stalled:
        replica.resume()


DEPLOYMENTS: dict[str, type[Deployment]] = {
    "sentinel": SentinelDeployment,
    "cluster": ClusterDeployment,
}
