"""A real Sentinel deployment on 127.0.0.1: 1 primary, 2 replicas, 3 Sentinels (no Docker).

For the Sentinel tests and the failover benchmark. Every data node runs with `appendonly yes` and
`appendfsync always`; the Sentinels use a quorum of 2 and short timeouts
(`down-after-milliseconds` 1000), so that a SIGKILLed primary is replaced within a few seconds.
Readiness is polled with a deadline, never slept for: `start` returns once every Sentinel sees
both replicas and the two other Sentinels, `wait_failover` once a Sentinel majority names a new
primary that reports the master role and accepts a write.

With `tls`, every process (data nodes and Sentinels) listens on TLS only and requires client
certificates; replication and the Sentinels' own links run over TLS too (`tls-replication yes`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import redis
from redis_server import RedisServer
from redis_tls import TLSFiles

T = TypeVar("T")

SERVICE = "mcp-once"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 10_000


def poll(what: str, check: Callable[[], T | None], timeout: float, every: float = 0.05) -> T:
    """`check()`'s first answer that is not None (or False); TimeoutError naming `what` when
    none comes within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            answer = check()
        except (redis.RedisError, OSError) as exc:
            answer, last = None, exc
        if answer is not None and answer is not False:
            return answer
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not within {timeout}s (last error: {last!r})")
        time.sleep(every)


class SentinelProcess(RedisServer):
    """A redis-server in Sentinel mode, with its own config file (Sentinel rewrites it)."""

    def __init__(
        self, primary_port: int, service: str = SERVICE, tls: TLSFiles | None = None
    ) -> None:
        super().__init__(tls=tls)
        self.config = Path(self.dir) / "sentinel.conf"
        self.config.write_text(
            f"sentinel monitor {service} 127.0.0.1 {primary_port} 2\n"
            f"sentinel down-after-milliseconds {service} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {service} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {service} 1\n"
        )

    def command(self) -> list[str]:
        # The config file must come first; the server's own options follow (Sentinel ignores
        # the persistence ones).
        binary, *options = super().command()
        return [binary, str(self.config), "--sentinel", *options]


class RedisSentinel:
    """1 primary + 2 replicas + 3 Sentinels; `cleanup` stops all and removes their files."""

    def __init__(self, service: str = SERVICE, tls: TLSFiles | None = None) -> None:
        self.service = service
        self.tls = tls
        primary = RedisServer(appendonly=True, tls=tls)
        replicas = [
            RedisServer(
                appendonly=True,
                extra_args=["--replicaof", "127.0.0.1", str(primary.port)],
                tls=tls,
            )
            for _ in range(2)
        ]
        self.nodes: list[RedisServer] = [primary, *replicas]
        self.sentinels = [SentinelProcess(primary.port, service, tls) for _ in range(3)]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        if self.tls is not None:
            return f"rediss+sentinel://{hosts}/{self.service}?{self.tls.query()}"
        return f"redis+sentinel://{hosts}/{self.service}"

    def start(self, timeout: float = 30.0) -> RedisSentinel:
        try:
            for node in self.nodes:
                node.start()
            poll(
                "both replicas in sync", lambda: self._online_replicas(self.nodes[0]) == 2, timeout
            )
            for sentinel in self.sentinels:
                sentinel.start()
            poll("every Sentinel sees 2 replicas and 2 Sentinels", self._settled, timeout)
        except BaseException:
            self.cleanup()
            raise
        return self

    def master(self) -> RedisServer:
        """The node a Sentinel majority names as primary now."""
        port = poll("a Sentinel majority naming a primary", self._agreed_port, 10.0)
        return self._node(port)

    def kill_master(self) -> RedisServer:
        """SIGKILL the current primary (a crash: no goodbye, no fsync beyond what was done)."""
        primary = self.master()
        primary.kill()
        return primary

    def wait_failover(self, old: RedisServer, timeout: float = 30.0) -> RedisServer:
        """Until a Sentinel majority names a primary other than `old` that is a master and
        takes a write; returns it."""

        def promoted() -> RedisServer | None:
            port = self._agreed_port()
            if port is None or port == old.port:
                return None
            node = self._node(port)
            with node.client(socket_timeout=1.0) as client:
                role: Any = client.execute_command("ROLE")
                if role[0] != b"master":
                    return None
                client.set("mcp-once:sentinel-fixture:probe", b"1")
            return node

        return poll(f"a new primary after {old.port} died", promoted, timeout)

    def cleanup(self) -> None:
        for process in [*self.sentinels, *self.nodes]:
            process.cleanup()

    def __enter__(self) -> RedisSentinel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    # -- reading the deployment ----------------------------------------------------------------

    def _node(self, port: int) -> RedisServer:
        for node in self.nodes:
            if node.port == port:
                return node
        raise LookupError(f"Sentinel names 127.0.0.1:{port}, not a node of this deployment")

    def _ask(self, sentinel: SentinelProcess, *args: str) -> Any:
        with sentinel.client(socket_timeout=1.0) as client:
            return client.execute_command(*args)

    def _agreed_port(self) -> int | None:
        votes: dict[int, int] = {}
        for sentinel in self.sentinels:
            try:
                named = self._ask(sentinel, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
            except redis.RedisError:
                continue
            if named:
                port = int(named[1])
                votes[port] = votes.get(port, 0) + 1
        agreed = [port for port, count in votes.items() if count >= 2]
        return agreed[0] if agreed else None

    def _settled(self) -> bool:
        for sentinel in self.sentinels:
            with sentinel.client(socket_timeout=1.0) as client:
                fields: dict[str, Any] = client.sentinel_master(self.service)
            if int(fields["num-slaves"]) != 2 or int(fields["num-other-sentinels"]) != 2:
                return False
        return True

    @staticmethod
    def _online_replicas(node: RedisServer) -> int:
        with node.client(socket_timeout=1.0) as client:
            info = client.info("replication")
        return sum(
            1
            for name, value in info.items()
            if name.startswith("slave") and isinstance(value, dict) and value["state"] == "online"
        )
