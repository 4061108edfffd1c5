"""`RedisKeyStore`: one record per key, shared by every process and host that reaches one Redis.

Why it is built this way:

* Every transition (claim, renew, complete, release, settle) is ONE Lua script, hence one round
  trip and atomic; the token comparison inside the script is the fencing check that stops a
  stale worker (Kleppmann). A first execution costs 2 round trips (claim + complete), a replay 1.
* Times come from the Redis clock (`TIME` inside the script), so leases do not depend on the
  workers' clocks agreeing. Liveness is the logical `expires_at` stored in the record; the key's
  PEXPIRE is only garbage collection, set at or after the logical expiry (at least 1 s), and
  never on UNKNOWN records, which wait for an operator.
* A record is one Redis string (binary header, fingerprint, token, tool name, result; see
  `scripts/lib.lua`: a record of the previous release, without a tool name, still reads) in
  key `{prefix}{key}`: the key is its own hash tag, so every key a record touches lives in one
  Redis Cluster slot. One string costs ~250 bytes beyond the result; a hash would turn into a
  hashtable past 64-byte values and cost ~900.
* One multiplexed connection per event loop carries every call (`wire.py`): concurrent
  calls share it, commands issued in one loop turn leave in one write, and replies are matched
  in order. There is no pool to run out of. Waiting duplicates share one subscriber connection
  (`waiters.py`). So a store holds two connections per event loop, three with durable
  writes, however many calls and waiters it serves. redis-py supplies the configuration (URL,
  TLS, credentials, Sentinel; `endpoint.py`) and hiredis parses the replies.
* Self-healing (rule 12). A connection that died while idle is replaced before a call uses it
  (`link.py`). A call that fails because the connection died under it is sent once more
  on a fresh connection. Every transition is safe to re-send. A claim carries a token the store
  generated, and a re-sent claim that finds the record IN_PROGRESS under that very token (and
  fingerprint) answers `claimed`, with its lease restarted: 128 random bits never match another
  claim. A complete, release or settle re-sent after its reply was lost carries a flag that also
  accepts its own effect as success: the record COMPLETED with byte-identical result (the stored
  payload holds its execution time, so another attempt's result never is), RELEASED or gone, or
  settled as asked. Only such re-sends use the flag, so the normal semantics (and the reference
  model in the tests) are unchanged. When even the re-send fails, the store remembers the write
  as in doubt (`doubt.py`), and the caller's own retry of it is sent as a re-send: the
  same token for a claim, the flag for a complete or release.
* Redis errors never leak: an unreachable, timed-out, loading, read-only or out-of-memory
  server is `StoreUnavailable` (cause chained); a key holding something that is not our record
  is `CorruptRecord` and is left untouched. A reply that does not arrive within `socket_timeout`
  is not re-sent: the server is not answering, and waiting twice would only double the wait.
* Optional durability: with `wait_replicas` (or `wait_aof`) the claim and complete scripts are
  followed by `WAIT`/`WAITAOF` on a connection of their own, in one write, grouped with the other
  durable writes queued meanwhile (`durable.py`); see `ReplicationUnconfirmed` for what
  happens when too few acknowledge.

Runs under asyncio and trio (anyio). Cancelling a call never leaves half a record: the script
either ran whole or not at all, and a cancelled caller's reply is read and dropped.

Topologies: one Redis; a primary behind Sentinel (`redis+sentinel://`, `rediss+sentinel://`
with TLS to the Sentinels and the nodes, or a redis-py `Sentinel(...).master_for(...)` client;
discovered over the store's own connections, under asyncio and trio); a proxy, given as a URL
or a `redis.asyncio.Redis` whose configuration the store reads;
or a Redis Cluster (`redis+cluster://` or a `redis.asyncio.cluster.RedisCluster`),
where each transition goes to the master owning the record's slot, on that node's connection of
this event loop (`cluster.py`: slot map, MOVED/ASK, failover). On a cluster, waits
subscribe on the owner of the record: a script's PUBLISH is broadcast over the cluster bus, so
the subscriber hears it wherever the slot has moved since (sharded pub/sub would spare that
fan-out but would need other scripts for Redis < 7 and a re-subscription per migration). Durable
writes WAIT on the node that ran them (its own `GroupCommit`), and `list_records`/
`purge_expired` SCAN every master (a listing reads each batch on the node that listed it, and a
key that moved since on its owner). The one-Redis path pays one
`is None` test per call for all this.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Final

import anyio
import anyio.lowlevel
import redis.asyncio as aioredis
from redis import exceptions as rx
from redis.asyncio.cluster import ClusterNode, RedisCluster

from ..._system_task import current_loop, loop_alive
from .. import audit_key as audit_keys
from .. import history as chain
from .. import transitions as rules
from ..audit_key import AuditKey
from ..history import AuditEntry
from ..mark import STORE_FORMAT, Marking, StoreMark
from ..memory import DEFAULT_ORPHAN_RETENTION
from ..store import (
    DEFAULT_MAX_KEY_BYTES,
    DEFAULT_MAX_RESULT_BYTES,
    ClaimOutcome,
    ClaimStatus,
    CorruptRecord,
    LimitExceeded,
    Limits,
    Record,
    RecordState,
    StoreError,
    StoreUnavailable,
    check_list_limit,
    pass_over,
    tool_label,
)
from ..url_options import (
    boolean,
    integer,
    number,
    number_or_none,
    refused_option,
    string,
    take_options,
)
from . import history as audit_stream
from . import lua
from . import record as stored
from .cluster import CLUSTER_SCHEMES, MAX_REDIRECTS, REDIRECTS, Cluster, NodeId
from .cluster import redirect as _redirect
from .cluster import seeds_of_url as _seeds_of_url
from .doubt import Doubts
from .durable import GroupCommit
from .endpoint import Endpoint
from .link import Link
from .sentinel import SENTINEL_SCHEMES
from .waiters import Waiters
from .wire import (
    ConnectionLost,
    ReplyError,
    ReplyTimeout,
    Traffic,
    Unreachable,
    command,
    pack,
)

logger = logging.getLogger(__name__)

DEFAULT_PREFIX: Final = "mcp-once:"
#: The record format this release writes: 3, records carrying their history (scripts/lib.lua).
#: `record_format=2` writes what the release before it did, for a rolling upgrade.
RECORD_FORMAT: Final = 3
#: Seconds to wait for a reply before the connection is given up (and to connect, by default).
DEFAULT_SOCKET_TIMEOUT: Final = 5.0
#: The record header stores the fingerprint's length in two bytes; real ones are 64 hex chars.
MAX_FINGERPRINT_BYTES: Final = 1024
#: Durations are sent as integer microseconds; past ~31 years Lua's doubles would round them.
MAX_SECONDS: Final = 1e9
#: The in-doubt index's key, after the prefix (scripts/lib.lua: index).
IN_DOUBT_INDEX: Final = b"in-doubt"
#: Seconds one process may take to build the in-doubt index before another may (a scan of
#: every record: ~70 s per million on one Redis).
BUILD_LOCK: Final = 600.0
#: How many keys one SCAN step asks for, and how many records one pipelined read carries.
SCAN_BATCH: Final = 500
#: The same for a scan that reads on to the end (a listing whose filter few records pass, the
#: histories of `audit verify`): fewer round trips, each still a short command for the server.
LONG_SCAN_BATCH: Final = 2000

#: The options of `from_url` a URL's query may carry, each with its parser.
URL_OPTIONS: Final = {
    "prefix": string,
    "max_key_bytes": integer,
    "max_result_bytes": integer,
    "orphan_retention": number,
    "wait_replicas": integer,
    "wait_timeout": number,
    "wait_aof": boolean,
    "socket_timeout": number_or_none,
    "history": boolean,
    "audit_stream": boolean,
    "record_format": integer,
    "audit_key": string,  # checked by the constructor, which never quotes it
    "audit_key_file": string,
}
#: Server replies that mean "not now" rather than "you are wrong": fail closed, retry later.
_TRANSIENT_REPLIES: Final = (
    "BUSY",
    "LOADING",
    "MASTERDOWN",
    "NOREPLICAS",
    "TRYAGAIN",
    "OOM",
    "READONLY",
    "CLUSTERDOWN",
)
_ASKING: Final = command(b"ASKING")
#: A script's arguments after its offset.
_Args = tuple[bytes | str | int, ...]


class ReplicationUnconfirmed(StoreUnavailable):
    """Fewer replicas (or AOF fsyncs) than `wait_replicas`/`wait_aof` asked for acknowledged a
    write within `wait_timeout`, so a failover could still lose it.

    After a claim the store releases the claim again (`applied` is False): the tool must not
    run on a claim a failover could forget, since a second worker could then claim the key too.
    After a complete the result stays stored on the primary (`applied` is True) but is not known
    to survive a failover; the caller decides whether to answer anyway. Being a
    `StoreUnavailable`, the server layer fails closed on it like on an unreachable store.
    """

    def __init__(self, key: str, *, wanted: str, acked: str, applied: bool, timeout: float) -> None:
        done = "is stored on the primary" if applied else "was withdrawn"
        super().__init__(
            f"the write for key {key!r} was confirmed by {acked} within {timeout}s,"
            f" not {wanted}; it {done}"
        )
        self.key = key
        self.wanted = wanted
        self.acked = acked
        self.applied = applied


class DurabilityUnsupported(StoreError):
    """The server cannot give the durability the store was configured to wait for
    (`WAITAOF` needs Redis 7.2 or later). Nothing was written."""


class _Here:
    """What one store holds on one event loop for one Redis: its command connection, and (made
    on first use) the waiters' subscriber connection and the durable writes' connection. On a
    cluster, the loop's holder also holds one of these per node, and the map read in flight."""

    __slots__ = ("_durable", "_traffic", "_waiters", "endpoint", "main", "nodes", "refreshing")

    def __init__(self, endpoint: Endpoint, traffic: Traffic) -> None:
        self.endpoint = endpoint
        self._traffic = traffic
        self.main = Link(endpoint, traffic)
        self._waiters: Waiters | None = None
        self._durable: GroupCommit | None = None
        #: Cluster only: each node's connections on this loop, and the slot map read under way.
        self.nodes: dict[NodeId, _Here] = {}
        self.refreshing: anyio.Event | None = None

    def node(self, cluster: Cluster, node: NodeId) -> _Here:
        held = self.nodes.get(node)
        if held is None:
            held = self.nodes[node] = _Here(cluster.endpoint(node), self._traffic)
        return held

    def waiters(self) -> Waiters:
        if self._waiters is None:
            self._waiters = Waiters(self.endpoint, self._traffic)
        return self._waiters

    def durable(self, wait: bytes) -> GroupCommit:
        if self._durable is None:
            self._durable = GroupCommit(Link(self.endpoint, self._traffic), wait)
        return self._durable

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()
        links = [self.main]
        if self._waiters is not None:
            links.append(self._waiters.link)
        if self._durable is not None:
            links.append(self._durable.link)
        for link in links:
            # A loop that is already closed refuses even to be told; its sockets go with it.
            with contextlib.suppress(RuntimeError):
                link.close()


class RedisKeyStore:
    """Records in Redis, safe across processes and hosts. Implements `KeyStore`."""

    def __init__(
        self,
        client: aioredis.Redis | RedisCluster,
        *,
        prefix: str = DEFAULT_PREFIX,
        max_key_bytes: int = DEFAULT_MAX_KEY_BYTES,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        orphan_retention: float = DEFAULT_ORPHAN_RETENTION,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
        wait_aof: bool = False,
        history: bool = True,
        audit_stream: bool = False,
        record_format: int = RECORD_FORMAT,
        audit_key: str | bytes | AuditKey | None = None,
        audit_key_file: str | os.PathLike[str] | None = None,
    ) -> None:
        """Connect where `client` connects, as it would (URL, TLS, credentials, database,
        timeouts, Sentinel). The store opens connections of its own and never uses the
        client's; `aclose` leaves the client open (its owner closes it).

        A `redis.asyncio.cluster.RedisCluster` gives its startup nodes (the seeds) and their
        connection options; the store reads the slot map itself. So the client never needs
        to be initialized, nor used by many calls at once before it is (redis-py 8.1's asyncio
        cluster client fails when ~30 concurrent first calls initialize it together).

        The client must return bytes (`decode_responses=False`), as a sign it is configured
        for binary results like the store's own connections.

        `history`: keep each record's history inside the record (rules 20 and 24, format 3,
        `scripts/lib.lua`), written by the transition's own script. On by default; off only to
        measure its cost. `audit_stream`: also append each event to the prefix's audit stream
        (`{prefix}audit`), in the same script, for a reader that follows every record (a SIEM);
        off by default, when `mcp-once audit` reads the histories. Not on a Redis Cluster, where
        the histories are always the audit trail (`history.py`).
        `record_format=2`: write records as the release before format 3 did (no history, no
        stream), so that a fleet mixing that release with this one keeps working during a
        rolling upgrade; every record, format 3 included, is still read. Lifting it (the
        default, 3) starts histories (docs/operations.md, "Upgrading").
        `audit_key` (or `audit_key_file`, else `$MCP_ONCE_AUDIT_KEY` or
        `$MCP_ONCE_AUDIT_KEY_FILE`): MAC and seal the histories (`audit_key.py`); each script is
        given its record's own key, never this one.
        """
        if "{" in prefix or "}" in prefix:
            raise ValueError(
                f"the prefix must not contain braces (they mark the hash tag): {prefix!r}"
            )
        cluster: Cluster | None = None
        if isinstance(client, RedisCluster):
            seeds = [(str(node.host), int(node.port)) for node in client.startup_nodes]
            # A cluster node carries what a pool does: the connection class and its options.
            pool: Any = client.startup_nodes[0]
        else:
            pool = client.connection_pool
        connection_kwargs: dict[str, Any] = pool.connection_kwargs
        if connection_kwargs.get("decode_responses"):
            raise ValueError("RedisKeyStore needs a client with decode_responses=False")
        if wait_replicas < 0:
            raise ValueError(f"wait_replicas must be >= 0, not {wait_replicas}")
        _check_history_options(
            history, audit_stream, record_format, cluster=isinstance(client, RedisCluster)
        )
        endpoint = Endpoint.of_pool(pool)
        if isinstance(client, RedisCluster):
            cluster = Cluster(endpoint, seeds)
        durable = wait_replicas > 0 or wait_aof
        if durable:
            if not (math.isfinite(wait_timeout) and wait_timeout > 0):
                raise ValueError(
                    f"wait_timeout must be a positive number of seconds: {wait_timeout!r}"
                )
            if endpoint.timeout is not None and endpoint.timeout <= wait_timeout:
                raise ValueError(
                    f"socket_timeout ({endpoint.timeout}s) must exceed wait_timeout"
                    f" ({wait_timeout}s), or every durable write would time out"
                )
        self._endpoint = endpoint
        self._cluster = cluster
        self._traffic = Traffic()
        self._loops: dict[object, _Here] = {}
        self._doubts = Doubts()
        self._prefix = prefix
        self._prefix_bytes = prefix.encode()
        #: The in-doubt index (scripts/lib.lua: index); none on a cluster, where one set could
        #: not be in every record's slot.
        self._index = b"" if cluster is not None else self._prefix_bytes + IN_DOUBT_INDEX
        #: The prefix's mark (`mark.py`), written once by this object, before its first claim.
        self._mark_key = self._prefix_bytes + b"meta"
        self._marking = Marking()
        self._limits = Limits(max_key_bytes, max_result_bytes)
        self._orphan_retention_us = _micros("orphan_retention", orphan_retention)
        self._offset_us = 0
        self._wait_replicas = wait_replicas
        self._wait_timeout = wait_timeout
        self._wait_aof = wait_aof
        self._durable = durable
        self._durability_checked = False
        #: Histories are written (format 3); off with history=False or record_format=2.
        self._history = history and record_format == RECORD_FORMAT
        self._audit_stream = audit_stream
        #: The audited scripts' trailers (`_trailer`) when nothing is said, built once: most
        #: transitions send one of these.
        stream = self._prefix_bytes + b"audit" if audit_stream else b"-"
        self._stream = stream if self._history else b""
        self._quiet_trailer = (self._index, b"", self._stream, b"")
        #: The key this store MACs and seals histories with; None: plain digests.
        self.audit_key = audit_keys.resolve(audit_key, audit_key_file)
        # wait(): the first re-read after no news, doubling up to the cap (missed messages).
        self._poll_first = 0.05
        self._poll_cap = 1.0

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        max_key_bytes: int = DEFAULT_MAX_KEY_BYTES,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        orphan_retention: float = DEFAULT_ORPHAN_RETENTION,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
        wait_aof: bool = False,
        history: bool = True,
        audit_stream: bool = False,
        record_format: int = RECORD_FORMAT,
        audit_key: str | bytes | AuditKey | None = None,
        audit_key_file: str | os.PathLike[str] | None = None,
        socket_timeout: float | None = DEFAULT_SOCKET_TIMEOUT,
        **redis_kwargs: Any,
    ) -> RedisKeyStore:
        """A store for the Redis at `url`. Connects lazily; `aclose` closes its connections.

        `redis+cluster://host:port[,host:port...]` (`rediss+cluster://` with TLS) names the
        seed nodes of a Redis Cluster; credentials and options are written as for `redis://`,
        and the database, if named, must be 0.
        `redis+sentinel://[user:pass@]host:port[,host:port...]/service_name[/db]` finds the
        primary through Sentinel, again after a failover (`sentinel.py`);
        `rediss+sentinel://` does so over TLS, to the Sentinels and the data nodes alike.

        `socket_timeout` bounds the wait for each reply (None: forever); a late reply gives the
        connection up and the call fails with `StoreUnavailable`. `socket_connect_timeout`
        defaults to `socket_timeout`. Other `redis_kwargs` are redis-py's connection options
        (`password`, `username`, `ssl_*`, `client_name`, `socket_keepalive_options`, ...).

        Every keyword option above may be written in the URL's query instead
        (`redis://host:6379/0?wait_replicas=1&wait_aof=true&socket_timeout=none`), so that a
        single configuration string (`open_store`, `mcp-once --store`) carries them; a URL option
        wins over the keyword, as redis-py's own URL options do. They are parsed strictly
        (`url_options.py`); the rest of the query is redis-py's, and an option that is neither
        ours nor one redis-py accepts is a `ValueError` naming it.
        """
        url, settings = take_options(url, URL_OPTIONS, locals())
        socket_timeout = settings.pop("socket_timeout")
        try:
            return cls._from_url(url, settings, socket_timeout, redis_kwargs)
        except TypeError as exc:
            refused = refused_option(exc, url)
            if refused is None:
                raise
            raise ValueError(
                f"unknown key store URL option {refused!r}: neither a RedisKeyStore option"
                f" ({', '.join(URL_OPTIONS)}) nor one redis-py accepts in this kind of URL"
            ) from None

    @classmethod
    def _from_url(
        cls,
        url: str,
        settings: dict[str, Any],
        socket_timeout: float | None,
        redis_kwargs: dict[str, Any],
    ) -> RedisKeyStore:
        if redis_kwargs.get("decode_responses"):
            raise ValueError("RedisKeyStore needs decode_responses=False: results are binary")
        redis_kwargs.setdefault("socket_connect_timeout", socket_timeout)
        client: aioredis.Redis | RedisCluster
        if url.startswith(CLUSTER_SCHEMES):
            seeds, first = _seeds_of_url(url)
            client = RedisCluster.from_url(
                first,
                startup_nodes=[ClusterNode(host, port) for host, port in seeds[1:]],
                socket_timeout=socket_timeout,
                **redis_kwargs,
            )
        elif url.startswith(SENTINEL_SCHEMES):
            from .sentinel import sentinel_client

            client = sentinel_client(url, socket_timeout=socket_timeout, **redis_kwargs)
        else:
            client = aioredis.Redis.from_url(url, socket_timeout=socket_timeout, **redis_kwargs)
        return cls(client, **settings)

    @property
    def prefix(self) -> str:
        """What every key of this store starts with (records, histories, audit stream, mark)."""
        return self._prefix

    def advance_clock_for_testing(self, seconds: float) -> None:
        """Move this store's view of the Redis clock forward, so tests need not sleep.

        Only forward: physical expiry runs on the real clock and must never come first.
        """
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"the clock only moves forward by finite seconds, not {seconds!r}")
        self._offset_us += round(seconds * 1_000_000)

    # -- transitions -------------------------------------------------------------------------

    async def claim(
        self,
        key: str,
        fingerprint: str,
        *,
        lease: float,
        takeover: bool,
        tool: str | None = None,
        resend_only: bool = False,
    ) -> ClaimOutcome:
        encoded = key.encode()
        if not 0 < len(encoded) <= self._limits.max_key_bytes:
            self._limits.check_key(key)  # raises, naming the limit
        fingerprint_bytes = stored.pack_fingerprint(fingerprint)
        if len(fingerprint_bytes) > MAX_FINGERPRINT_BYTES:
            raise LimitExceeded("fingerprint", len(fingerprint_bytes), MAX_FINGERPRINT_BYTES)
        rkey = self._rkey_of(encoded)
        if not self._marking.done:
            if self._durable:  # refused before anything is written, the mark included
                await self._check_durability()
            await self._marking(self._write_mark, f"under the prefix {self._prefix!r}")
        # A claim of ours that may have landed is claimed again under its own token: taken, so
        # that no concurrent claim re-sends it too, and given back if this try gets no answer
        # either (it may not even have been sent: the earlier one is still in doubt).
        doubted = self._doubts.take(rkey, "claim") if self._doubts.entries else None
        token = doubted or os.urandom(16).hex()
        args = (
            fingerprint_bytes,
            _micros("lease", lease),
            1 if takeover else 0,
            token,
            (tool_label(tool) or "").encode() if tool else b"",
            1 if resend_only else 0,
        )
        # Sent again after a lost reply, the claim says so (`resent`): see claim.lua.
        first, again = _resendable(doubted is not None, *args)
        trailer = self._trailer(rkey, chain.claimed(chain.said()) if self._history else "")
        first, again = (*first, *trailer), (*again, *trailer)
        try:
            if not self._durable:
                reply = await self._script(lua.CLAIM, rkey, first, again, doubt=("claim", token))
                return _claim_outcome(key, reply)
            reply, acks = await self._script(
                lua.CLAIM, rkey, first, again, doubt=("claim", token), durable=True
            )
        except BaseException:
            if doubted is not None:
                self._doubts.note(rkey, "claim", doubted)
            raise
        outcome = _claim_outcome(key, reply)
        if outcome.status is ClaimStatus.CLAIMED:
            problem = self._unconfirmed(acks)
            if problem is not None:
                assert outcome.token is not None
                # Withdrawn even if the caller is being cancelled; failing that, the lease
                # runs out and the claim ends as any abandoned one does.
                with anyio.CancelScope(shield=True), contextlib.suppress(StoreError):
                    await self.release(key, outcome.token)
                raise self._replication_error(key, problem, acks, applied=False)
        return outcome

    async def renew(self, key: str, token: str, *, lease: float) -> bool:
        lease_us = _micros("lease", lease)
        if not self._fits(key):
            return False
        args = (token, lease_us)
        return _done(key, await self._script(lua.RENEW, self._rkey(key), args, args))

    async def complete(
        self, key: str, token: str, result: bytes, *, retention: float, delivered: bool = False
    ) -> bool:
        self._limits.check_result(result)
        retention_us = _micros("retention", retention)
        rkey = self._rkey_if_fits(key)
        if rkey is None:
            return False
        doubt = ("complete", token)
        doubtful = bool(self._doubts.entries) and self._doubts.holds(rkey, *doubt)
        args, resent = _resendable(doubtful, token, retention_us, result)
        mark = 1 if delivered else 0
        said = ""
        if self._history:
            told = chain.said()
            verdict = chain.reconciled(told) if told.reconciled else ""
            said = ",".join(part for part in (verdict, chain.details(u=told.upstream)) if part)
        trailer = self._trailer(rkey, said)
        args, resent = (*args, mark, *trailer), (*resent, mark, *trailer)
        if not self._durable:
            return _done(key, await self._script(lua.COMPLETE, rkey, args, resent, doubt=doubt))
        reply, acks = await self._script(
            lua.COMPLETE, rkey, args, resent, doubt=doubt, durable=True
        )
        done = _done(key, reply)
        if done:
            problem = self._unconfirmed(acks)
            if problem is not None:
                raise self._replication_error(key, problem, acks, applied=True)
        return done

    async def release(self, key: str, token: str) -> bool:
        if not self._fits(key):
            return False
        rkey = self._rkey(key)
        doubt = ("release", token)
        doubtful = bool(self._doubts.entries) and self._doubts.holds(rkey, *doubt)
        args, resent = _resendable(doubtful, token, self._orphan_retention_us)
        told = chain.said()
        # A reconciliation's verdict (a=...) goes first in release.lua; else why it was released.
        trailer = self._trailer(
            rkey, chain.reconciled(told) if told.reconciled else chain.details(w=told.why)
        )
        args, resent = (*args, *trailer), (*resent, *trailer)
        return _done(key, await self._script(lua.RELEASE, rkey, args, resent, doubt=doubt))

    async def abandon(self, key: str, fence: int) -> bool:
        if not self._fits(key):
            return False
        args = (fence,)
        return _done(key, await self._script(lua.ABANDON, self._rkey(key), args, args))

    async def settle(
        self, key: str, *, result: bytes | None, retention: float, replacing: int | None = None
    ) -> bool:
        if result is not None:
            self._limits.check_result(result)
        retention_us = _micros("retention", retention)
        if not self._fits(key):
            return False
        args, resent = _resendable(
            False,
            0 if result is None else 1,
            retention_us,
            b"" if result is None else result,
            0 if replacing is None else replacing,
        )
        rkey = self._rkey(key)
        with chain.replacing_settle(replacing):
            told = chain.said()
        trailer = self._trailer(rkey, chain.settled(result is not None, told))
        args, resent = (*args, *trailer), (*resent, *trailer)
        return _done(key, await self._script(lua.SETTLE, rkey, args, resent))

    async def reconcile(
        self, key: str, fingerprint: str, fence: int, *, lease: float
    ) -> ClaimOutcome | None:
        if not self._fits(key):
            return None
        token = os.urandom(16).hex()
        lease_us = _micros("lease", lease)
        rkey = self._rkey(key)
        told = chain.claimed(chain.said(), "reconcile")
        args = (
            stored.pack_fingerprint(fingerprint), fence, lease_us, token,
            *self._trailer(rkey, told),
        )  # fmt: skip
        # Always safe to re-send as it is: reconcile.lua recognises its own token.
        if not self._durable:
            reply = await self._script(lua.RECONCILE, rkey, args, args)
            return None if reply == [b"lost"] else _claim_outcome(key, reply)
        reply, acks = await self._script(lua.RECONCILE, rkey, args, args, durable=True)
        if reply == [b"lost"]:
            return None
        outcome = _claim_outcome(key, reply)
        problem = self._unconfirmed(acks)
        if problem is not None:
            # As a claim is withdrawn: a failover could lose this hold, and a second resolver
            # would then ask too. Given back UNKNOWN; failing that, the hold runs out.
            assert outcome.token is not None
            with anyio.CancelScope(shield=True), contextlib.suppress(StoreError):
                await self.leave_unknown(key, outcome.token)
            raise self._replication_error(key, problem, acks, applied=False)
        return outcome

    async def leave_unknown(self, key: str, token: str) -> bool:
        if not self._fits(key):
            return False
        rkey = self._rkey(key)
        told = chain.said()
        # A reconciler's verdict (a=), or why its holder gave the execution up (w=).
        said = (
            chain.reconciled(told) if told.reconciled else chain.details(w=told.why, e=told.ended)
        )
        args = (token, *self._trailer(rkey, said))
        return _done(key, await self._script(lua.LEAVE_UNKNOWN, rkey, args, args))

    # -- reads -------------------------------------------------------------------------------

    async def get(self, key: str) -> Record | None:
        if not self._fits(key):
            return None
        return _visible(key, await self._script(lua.READ, self._rkey(key), (), ()))

    async def wait(self, key: str, *, timeout: float) -> Record | None:
        """Woken by the PUBLISH that complete/release/settle (and a claim turning the record
        UNKNOWN) send on the record's key name; re-reads on a doubling interval (50 ms to 1 s)
        as well, so a lost message costs latency, never a hang."""
        if not self._fits(key):
            return None
        with anyio.move_on_after(timeout):
            return await self._wait_for_change(key)
        return await self.get(key)

    async def _wait_for_change(self, key: str) -> Record | None:
        record = await self.get(key)
        if record is None or record.state is not RecordState.IN_PROGRESS:
            return record
        rkey = self._rkey(key)
        here = self._here()
        if self._cluster is not None:
            here = await self._owner(here, rkey)
        waiters = here.waiters()
        with self._reaching():
            async with waiters.watching(rkey) as watch:
                delay = self._poll_first
                while True:
                    record = await self.get(key)
                    if record is None or record.state is not RecordState.IN_PROGRESS:
                        return record
                    await watch.changed(delay)
                    delay = min(delay * 2, self._poll_cap)

    async def list_records(
        self,
        *,
        state: RecordState | None = None,
        tool: str | None = None,
        limit: int = 100,
        created_before: float | None = None,
    ) -> list[Record]:
        """The first `limit` records a SCAN of the prefix meets that pass the filters, oldest
        first among themselves (`oldest_first` is False): when more match, any `limit` of them,
        not the oldest, which only reading every record could find. A listing stops reading
        once it has `limit`: when most records match, it reads about `limit` of them, whatever
        the store's size; a filter few match reads on until it has found them (the whole store,
        when fewer than `limit` match, and then they are every match, oldest first).

        Records are read a batch at a time (`_get_many`: MGET, or pipelined GETs on their node
        on a cluster), only as many as are still wanted (more while a filter rejects them), and
        decoded here (`record.py`) against one TIME per node scanned: no script runs for a
        listing, so it costs the server little beside the requests. Records that cannot be read
        as ours are passed over (`pass_over`).

        In-doubt records (IN_PROGRESS and UNKNOWN) are read from their index instead, off a
        cluster (`_list_in_doubt`): what `keys list --state unknown` lists costs as many reads
        as there are records in doubt or running, however many the store holds, and they are
        all read, so the listing is the oldest of them."""
        check_list_limit(limit)
        if state in _IN_DOUBT and self._index:
            return await self._list_in_doubt(state, tool, limit, created_before)
        found: list[Record] = []
        if limit == 0:
            return found
        widen = 1  # records read per record still wanted: doubled each time a read falls short
        listed: set[str] = set()  # a key the scan repeats (see `_scan`) is listed once
        timed: _Here | None = None
        now = 0

        def step() -> int:  # a scan whose reads come short takes longer steps
            return SCAN_BATCH if widen < SCAN_BATCH else LONG_SCAN_BATCH

        async with contextlib.aclosing(self._scan(step=step)) as batches:
            async for here, rkeys in batches:
                if here is not timed:
                    timed, now = here, await self._now(here)
                start = 0
                while start < len(rkeys) and len(found) < limit:
                    chunk = rkeys[start : start + min(step(), (limit - len(found)) * widen)]
                    start += len(chunk)
                    for record in await self._read_records(here, chunk, now, state):
                        if (
                            len(found) < limit
                            and record.key not in listed
                            and rules.listed(record, state, tool, created_before)
                        ):
                            found.append(record)
                            listed.add(record.key)
                    widen = min(widen * 2, SCAN_BATCH) if len(found) < limit else widen
                if len(found) >= limit:
                    break
        found.sort(key=_listing_order)
        return found

    def oldest_first(self, state: RecordState | None) -> bool:
        """Whether `list_records(state=state)` cut at `limit` gives the oldest records: only
        for the in-doubt states off a cluster, read whole from their index; other listings stop
        at the first matches their scan meets (`KeyStore.list_records`)."""
        return state in _IN_DOUBT and bool(self._index)

    async def _now(self, here: _Here) -> int:
        """The Redis clock (of `here`'s node) in microseconds, with this store's test offset, as
        the scripts' `clock()` reads it."""
        seconds, micros = await self._plain(command(b"TIME"), here=here)
        return int(seconds) * 1_000_000 + int(micros) + self._offset_us

    async def _read_records(
        self, here: _Here, rkeys: Sequence[bytes], now: int, state: RecordState | None = None
    ) -> list[Record]:
        """The live records at `rkeys` (absent, expired and released ones left out), read on
        `here` (`_get_many`) and judged against `now` (microseconds); unreadable ones are passed
        over. `state`: only records stored in that state are decoded (the others are skipped
        by their state byte, unread, as SQLite skips their rows). On a cluster a key that moved
        since the scan is read at its new owner, with the READ script."""
        wanted = None if state is None else stored.CODES[state]
        live: list[Record] = []
        for rkey, raw in zip(rkeys, await self._get_many(here, rkeys), strict=True):
            if wanted is not None and type(raw) is bytes and len(raw) > 1 and raw[1] != wanted:
                continue
            key = self._key_of(rkey)
            try:
                if isinstance(raw, ReplyError):
                    record = await self._read_refused(key, rkey, raw)
                else:
                    record = None if raw is None else stored.decode(key, raw)
                    record = rules.visible(record, now / 1_000_000)
            except CorruptRecord as exc:
                pass_over(exc)
                continue
            if record is not None:
                live.append(record)
        return live

    async def _get_many(self, here: _Here, rkeys: Sequence[bytes]) -> list[Any]:
        """The values at `rkeys` on `here`: bytes, None for a key that is not there, or the
        `ReplyError` of its GET (WRONGTYPE; MOVED or ASK on a cluster). One MGET on one Redis
        (a GET per key that it answered nil for, which may be another type); a pipelined GET
        per key on a cluster node, where MGET would need one slot."""
        if self._cluster is None:
            replies = list(await self._plain(command(b"MGET", *rkeys), here=here))
            nil = [at for at, reply in enumerate(replies) if reply is None]
            if not nil:
                return replies
            again = await self._get_each(here, [rkeys[at] for at in nil])
            for at, reply in zip(nil, again, strict=True):
                replies[at] = reply
            return replies
        return await self._get_each(here, rkeys)

    async def _get_each(self, here: _Here, rkeys: Sequence[bytes]) -> list[Any]:
        replies = await self._plain(
            b"".join(command(b"GET", rkey) for rkey in rkeys), len(rkeys), here=here
        )
        return [replies] if len(rkeys) == 1 else list(replies)

    async def _read_refused(self, key: str, rkey: bytes, reply: ReplyError) -> Record | None:
        if reply.code == "WRONGTYPE":
            # As lib.lua's `load` words it for the scripts.
            raise CorruptRecord(key, f"the key holds another Redis type ({reply})")
        if self._cluster is not None and reply.code in REDIRECTS:
            return _visible(key, await self._script(lua.READ, rkey, (), ()))
        raise _translate(reply)

    async def _list_in_doubt(
        self, state: RecordState | None, tool: str | None, limit: int, created_before: float | None
    ) -> list[Record]:
        """`list_records` of one in-doubt state, from the in-doubt index (scripts/lib.lua:
        index): SSCAN plus one pipelined read per 500 members, each of which drops a member
        whose record left doubt meanwhile. An index not marked complete (a store written before
        it, or emptied by `delete_all`) is built first (`_build_index`)."""
        index = self._index
        await self._build_index(index)
        found: list[Record] = []
        seen: set[bytes] = set()  # SSCAN may repeat a member
        cursor = b"0"
        while True:
            step = command(b"SSCAN", index, cursor, b"COUNT", SCAN_BATCH)
            with self._reaching():
                cursor, members = await self._plain(step)
            rkeys = [m for m in members if m and m not in seen]
            seen.update(rkeys)
            if rkeys:
                replies = await self._script_many(lua.IN_DOUBT, rkeys)
                self._keep_listed(rkeys, replies, state, tool, created_before, found)
            if cursor == b"0":
                break
        found.sort(key=_listing_order)
        return found[:limit]

    async def _build_index(self, index: bytes) -> None:
        """Make sure the in-doubt index is complete: unless marked so, one process builds it by
        one scan of every record (each in doubt added by a script, atomically with its
        record), under a lock (`{prefix}in-doubt:building`, held at most `BUILD_LOCK`), while
        any other waits for the mark (every replica's gauge count starts at once after an
        upgrade: one scan, not one per replica). A builder that died leaves the lock to expire,
        and the next to find it gone builds."""
        lock = index + b":building"
        delay = 0.05
        while True:
            with self._reaching():
                if await self._plain(command(b"SISMEMBER", index, b"")):
                    return
                took = await self._plain(
                    command(b"SET", lock, b"1", b"NX", b"PX", int(BUILD_LOCK * 1000))
                )
            if took is not None:
                break
            await anyio.sleep(delay)  # another process is building it
            delay = min(delay * 2, 1.0)
        try:
            async for _, rkeys in self._scan():
                await self._script_many(lua.INDEX, rkeys)
            with self._reaching():
                await self._plain(command(b"SADD", index, b""))
        finally:
            with anyio.CancelScope(shield=True), contextlib.suppress(StoreError), self._reaching():
                await self._plain(command(b"DEL", lock))

    def _keep_listed(
        self,
        rkeys: Sequence[bytes],
        replies: Sequence[Any],
        state: RecordState | None,
        tool: str | None,
        created_before: float | None,
        found: list[Record],
    ) -> None:
        """Add to `found` the records read (`replies` to READ of `rkeys`) that are visible and
        pass the listing's filters; an unreadable one is passed over (`pass_over`)."""
        for rkey, reply in zip(rkeys, replies, strict=True):
            try:
                record = _visible(self._key_of(rkey), reply)
            except CorruptRecord as exc:
                pass_over(exc)
                continue
            if record is not None and rules.listed(record, state, tool, created_before):
                found.append(record)

    async def purge_expired(self) -> int:
        """Deletes records whose logical expiry has passed (SCAN over the prefix, as in
        `list_records`). Records Redis already expired on its own are not counted; unreadable
        ones are left for an operator."""
        purged = 0
        async for _, rkeys in self._scan():
            purged += sum(int(n) for n in await self._script_many(lua.PURGE, rkeys))
        return purged

    async def delete_all(self) -> int:
        """Deletes every key under this store's prefix, whatever it holds (records in progress,
        UNKNOWN, unreadable), and returns how many went. Keys outside the prefix are never
        touched.

        For a prefix one owner has to itself (a demo run, a test): on a prefix live servers
        share, it forgets the claims they hold and the results they would replay, so a retry
        runs the tool again. `mcp-once demo` uses it to leave a user's Redis as it found it.
        Each record's history goes with it, and so does the prefix's audit stream (rule 20)."""
        deleted = 0
        async for _, rkeys in self._scan():
            deleted += sum(int(n) for n in await self._script_many(lua.FORGET, rkeys))
        if self._cluster is None:  # a cluster keeps no stream (its histories are its trail)
            with self._reaching():
                await self._plain(
                    command(
                        b"UNLINK", self._prefix_bytes + b"audit", self._index,
                        self._index + b":building",
                    )
                )  # fmt: skip
        await self._script(lua.FORGET, self._mark_key, (), ())
        self._marking = Marking()  # this object's next claim marks the prefix again
        return deleted

    async def aclose(self) -> None:
        """Close this store's connections (on every event loop it used)."""
        loops, self._loops = self._loops, {}
        for here in loops.values():
            here.close()
        await anyio.lowlevel.checkpoint()

    # -- the store's mark (`mark.py`) ----------------------------------------------------------

    async def _write_mark(self) -> None:
        args = (STORE_FORMAT, 1)
        await self._script(lua.MARK, self._mark_key, args, args)

    async def mark(self) -> StoreMark | None:
        """The prefix's mark (the hash `{prefix}meta`); None before the first claim under the
        prefix, or when that key holds something else (another program's)."""
        args = (STORE_FORMAT, 0)
        found = await self._script(lua.MARK, self._mark_key, args, args)
        if not isinstance(found, list) or len(found) != 2:
            return None
        try:
            return StoreMark(int(found[0]), int(found[1]) / 1000)
        except ValueError:
            return None

    async def holds_anything(self) -> bool:
        """Whether a record (in any state) or a history is kept under the prefix, or its audit
        stream: SCAN stops at the first key found, so this costs a whole SCAN of the database
        only where the prefix holds nothing of ours (where it has no mark)."""
        if self._cluster is None:
            with self._reaching():
                if await self._plain(command(b"EXISTS", self._prefix_bytes + b"audit")):
                    return True
        async with contextlib.aclosing(
            self._scan(_glob_escape(self._prefix_bytes) + b"{*")
        ) as found:
            async for _ in found:
                return True
        return False

    # -- history (rule 20) -------------------------------------------------------------------

    def _trailer(self, rkey: bytes, said: str) -> tuple[bytes, bytes, bytes, bytes]:
        """An audited script's four last arguments (lib.lua): the in-doubt index ('' on a
        cluster), what the caller said, where the audit stream is ('' when this store writes
        no history; '-' when it keeps no stream, where the histories are the audit trail:
        `history.py`), and the record's history key ('' without an audit key:
        `RecordMac.script_argument`)."""
        if not self._history:
            return self._quiet_trailer
        if self.audit_key is None:
            return (self._index, said.encode(), self._stream, b"") if said else self._quiet_trailer
        mac = self.audit_key.record(self._key_of(rkey)).script_argument()
        return self._index, said.encode(), self._stream, mac

    async def history(self, key: str) -> str | None:
        """The record's history as stored (`history.parse` reads it); None: it has none."""
        if not self._fits(key):
            return None
        found = await self._script(lua.HISTORY, self._rkey(key), (), ())
        return None if found is None else _text(found)

    async def histories(self) -> list[tuple[str, str]]:
        """Every history kept, (record key, history), sorted by key."""
        return sorted([kept async for kept in self.iter_histories()])

    async def iter_histories(self) -> AsyncIterator[tuple[str, str]]:
        """Every history kept, (record key, history), in SCAN order, a batch at a time
        (`_get_many`, on the batch's node): what `mcp-once audit verify` reads, never holding
        more than a batch of histories (the scan remembers the keys it met, not their text)."""
        async with contextlib.aclosing(self._trails()) as trails:
            async for key, _, text in trails:
                yield key, text

    async def _trails(self) -> AsyncGenerator[tuple[str, str | None, str], None]:
        """Every history kept, (record key, tool, history), read with one scan of the prefix's
        record keys: the history inside each format-3 record (read with it), and the history
        key beside a record a release before wrote (`{prefix}{key}:h`), unless its record has
        since become format 3 (its history moved in: scripts/lib.lua). Unreadable records are
        passed over: `audit verify` reads the records too, and names those."""
        pattern = _glob_escape(self._prefix_bytes) + b"{*"
        async for here, keys in self._scan(pattern, once=True, step=lambda: LONG_SCAN_BATCH):
            records = [k for k in keys if k.endswith(b"}")]
            beside = [k[:-2] for k in keys if k.endswith(b"}:h")]
            if not records and not beside:
                continue
            hkeys = [rkey + b":h" for rkey in beside]
            values = await self._get_many(here, [*records, *beside, *hkeys])
            held = values[len(records) : len(records) + len(beside)]
            for rkey, raw in zip(records, values[: len(records)], strict=True):
                if isinstance(raw, ReplyError):  # moved since the scan: read where it is now
                    text = await self._moved_history(rkey, raw)
                    if text is not None:
                        yield self._key_of(rkey), None, _text(text)
                    continue
                record = self._decoded(rkey, raw)
                if record is not None and record.history is not None:
                    yield self._key_of(rkey), record.tool, record.history
            for rkey, raw, text in zip(beside, held, values[len(records) + len(beside) :],
                                       strict=True):  # fmt: skip
                if isinstance(raw, ReplyError):
                    continue  # its record moved: read with it above, or in its own batch
                record = self._decoded(rkey, raw)
                if record is not None and record.history is not None:
                    continue  # moved into its record, read with it
                if isinstance(text, ReplyError):
                    text = await self._moved_history(rkey, text)
                if text is not None:
                    yield self._key_of(rkey), record.tool if record else None, _text(text)

    def _decoded(self, rkey: bytes, raw: Any) -> Record | None:
        """The record (with the history inside it, if format 3) of a record's bytes; None when
        absent or unreadable."""
        if type(raw) is not bytes:
            return None
        try:
            return stored.decode(self._key_of(rkey), raw)
        except CorruptRecord:
            return None

    async def _moved_history(self, rkey: bytes, reply: ReplyError) -> Any:
        """On a cluster, the history of a record whose key (or history key) moved since the
        scan, read at its new owner. Any other refusal is raised."""
        if self._cluster is None or reply.code not in REDIRECTS:
            raise _translate(reply)
        return await self._script(lua.HISTORY, rkey, (), ())

    async def audit(self, *, since: float | None = None, limit: int = 1000) -> list[AuditEntry]:
        """The audit stream from `since` (seconds, Redis clock) on, oldest first; without one
        (the default, and on a cluster), every history's events merged by time
        (`history.py`): a read of every record, which `mcp-once audit --follow` repeats at
        each poll (docs/operations.md says what that costs)."""
        if not self._audit_stream:
            kept = [trail async for trail in self._trails()]
            return audit_stream.from_histories(kept, since, limit)
        # Entry ids are the Redis clock's milliseconds, without this store's test offset.
        start = b"-"
        if since is not None:
            start = str(max(0, math.floor(since * 1000 - self._offset_us / 1000))).encode()
        step = command(b"XRANGE", self._prefix_bytes + b"audit", start, b"+", b"COUNT", limit)
        found = audit_stream.entries(await self._plain(step))
        return [e for e in found if since is None or e.event.written >= since]

    # -- plumbing ----------------------------------------------------------------------------

    def _fits(self, key: str) -> bool:
        """Whether a record could exist for `key`; one that could not is simply absent."""
        return self._rkey_if_fits(key) is not None

    def _rkey_if_fits(self, key: str) -> bytes | None:
        """`key`'s Redis key if a record could exist for it, else None (encoded once)."""
        try:
            encoded = key.encode()
        except UnicodeEncodeError:
            return None
        if not 0 < len(encoded) <= self._limits.max_key_bytes:
            return None
        return self._rkey_of(encoded)

    def _rkey(self, key: str) -> bytes:
        return self._rkey_of(key.encode())

    def _rkey_of(self, encoded: bytes) -> bytes:
        """The Redis key of an encoded record key, `{prefix}{key}` with the key as its own hash
        tag (the one place it is spelt; `_key_of` reads it back)."""
        return self._prefix_bytes + b"{" + encoded + b"}"

    def _key_of(self, rkey: bytes) -> str:
        return rkey[len(self._prefix_bytes) + 1 : -1].decode(errors="replace")

    def _here(self) -> _Here:
        """This store's connections on the running event loop."""
        try:
            loop: object = asyncio.get_running_loop()
        except RuntimeError:
            loop = current_loop()
        here = self._loops.get(loop)
        if here is None:
            for gone in [other for other in self._loops if not loop_alive(other)]:
                self._loops.pop(gone).close()
            here = self._loops[loop] = _Here(self._endpoint, self._traffic)
        return here

    async def _scan(
        self,
        pattern: bytes | None = None,
        *,
        once: bool = False,
        step: Callable[[], int] = lambda: SCAN_BATCH,
    ) -> AsyncGenerator[tuple[_Here, list[bytes]], None]:
        """Every record key under the prefix (or every key matching `pattern`), in batches:
        of the one Redis, or of every master, each batch with the connections of its node.

        SCAN may return a key twice (while Redis rehashes), and a migrating key may sit on two
        nodes. `once`: never yield a key twice, remembering every key met (about 0.1 KB each);
        without it the caller copes with a repeat (a purge's scripts find nothing the second
        time; a listing drops a record it already has), and the scan remembers nothing.
        `step`: the COUNT of the next SCAN, asked before each."""
        here = self._here()
        cluster = self._cluster
        if cluster is None:
            nodes = [here]
        else:
            if not cluster.masters():
                await self._refresh(here, cluster.generation)
            nodes = [here.node(cluster, node) for node in cluster.masters()]
        pattern = pattern or _glob_escape(self._prefix_bytes) + b"{*}"
        seen: set[bytes] = set()
        for node_here in nodes:
            cursor = b"0"
            while True:
                asked = command(b"SCAN", cursor, b"MATCH", pattern, b"COUNT", step())
                reply = await self._plain(asked, here=node_here)
                cursor, keys = reply[0], reply[1]
                fresh = keys
                if once:
                    fresh = [k for k in keys if k not in seen]
                    seen.update(fresh)
                if fresh:
                    yield node_here, fresh
                if cursor == b"0":
                    break

    async def _script(
        self,
        script: lua.Script,
        rkey: bytes,
        args: tuple[bytes | str | int, ...],
        resent: tuple[bytes | str | int, ...],
        *,
        doubt: tuple[str, str] | None = None,
        durable: bool = False,
    ) -> Any:
        """Run one transition script; `resent` are its arguments for a re-send after the
        first reply was lost, `doubt` names it for `Doubts`. `durable`: followed by
        WAIT/WAITAOF, grouped with the other durable writes of this loop
        (`durable.py`), and the answer is (reply, acknowledgements).

        On a cluster: sent to the slot's owner, following MOVED and ASK, and once more to
        the owner named by a fresh slot map when the node could not be reached.

        The common case (one Redis, no WAIT, a live connection) is tried first with nothing
        but the send and the wait: at one caller the store's own Python between two round
        trips is a visible share of a pair's time. Anything else it meets (an error reply,
        a lost connection) is handed, as the outcome of that first try, to `_script_fully`,
        which decides on it exactly as if it had sent the command itself."""
        if self._cluster is None and not durable:
            wire = self._here().main.current
            if wire is not None and wire.dead is None:
                early: object
                try:
                    early = await wire.request(
                        pack((*script.evalsha, rkey, self._offset_us, *args))
                    )
                except rx.RedisError as exc:
                    early = exc
                else:
                    if not isinstance(early, ReplyError):
                        if doubt is not None and self._doubts.entries:
                            self._doubts.settle(rkey, *doubt)
                        return early
                return await self._script_fully(early, script, rkey, args, resent, doubt, False)
        return await self._script_fully(None, script, rkey, args, resent, doubt, durable)

    async def _script_fully(
        self, early: object, script: lua.Script, rkey: bytes, args: _Args, resent: _Args,
        doubt: tuple[str, str] | None, durable: bool,
    ) -> Any:  # fmt: skip
        """`_script`, every case; `early`: the outcome (a reply, or the `RedisError` the wait
        raised) of a first try already made on this loop's connection with `args`, or None."""
        here = self._here()
        cluster = self._cluster
        seen = 0
        if cluster is not None:
            seen = cluster.generation
            here = await self._owner(here, rkey)
        if durable:
            await self._check_durability()
        asking = b""  # ASKING, for the one command sent after an ASK redirect
        redirects = 0
        body: tuple[bytes | str | int, ...] = (
            *script.evalsha,
            rkey,
            self._offset_us,
        )
        again = False
        written = False  # whether the first try's bytes were handed to the socket
        while True:
            link = here.main
            chunk = pack((*body, *args))
            try:
                if early is not None:
                    outcome, early = early, None
                    # An error reply is a value (`ReplyError`), judged below with the others.
                    if isinstance(outcome, rx.RedisError) and not isinstance(outcome, ReplyError):
                        raise outcome
                    answer = reply = outcome
                elif not durable:
                    wire = link.current
                    if wire is None or wire.dead is not None:
                        wire = await link.wire()
                    if asking:
                        answer = reply = (await wire.request(asking + chunk, 2))[1]
                    else:
                        answer = reply = await wire.request(chunk)
                else:
                    group = here.durable(self._wait_command())
                    link = group.link
                    if asking:
                        # Off the group: ASKING must come right before its script. WAIT still
                        # confirms every write made before it on this connection.
                        replies: Any = await link.call(asking + chunk + group.wait, 3)
                        answer = (reply := replies[1], replies[2])
                    else:
                        answer = await group.write(chunk)
                        reply = answer[0]
            except ConnectionLost as exc:
                if not again:
                    again, written = True, exc.written
                    args = resent if exc.written else args
                    if cluster is not None:
                        try:
                            here, asking = await self._rerouted(rkey, seen), b""
                        except StoreError:  # no map to follow: what may have landed is noted
                            raise self._failed(exc, rkey, doubt, written) from exc
                    continue
                raise self._failed(exc, rkey, doubt, written) from exc
            except Unreachable as exc:  # nothing was sent: on a cluster, a failover?
                if cluster is not None and not again:
                    again = True
                    here, asking = await self._rerouted(rkey, seen), b""
                    continue
                raise self._failed(exc, rkey, doubt, written) from exc
            except rx.RedisError as exc:  # unreachable, or no reply in time
                raise self._failed(exc, rkey, doubt, written) from exc
            if isinstance(reply, ReplyError):
                if reply.code == "NOSCRIPT" and body[0] == b"EVALSHA":
                    body = (b"EVAL", script.source, *body[2:])  # a flushed script cache
                    continue
                if cluster is not None and reply.code in REDIRECTS and redirects < MAX_REDIRECTS:
                    redirects += 1
                    here, asking = self._redirected(cluster, reply)
                    continue
                raise self._refused(reply, link)
            if doubt is not None and self._doubts.entries:
                self._doubts.settle(rkey, *doubt)
            return answer

    # -- cluster routing -----------------------------------------------------------------------

    async def _owner(self, here: _Here, rkey: bytes) -> _Here:
        """The connections, on this loop, to the master owning `rkey`'s slot."""
        cluster = self._cluster
        assert cluster is not None
        node = cluster.owner(rkey)
        if node is None:
            await self._refresh(here, cluster.generation)
            node = cluster.owner(rkey)
            if node is None:
                raise StoreUnavailable("no Redis Cluster node serves this record's slot now")
        return here.node(cluster, node)

    async def _rerouted(self, rkey: bytes, seen: int) -> _Here:
        """After a node failed under a call: a fresh map (unless one was read since `seen`)
        and the slot's owner in it."""
        here = self._here()
        await self._refresh(here, seen)
        return await self._owner(here, rkey)

    def _redirected(self, cluster: Cluster, reply: ReplyError) -> tuple[_Here, bytes]:
        """Where a MOVED or ASK reply sends the command, and the prefix it needs there."""
        ask, slot, node = _redirect(reply)
        if not ask:
            cluster.moved(slot, node)
        return self._here().node(cluster, node), (_ASKING if ask else b"")

    async def _refresh(self, here: _Here, seen: int) -> None:
        """Read the slot map, once per loop at a time; not at all if it changed since `seen`."""
        cluster = self._cluster
        assert cluster is not None
        if cluster.generation != seen:
            return
        if here.refreshing is not None:
            await here.refreshing.wait()
            return
        here.refreshing = done = anyio.Event()
        try:

            async def ask(node: NodeId, chunk: bytes) -> Any:
                return await self._plain(chunk, here=here.node(cluster, node))

            await cluster.refresh(ask)
        finally:
            here.refreshing = None
            done.set()

    # -- commands that are safe to repeat ------------------------------------------------------

    async def _plain(self, chunk: bytes, count: int = 1, *, here: _Here | None = None) -> Any:
        """Commands that are safe to repeat (reads, SCAN, SCRIPT LOAD, INFO), sent again once
        on a fresh connection if the first one died under them. `here`: another node's."""
        link = (here or self._here()).main
        for attempt in range(2):
            try:
                return await link.call(chunk, count)
            except ConnectionLost as exc:
                if attempt == 0:
                    continue
                raise _translate(exc) from exc
            except rx.RedisError as exc:
                raise _translate(exc) from exc
        raise AssertionError("unreachable")

    async def _script_many(self, script: lua.Script, rkeys: Sequence[bytes]) -> list[Any]:
        """One script per key, pipelined: one round trip per batch (per node on a cluster),
        each key its own slot. On a cluster a key redirected meanwhile is run on its own."""
        here = self._here()
        cluster = self._cluster
        if cluster is None:
            return await self._script_batch(script, rkeys, here)
        groups: dict[NodeId, list[bytes]] = {}
        for rkey in rkeys:
            node = cluster.owner(rkey) or cluster.masters()[0]  # a wrong guess is redirected
            groups.setdefault(node, []).append(rkey)
        replies: dict[bytes, Any] = {}
        for node, group in groups.items():
            batch = await self._script_batch(script, group, here.node(cluster, node))
            replies.update(zip(group, batch, strict=True))
        for rkey, reply in replies.items():
            if isinstance(reply, ReplyError):
                args = self._trailer(rkey, "") if script.audited else ()
                replies[rkey] = await self._script(script, rkey, args, args)
        return [replies[rkey] for rkey in rkeys]

    async def _script_batch(
        self, script: lua.Script, rkeys: Sequence[bytes], here: _Here
    ) -> list[Any]:
        """`_script_many` on one Redis (node); error replies are returned on a cluster, where
        they may be redirects, and raised on one Redis."""
        for _ in range(2):
            chunk = b"".join(
                command(
                    *script.evalsha,
                    rkey,
                    self._offset_us,
                    *(self._trailer(rkey, "") if script.audited else ()),
                )
                for rkey in rkeys
            )
            replies = await self._plain(chunk, len(rkeys), here=here)
            if len(rkeys) == 1:
                replies = [replies]
            if not any(isinstance(r, ReplyError) and r.code == "NOSCRIPT" for r in replies):
                break
            await self._plain(command(b"SCRIPT", b"LOAD", script.source), here=here)
        if self._cluster is None:
            for reply in replies:
                if isinstance(reply, ReplyError):
                    raise _translate(reply) from reply
        return list(replies)

    def _failed(
        self,
        exc: rx.RedisError,
        rkey: bytes,
        doubt: tuple[str, str] | None,
        written_before: bool = False,
    ) -> StoreError:
        """The error for a call that got no answer; remembers a write that may have landed,
        also when only the first try was written and the re-send could not even connect
        (a failover: the claim may have reached a replica before its primary died)."""
        landed = (
            written_before
            or isinstance(exc, ReplyTimeout)
            or (isinstance(exc, ConnectionLost) and exc.written)
        )
        if landed and doubt is not None:
            what, token = doubt
            self._doubts.note(rkey, what, token)
        return _translate(exc)

    def _refused(self, reply: ReplyError, link: Link) -> StoreError:
        if self._cluster is not None and reply.code in REDIRECTS:
            return StoreUnavailable(f"the Redis Cluster kept redirecting the call: {reply}")
        if reply.code == "READONLY":
            # A demoted primary (a failover): the next call connects afresh, and through
            # Sentinel finds the new primary.
            link.drop()
        return _translate(reply)

    def _wait_command(self) -> bytes:
        wait_ms = max(1, math.ceil(self._wait_timeout * 1000))
        if self._wait_aof:
            return command(b"WAITAOF", 1, self._wait_replicas, wait_ms)
        return command(b"WAIT", self._wait_replicas, wait_ms)

    async def _check_durability(self) -> None:
        if self._durability_checked or not self._wait_aof:
            return
        info = await self._plain(command(b"INFO", b"server"))
        version = _info_field(info, "redis_version") or "0"
        if _version(version) < (7, 2):
            raise DurabilityUnsupported(
                f"wait_aof=True needs WAITAOF (Redis 7.2 or later); this server is {version}"
            )
        self._durability_checked = True

    def _unconfirmed(self, acks: Any) -> str | None:
        """None when the acknowledgements meet the configuration, else what was confirmed."""
        if isinstance(acks, Exception):
            return f"nothing (the server refused to wait: {acks})"
        if self._wait_aof:
            local, replicas = int(acks[0]), int(acks[1])
            if local >= 1 and replicas >= self._wait_replicas:
                return None
            return f"{local} local AOF fsync(s) and {replicas} replica(s)"
        replicas = int(acks)
        if replicas >= self._wait_replicas:
            return None
        return f"{replicas} replica(s)"

    def _replication_error(
        self, key: str, acked: str, acks: Any, *, applied: bool
    ) -> ReplicationUnconfirmed:
        wanted = f"{self._wait_replicas} replica(s)"
        if self._wait_aof:
            wanted = f"1 local AOF fsync and {wanted}"
        error = ReplicationUnconfirmed(
            key, wanted=wanted, acked=acked, applied=applied, timeout=self._wait_timeout
        )
        if isinstance(acks, Exception):
            error.__cause__ = acks
        logger.warning("%s", error)
        return error

    @contextlib.contextmanager
    def _reaching(self) -> Iterator[None]:
        """Turn every connection failure into the store's own errors, cause chained."""
        try:
            yield
        except rx.RedisError as exc:
            raise _translate(exc) from exc


def _translate(exc: Exception) -> StoreError:
    if isinstance(exc, rx.ConnectionError | rx.TimeoutError | OSError):
        return StoreUnavailable(f"the Redis key store could not be reached: {exc}")
    if str(exc).startswith(REDIRECTS):
        return StoreError(
            f"the Redis key store is a Redis Cluster node ({exc}); name it redis+cluster://"
        )
    if str(exc).startswith(_TRANSIENT_REPLIES):
        return StoreUnavailable(f"the Redis key store cannot serve writes now: {exc}")
    return StoreError(f"the Redis key store failed: {exc!r}")


def _resendable(
    doubtful: bool, *args: bytes | str | int
) -> tuple[tuple[bytes | str | int, ...], tuple[bytes | str | int, ...]]:
    """A write's arguments as first sent, and as re-sent after a lost reply (the trailing
    flag that accepts its own effect as success). A write in doubt goes out as a re-send."""
    resent = (*args, 1)
    return (resent if doubtful else (*args, 0)), resent


def _info_field(info: Any, name: str) -> str | None:
    text = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        field, _, value = line.partition(":")
        if field == name:
            return value.strip()
    return None


def _check_history_options(
    history: bool, audit_stream: bool, record_format: int, *, cluster: bool
) -> None:
    """Refuse a combination of history options that cannot be kept, naming it."""
    if record_format not in (2, RECORD_FORMAT):
        raise ValueError(
            f"record_format must be 2 (the release before format 3 reads it) or {RECORD_FORMAT},"
            f" not {record_format!r}"
        )
    if not audit_stream:
        return
    if cluster:
        raise ValueError(
            "audit_stream=true is not available on a Redis Cluster: its histories are the"
            " audit trail (`mcp-once audit` reads them)"
        )
    if not history or record_format != RECORD_FORMAT:
        raise ValueError(
            "audit_stream=true needs the histories it chains to: not with history=false or"
            " record_format=2"
        )


def _micros(what: str, seconds: float) -> int:
    if not (math.isfinite(seconds) and abs(seconds) <= MAX_SECONDS):
        raise ValueError(f"{what} must be a finite number of seconds (at most 1e9): {seconds!r}")
    return round(seconds * 1_000_000)


def _seconds(micros: Any) -> float:
    return int(micros) / 1_000_000


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _failed(key: str, reply: Any) -> StoreError:
    if isinstance(reply, list) and reply and reply[0] == b"corrupt":
        return CorruptRecord(key, _text(reply[1]))
    return StoreError(f"the Redis key store sent an unexpected reply for key {key!r}")


def _done(key: str, reply: Any) -> bool:
    if reply == [b"ok"]:
        return True
    if reply == [b"lost"]:
        return False
    raise _failed(key, reply)


def _claim_outcome(key: str, reply: Any) -> ClaimOutcome:
    kind = reply[0] if isinstance(reply, list) and reply else None
    if kind == b"claimed":
        return ClaimOutcome(
            ClaimStatus.CLAIMED,
            token=_text(reply[1]),
            fence=int(reply[2]),
            attempts=int(reply[3]),
            took_over=bool(int(reply[4])),
        )
    if kind == b"replay":
        return ClaimOutcome(
            ClaimStatus.REPLAY,
            fence=int(reply[1]),
            attempts=int(reply[2]),
            completed_at=_seconds(reply[3]),
            result=bytes(reply[4]),
        )
    if kind == b"busy":
        return ClaimOutcome(
            ClaimStatus.BUSY, fence=int(reply[1]), retry_after=max(0.0, _seconds(reply[2]))
        )
    if kind == b"mismatch":
        return ClaimOutcome(ClaimStatus.MISMATCH)
    if kind == b"unknown":
        return ClaimOutcome(
            ClaimStatus.UNKNOWN,
            fence=int(reply[1]),
            attempts=int(reply[2]),
            turned_unknown=int(reply[3]) == 1,
        )
    raise _failed(key, reply)


#: The states the in-doubt index holds (scripts/lib.lua: index).
_IN_DOUBT: Final = (RecordState.IN_PROGRESS, RecordState.UNKNOWN)


def _listing_order(record: Record) -> tuple[float, str]:
    """`list_records` lists oldest first (among what it read)."""
    return (record.created_at, record.key)


def _visible(key: str, reply: Any) -> Record | None:
    kind = reply[0] if isinstance(reply, list) and reply else None
    if kind == b"none":
        return None
    if kind != b"record":
        raise _failed(key, reply)
    now, state, fence, attempts, created, updated, lease, completed, expires = (
        int(n) for n in reply[1:10]
    )
    fingerprint, token, result, tool = (bytes(b) for b in reply[10:14])
    record = stored.of_fields(
        key, state, fence, attempts, created, updated, lease, completed, expires,
        fingerprint, token, result, tool,
    )  # fmt: skip
    return rules.visible(record, now / 1_000_000)


def _glob_escape(text: bytes) -> bytes:
    out = bytearray()
    for byte in text:
        if byte in b"*?[]\\":
            out += b"\\"
        out.append(byte)
    return bytes(out)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)
