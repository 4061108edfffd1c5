"""Replicated Redis deployments the failover benchmark can crash: a small protocol, and Sentinel.

The benchmark needs five things of a deployment, all blocking (it calls them in a worker
thread): start it, the store URL that reaches it, SIGKILL the primary that serves the workload,
wait until it serves writes again, clean it up. Anything that can do these five plugs in (Redis
Cluster: kill one of the masters, wait for the cluster to be healthy again).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

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
        """Freeze the replicas, then close their links on the primary: a frozen process's
        kernel would still take in what the primary sends over loopback, so freezing alone
        loses nothing. The primary keeps writes for them in its backlog until it dies."""
        import redis

        primary = self._sentinel.master()
        replicas = [n for n in self._sentinel.nodes if n is not primary and n.proc is not None]
        for replica in replicas:
            replica.pause()
        with redis.Redis(port=primary.port) as client:
            client.client_kill_filter(_type="replica")
        return replicas

    def resume_replicas(self, stalled: object) -> None:
        assert isinstance(stalled, list)
        for replica in stalled:
            replica.resume()


DEPLOYMENTS = {"sentinel": SentinelDeployment}
