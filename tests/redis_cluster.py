"""A real Redis Cluster on loopback ports (3 masters + 3 replicas by default), for tests and
benchmarks: started from the `redis-server`/`redis-cli` binaries, no Docker, torn down after.

Each node is a `RedisServer` (its own data directory, where `nodes.conf` lives, so a restarted
node rejoins the cluster as what it was told it is now). The node timeout is short (1 s) so a
killed master is failed over within a few seconds; `wait_healthy` is the condition to poll for
after any kill or restart: every live node says `cluster_state:ok`, every slot is served by a
live master, and every live replica's link to its master is up.

    cluster = LocalCluster(); cluster.start()
    victim = cluster.masters()[0]; cluster.kill(victim); cluster.wait_healthy()
    cluster.restart(victim); cluster.wait_healthy()   # back, as a replica
    cluster.cleanup()

With `tls`, every node listens on TLS only (`--port 0`), and the cluster bus and replication
run over TLS as well (`--tls-cluster yes`), so `CLUSTER SLOTS` reports the TLS ports.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

import redis
from redis_server import RedisServer
from redis_tls import TLSFiles

from mcp_once.scenarios._process import free_port

SLOTS = 16384


def missing_binaries() -> list[str]:
    """Which of the binaries a cluster needs are not on PATH."""
    return [name for name in ("redis-server", "redis-cli") if shutil.which(name) is None]


class LocalCluster:
    def __init__(
        self,
        *,
        masters: int = 3,
        replicas_per_master: int = 1,
        node_timeout_ms: int = 1000,
        appendonly: bool = False,
        tls: TLSFiles | None = None,
    ) -> None:
        self.tls = tls
        self.replicas_per_master = replicas_per_master
        self.nodes: list[RedisServer] = []
        for _ in range(masters * (1 + replicas_per_master)):
            node = RedisServer(appendonly=appendonly, tls=tls)
            node.extra_args = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(node.dir / "nodes.conf"),
                # The bus port defaults to port + 10000, which may be taken or past 65535.
                "--cluster-port",
                str(free_port()),
                "--cluster-node-timeout",
                str(node_timeout_ms),
                # A replica may always take over, however long it was cut off: the tests kill
                # masters on purpose and want the failover, not a cluster left down.
                "--cluster-replica-validity-factor",
                "0",
            ]
            if tls is not None:
                node.extra_args += ["--tls-cluster", "yes"]
            self.nodes.append(node)
        self._dead: set[int] = set()

    # -- life cycle ------------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        try:
            for node in self.nodes:
                node.start()
            cli = shutil.which("redis-cli")
            if cli is None:
                raise FileNotFoundError("redis-cli is not on PATH")
            created = subprocess.run(
                [
                    cli,
                    *(self.tls.cli_args() if self.tls is not None else []),
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{node.port}" for node in self.nodes),
                    "--cluster-replicas",
                    str(self.replicas_per_master),
                    "--cluster-yes",
                ],
                capture_output=True,
                timeout=timeout,
                check=False,
            )
            if created.returncode != 0:
                raise RuntimeError(
                    f"redis-cli --cluster create failed: {created.stdout[-2000:]!r}"
                    f" {created.stderr[-2000:]!r}"
                )
            self.wait_healthy(timeout)
        except BaseException:
            self.cleanup()
            raise

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()

    def kill(self, node: RedisServer) -> None:
        """SIGKILL one node (a crash). Its data directory stays, for `restart`."""
        self._dead.add(node.port)
        node.kill()

    def restart(self, node: RedisServer) -> None:
        node.start()
        self._dead.discard(node.port)

    def live(self) -> list[RedisServer]:
        return [node for node in self.nodes if node.port not in self._dead]

    # -- what the cluster looks like now -----------------------------------------------------

    @property
    def url(self) -> str:
        """Every node as a seed, so a store finds the cluster with any of them down."""
        seeds = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        if self.tls is not None:
            return f"rediss+cluster://{seeds}?{self.tls.query()}"
        return f"redis+cluster://{seeds}"

    def client(self, node: RedisServer) -> redis.Redis:
        return node.client(socket_timeout=5.0)

    def by_port(self, port: int) -> RedisServer:
        return next(node for node in self.nodes if node.port == port)

    def slot_owners(self) -> list[int]:
        """The port of the master serving each slot, as the first live node sees it."""
        owners = [0] * SLOTS
        with self.client(self.live()[0]) as admin:
            for start, end, master, *_ in admin.execute_command("CLUSTER SLOTS"):
                owners[int(start) : int(end) + 1] = [int(master[1])] * (int(end) - int(start) + 1)
        return owners

    def masters(self) -> list[RedisServer]:
        """The live masters serving slots now (after a failover: the promoted replicas)."""
        return [self.by_port(port) for port in sorted(set(self.slot_owners()))]

    def owner(self, slot: int) -> RedisServer:
        return self.by_port(self.slot_owners()[slot])

    def replicas(self) -> list[RedisServer]:
        masters = {node.port for node in self.masters()}
        return [node for node in self.live() if node.port not in masters]

    # -- waiting ---------------------------------------------------------------------------------

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every live node says the cluster is ok, all of them agree that every slot is
        served by a live master, and every live replica is in sync with its master."""
        _poll(self._healthy, timeout, "the cluster did not become healthy")

    def _healthy(self) -> bool:
        live_ports = {node.port for node in self.live()}
        views = []
        for node in self.live():
            with self.client(node) as admin:
                if admin.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
                    return False
                view = []
                for start, end, master, *_ in admin.execute_command("CLUSTER SLOTS"):
                    view.append((int(start), int(end), int(master[1])))
                views.append(sorted(view))
        first = views[0]
        if any(view != first for view in views):
            return False
        if sum(end - start + 1 for start, end, _ in first) != SLOTS:
            return False
        masters = {port for _, _, port in first}
        if not masters <= live_ports:
            return False
        for port in live_ports - masters:
            with self.client(self.by_port(port)) as admin:
                info = admin.info("replication")
                if info.get("role") != "slave" or info.get("master_link_status") != "up":
                    return False
                if int(info.get("master_port", 0)) not in masters:
                    return False
        return True


def _poll(ready: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except redis.RedisError as exc:  # a node still starting, or just killed
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{what} within {timeout}s (last error: {last!r})")
