"""Redis Cluster for `RedisKeyStore`: which node owns a record, and how the store learns it.

Why it is built this way:

* A record is one key whose name is its own hash tag, and each transition is one script on that
  one key, so every transition belongs to exactly one slot, hence one master: the store sends the
  script straight to the owner (slot = CRC16 of the hash tag, as redis-py computes it) on that
  node's multiplexed connection. One round trip per transition, as on one Redis.
* The slot map is read with `CLUSTER SLOTS` from any known node (the seeds, then every master
  seen since), lazily on first use and once per event loop at a time: the first burst of calls
  waits for one read instead of sending one each (the redis-py 8.1 asyncio `RedisCluster`
  fails exactly there when ~30 calls initialize it at once; the store never uses that client's
  connections, only its configuration).
* `MOVED slot host:port` means the command did NOT run: the slot's owner is updated from the
  reply itself and the same script re-sent there. `ASK` (a slot being migrated) is answered by
  `ASKING` + the script in one write to the named node, without changing the map: the migration
  may still be rolled back. `TRYAGAIN` and `CLUSTERDOWN` stay `StoreUnavailable` (fail closed).
  A redirect loop longer than `MAX_REDIRECTS` is a cluster in flux: also `StoreUnavailable`.
* A node that cannot be reached, or whose connection died under a call, makes the store read the
  map again (a failover promotes a replica) and send the call once more to whoever owns the slot
  now; transitions are safe to re-send (see `store.py`).
* Cluster mode has only database 0; a URL naming another is refused.

`redis+cluster://[user:password@]host:port[,host:port...][/0][?options]` names the seeds;
`rediss+cluster://` the same over TLS. The options are redis-py's, read as for `redis://`
(`ssl_ca_certs`, `ssl_certfile`, `ssl_keyfile`, `ssl_cert_reqs`, ...).

Over TLS every node gets the seed's TLS configuration (CA, client certificate), and its
certificate is verified against the host the store dials: for a seed as written in the URL, for
any other node as `CLUSTER SLOTS` reports it. With `tls-cluster yes` Redis reports the TLS ports
and, unless `cluster-announce-hostname` is set, the nodes' IP addresses, so each node's
certificate must name that IP (subjectAltName IP:...). redis-py rewrites a seed "localhost" to
127.0.0.1 before the store sees it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from ..store import StoreError, StoreUnavailable
from .endpoint import Endpoint
from .wire import ReplyError, command

CLUSTER_SCHEMES: Final = ("redis+cluster://", "rediss+cluster://")
#: Redirects one call follows before it gives up (a slot bouncing between nodes).
MAX_REDIRECTS: Final = 5
#: Replies that send a command elsewhere: it did not run where it was sent.
REDIRECTS: Final = ("MOVED", "ASK")

#: A node by where it listens.
NodeId = tuple[str, int]


def seeds_of_url(url: str) -> tuple[list[NodeId], str]:
    """The seed nodes of a `redis+cluster://` URL, and a `redis://` URL of the first seed that
    carries its credentials and options (for redis-py to read). Raises `ValueError`."""
    scheme, sep, rest = url.partition("://")
    if not sep or f"{scheme}://" not in CLUSTER_SCHEMES:
        raise ValueError(f"a Redis Cluster URL starts with redis+cluster://, not {url!r}")
    # The query first: its values may hold slashes (`ssl_ca_certs=/etc/ssl/ca.pem`).
    rest, qmark, query = rest.partition("?")
    location, slash, path = rest.partition("/")
    tail = f"{path}{qmark}{query}"
    credentials, at, hosts = location.rpartition("@")
    seeds = [_node_of(part, url) for part in hosts.split(",") if part.strip()]
    if not seeds:
        raise ValueError(f"a Redis Cluster URL names at least one host:port: {url!r}")
    parts = urlsplit(f"redis://x/{tail}" if slash else f"redis://x{tail}")
    for db in [parts.path.strip("/"), *parse_qs(parts.query).get("db", [])]:
        if db not in ("", "0"):
            raise ValueError(f"Redis Cluster has only database 0, not {db!r}: {url!r}")
    plain = "rediss" if scheme.startswith("rediss") else "redis"
    host, port = seeds[0]
    first = f"[{host}]" if ":" in host else host
    return seeds, f"{plain}://{credentials}{at}{first}:{port}{slash}{tail}"


def _node_of(text: str, url: str) -> NodeId:
    host, colon, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"a Redis Cluster seed is host:port (port 1-65535), not {text!r}: {url!r}")
    return host, int(port)


def redirect(reply: ReplyError) -> tuple[bool, int, NodeId]:
    """`MOVED`/`ASK slot host:port` read as (is it ASK, slot, node)."""
    try:
        code, slot, where = str(reply).split()
        host, _, port = where.rpartition(":")
        return code == "ASK", int(slot), (host, int(port))
    except ValueError:
        raise StoreError(f"Redis Cluster sent an unreadable redirect: {reply}") from reply


class Cluster:
    """The slot map and the nodes' endpoints, shared by every event loop of one store."""

    def __init__(self, endpoint: Endpoint, seeds: Sequence[NodeId]) -> None:
        if endpoint.db:
            raise ValueError(f"Redis Cluster has only database 0, not {endpoint.db}")
        self._template = endpoint
        self._seeds = list(seeds)
        self._owners: list[NodeId | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        self._masters: list[NodeId] = []
        self._endpoints: dict[NodeId, Endpoint] = {}
        #: Counts map reads: a caller that saw a failure under generation N asks for a new map
        #: only if nobody read one since.
        self.generation = 0

    def owner(self, rkey: bytes) -> NodeId | None:
        """The master serving `rkey`'s slot, or None if the map does not say (yet)."""
        return self._owners[key_slot(rkey)]

    def moved(self, slot: int, node: NodeId) -> None:
        """A MOVED reply: `slot` is served by `node` now."""
        self._owners[slot] = node
        if node not in self._masters:
            self._masters.append(node)

    def masters(self) -> list[NodeId]:
        """The masters serving at least one slot, in the last map read."""
        return list(self._masters)

    def endpoint(self, node: NodeId) -> Endpoint:
        """How to reach `node`: the seed's configuration (TLS, credentials, timeouts) there."""
        known = self._endpoints.get(node)
        if known is None:
            host, port = node
            address = dataclasses.replace(
                self._template.address, host=host, port=port, server_hostname=host
            )
            known = self._endpoints[node] = dataclasses.replace(self._template, address=address)
        return known

    async def refresh(self, ask: Callable[[NodeId, bytes], Awaitable[Any]]) -> None:
        """Read the slot map from the first node that answers `CLUSTER SLOTS` (`ask` sends
        one command to one node). Raises `StoreUnavailable` when none does."""
        failures: list[str] = []
        for node in dict.fromkeys([*self._masters, *self._seeds]):
            try:
                reply = await ask(node, command(b"CLUSTER", b"SLOTS"))
            except StoreError as exc:
                failures.append(f"{node[0]}:{node[1]}: {exc}")
                continue
            if isinstance(reply, ReplyError):
                failures.append(f"{node[0]}:{node[1]}: {reply}")
                continue
            self._learn(reply, node)
            return
        raise StoreUnavailable(
            "no Redis Cluster node answered CLUSTER SLOTS: " + "; ".join(failures)
        )

    def _learn(self, reply: Any, asked: NodeId) -> None:
        owners: list[NodeId | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        masters: list[NodeId] = []
        for entry in reply:
            start, end, master = int(entry[0]), int(entry[1]), entry[2]
            host = master[0].decode() if isinstance(master[0], bytes) else str(master[0])
            # An empty or "?" host means "where you reached me" (cluster-announce unset).
            node = (host if host not in ("", "?") else asked[0], int(master[1]))
            if node not in masters:
                masters.append(node)
            owners[start : end + 1] = [node] * (end - start + 1)
        self._owners = owners
        self._masters = masters
        self.generation += 1
