"""`RedisJournal`: runs shared by every host that reaches one Redis (or a Cluster, or a primary
found through Sentinel). Each write is one Lua script (`lua/`) that checks the fence and writes
in one atomic step, so a stale holder changes nothing, as in SQLite.

Key layout, Cluster-safe: a run's head and entries share the hash tag `{run id}`, so every
script touches one slot; `<prefix>runs` (a sorted set, scored by creation time) indexes the runs
for `runs()` and `sweep()`. The index lives in another slot, so it is kept outside the scripts
and read as a hint: a run id whose head is gone is dropped from it on the next sweep.

Durability: as durable as the Redis server is configured to be. A script's reply means the write
is in the server's memory; with `appendonly yes` and `appendfsync always` it is on the server's
disk, with `everysec` up to a second may be lost in a crash of the server (not of the agent),
without persistence a restart loses the journal. `wait_aof=True` makes every write wait for
WAITAOF (local fsync, Redis >= 7.2) and `wait_replicas=N` for N replicas (WAIT) before
returning; a write not confirmed in `wait_timeout` is `JournalUnavailable` (fail closed: its
call is not sent).

Time: the Redis clock (TIME inside the scripts), so hosts with skewed clocks agree on leases;
a `clock=` given instead is sent with each call (tests, one host).

The client is redis-py's asyncio client, so this journal runs on asyncio (not trio).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import RedisError

from .entry import Entry, check_intent, nothing_to_mark
from .errors import EntryConflict, FencedOut, JournalUnavailable, RunBusy, RunFinished
from .journal import DEFAULT_RETENTION, Clock, RunSummary
from .lease import busy, check_holder, check_lease, check_run_id

logger = logging.getLogger("orchestrator.journal")

DEFAULT_PREFIX = "mcp-once:journal:"
PLAIN_SCHEMES = ("redis://", "rediss://", "unix://")
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
SENTINEL_SCHEMES = ("redis+sentinel://",)
SCHEMES = PLAIN_SCHEMES + CLUSTER_SCHEMES + SENTINEL_SCHEMES


def _script(name: str) -> str:
    folder = resources.files(__package__ or "orchestrator._journal").joinpath("lua")
    prelude = folder.joinpath("lib.lua").read_text(encoding="utf-8")
    return prelude + "\n" + folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")


_SCRIPTS = {
    name: _script(name)
    for name in (
        "acquire",
        "renew",
        "release",
        "record_intent",
        "mark_done",
        "finish",
        "purge",
        "sweep",
    )
}

Client = aioredis.Redis | RedisCluster


class RedisJournal:
    """Runs in Redis, under `prefix`. Build it from a URL (`from_url`) or around a client of
    your own (made with `decode_responses=True`)."""

    def __init__(
        self,
        client: Client,
        *,
        prefix: str = DEFAULT_PREFIX,
        clock: Clock | None = None,
        retention: float = DEFAULT_RETENTION,
        wait_aof: bool = False,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
    ) -> None:
        if "{" in prefix or "}" in prefix:
            raise ValueError(f"the prefix must not contain braces (the hash tag): {prefix!r}")
        if wait_replicas < 0:
            raise ValueError(f"wait_replicas must be >= 0, not {wait_replicas}")
        if (wait_aof or wait_replicas) and isinstance(client, RedisCluster):
            # WAIT confirms the writes of its own connection, and a cluster pipeline spreads
            # commands over nodes: the wait would confirm nothing in particular.
            raise ValueError("wait_aof and wait_replicas are for one Redis, not a Cluster")
        self.client = client
        self.prefix = prefix
        self.retention = retention
        self._clock = clock
        self._wait_aof = wait_aof
        self._wait_replicas = wait_replicas
        self._wait_ms = int(wait_timeout * 1000)
        self._scripts = {name: client.register_script(src) for name, src in _SCRIPTS.items()}

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        clock: Clock | None = None,
        retention: float = DEFAULT_RETENTION,
        wait_aof: bool = False,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
        **redis_kwargs: Any,
    ) -> RedisJournal:
        """`redis://`, `rediss://`, `unix://` (one server), `redis+cluster://host:port[,...]`
        (`rediss+cluster://` over TLS: the seeds of a Cluster),
        `redis+sentinel://[user:pass@]host:port[,...]/service[/db]` (the primary Sentinel
        names). `redis_kwargs` are redis-py's connection options."""
        return cls(
            client_from_url(url, **redis_kwargs),
            prefix=prefix,
            clock=clock,
            retention=retention,
            wait_aof=wait_aof,
            wait_replicas=wait_replicas,
            wait_timeout=wait_timeout,
        )

    def __repr__(self) -> str:
        return f"RedisJournal(prefix={self.prefix!r})"

    # -- keys -------------------------------------------------------------------------------

    def _keys(self, run_id: str) -> list[str]:
        tag = f"{self.prefix}{{{run_id}}}"
        return [f"{tag}:run", f"{tag}:e"]

    @property
    def _index(self) -> str:
        return f"{self.prefix}runs"

    # -- the lease --------------------------------------------------------------------------

    async def acquire(
        self,
        run_id: str,
        holder: str,
        lease: float,
        *,
        alive: str | None = None,
        dead: int | None = None,
    ) -> int:
        check_run_id(run_id)
        check_holder(holder)
        check_lease(lease)
        # Indexed before and after: before, so a crash right after the script leaves no run
        # the index misses; after, so a sweep that dropped the id meanwhile (no head yet) is
        # undone.
        await self._index_run(run_id)
        reply = await self._call(
            "acquire", run_id, holder, repr(float(lease)), alive or "", "" if dead is None else dead
        )
        await self._index_run(run_id)
        if reply[0] == "busy":
            raise busy(run_id, reply[1], float(reply[2]), int(reply[3]), reply[4] or None)
        fence = int(reply[1])
        logger.debug("run %r acquired by %r with fence %d", run_id, holder, fence)
        return fence

    async def renew(self, run_id: str, fence: int, lease: float) -> None:
        check_lease(lease)
        self._answer(run_id, fence, await self._call("renew", run_id, fence, repr(float(lease))))

    async def release(self, run_id: str, fence: int) -> bool:
        return bool(await self._call("release", run_id, fence))

    async def finish(self, run_id: str, fence: int) -> None:
        keep_ms = max(1, int(self.retention * 1000))
        self._answer(run_id, fence, await self._call("finish", run_id, fence, keep_ms))

    # -- entries ----------------------------------------------------------------------------

    async def record_intent(self, run_id: str, fence: int, entry: Entry) -> None:
        check_intent(entry)
        identity = _identity(entry)
        reply = await self._call(
            "record_intent", run_id, fence, entry.position, repr(float(entry.at)), identity
        )
        if reply[0] == "conflict":
            stored = _decode_entry(entry.position, reply[1])
            raise EntryConflict(
                f"run {run_id!r} position {entry.position} holds {stored.server}/{stored.tool}"
                f" (fingerprint {stored.fingerprint}), not {entry.server}/{entry.tool}"
                f" (fingerprint {entry.fingerprint}); an entry is never overwritten"
            )
        self._answer(run_id, fence, reply)

    async def mark_done(self, run_id: str, fence: int, position: int) -> None:
        reply = await self._call("mark_done", run_id, fence, position)
        if reply[0] == "missing":
            raise nothing_to_mark(run_id, position)
        self._answer(run_id, fence, reply)

    async def entries(self, run_id: str) -> list[Entry]:
        stored = await self._command("HGETALL", self._keys(run_id)[1])
        found = [_decode_entry(int(position), value) for position, value in stored.items()]
        return sorted(found, key=lambda entry: entry.position)

    # -- the operator's view, and forgetting -------------------------------------------------

    async def run(self, run_id: str) -> RunSummary | None:
        fields = await self._command("HGETALL", self._keys(run_id)[0])
        return _decode_head(run_id, fields) if fields else None

    async def runs(self) -> list[RunSummary]:
        found = []
        for run_id in await self._command("ZRANGE", self._index, 0, -1):
            summary = await self.run(run_id)
            if summary is not None:
                found.append(summary)
        return sorted(found, key=lambda head: (head.created_at, head.run_id))

    async def purge(self, run_id: str, *, force: bool = False) -> bool:
        reply = await self._call("purge", run_id, "1" if force else "0")
        if reply[0] == "busy":
            raise RunBusy(
                run_id, f"run {run_id!r} is held by {reply[1]!r}; purge it with force to override"
            )
        await self._command("ZREM", self._index, run_id)
        return bool(reply[0] == "gone")

    async def sweep(self, now: float | None = None) -> int:
        """One script per indexed run (each in its own slot); ids whose run is gone (swept,
        purged, or expired by its TTL) leave the index."""
        swept = 0
        for run_id in await self._command("ZRANGE", self._index, 0, -1):
            reply = await self._call("sweep", run_id, repr(float(self.retention)), now=now)
            if reply[0] in ("swept", "absent"):
                await self._command("ZREM", self._index, run_id)
                swept += reply[0] == "swept"
        if swept:
            logger.info("journal sweep forgot %d finished runs", swept)
        return swept

    async def aclose(self) -> None:
        try:
            await self.client.aclose()
        except RedisError as exc:
            logger.debug("closing the Redis journal: %r", exc)

    # -- machinery --------------------------------------------------------------------------

    async def _index_run(self, run_id: str) -> None:
        score = self._clock() if self._clock is not None else 0
        await self._command("ZADD", self._index, "NX", score, run_id)

    async def _call(self, name: str, run_id: str, *args: object, now: float | None = None) -> Any:
        """Runs one script on the run's keys; with a WAIT/WAITAOF after it on the same
        connection (a pipeline) when the journal is asked to be that durable."""
        if now is None and self._clock is not None:
            now = self._clock()
        argv = ["" if now is None else repr(float(now)), *[str(a) for a in args]]
        keys = self._keys(run_id)
        script = self._scripts[name]
        try:
            if not (self._wait_aof or self._wait_replicas):
                return await script(keys=keys, args=argv)
            pipe = self.client.pipeline(transaction=False)
            # redis-py's Pipeline loads the script first (NOSCRIPT-safe); its stubs miss it.
            await script(keys=keys, args=argv, client=pipe)  # type: ignore[arg-type]
            if self._wait_aof:
                pipe.execute_command("WAITAOF", 1, self._wait_replicas, self._wait_ms)
            else:
                pipe.execute_command("WAIT", self._wait_replicas, self._wait_ms)
            reply, acks = await pipe.execute()
        except RedisError as exc:
            raise JournalUnavailable(f"the Redis journal failed: {exc}") from exc
        local, replicas = (acks if self._wait_aof else (1, acks))[:2]
        if int(local) < 1 or int(replicas) < self._wait_replicas:
            raise JournalUnavailable(
                f"a journal write was not confirmed durable in {self._wait_ms} ms"
                f" (local fsync: {local}, replicas: {replicas} of {self._wait_replicas})"
            )
        return reply

    async def _command(self, *args: str | int | float) -> Any:
        try:
            return await self.client.execute_command(*args)
        except RedisError as exc:
            raise JournalUnavailable(f"the Redis journal failed: {exc}") from exc

    @staticmethod
    def _answer(run_id: str, fence: int, reply: Sequence[Any]) -> None:
        """Raises the refusal a script answered with, if any."""
        if reply[0] == "fenced":
            raise FencedOut(run_id, f"fence {fence} no longer holds run {run_id!r} ({reply[1]})")
        if reply[0] == "finished":
            raise RunFinished(run_id)


def _identity(entry: Entry) -> str:
    return json.dumps(
        [entry.server, entry.tool, entry.fingerprint, entry.key],
        ensure_ascii=False,
        separators=(",", ":"),
    )


def _decode_entry(position: int, value: str) -> Entry:
    try:
        at, identity = value[1:].split("|", 1)
        server, tool, fingerprint, key = json.loads(identity)
        return Entry(
            position=position,
            server=server,
            tool=tool,
            fingerprint=fingerprint,
            key=key,
            state="done" if value[:1] == "d" else "intent",
            at=float(at),
        )
    except (TypeError, ValueError) as exc:
        raise JournalUnavailable(
            f"an unreadable journal entry at position {position}: {exc}"
        ) from exc


def _decode_head(run_id: str, fields: Mapping[str, str]) -> RunSummary:
    try:
        return RunSummary(
            run_id=run_id,
            state="finished" if fields["s"] == "f" else "running",
            calls=int(fields["n"]),
            dangling=int(fields["o"]),
            fence=int(fields["f"]),
            holder=fields.get("h"),
            lease_deadline=float(fields["d"]) if "d" in fields else None,
            created_at=float(fields["c"]),
            updated_at=float(fields["u"]),
            finished_at=float(fields["x"]) if "x" in fields else None,
            alive=fields["a"] if "a" in fields and fields.get("g") == fields["f"] else None,
        )
    except (KeyError, ValueError) as exc:
        raise JournalUnavailable(f"run {run_id!r} has an unreadable head: {exc!r}") from exc


def client_from_url(url: str, **redis_kwargs: Any) -> Client:
    """A redis-py asyncio client (decoding replies as text) for a journal URL."""
    redis_kwargs["decode_responses"] = True
    if url.startswith(CLUSTER_SCHEMES):
        seeds, first = _seeds(url, "redis+cluster")
        return RedisCluster.from_url(
            first, startup_nodes=[ClusterNode(host, port) for host, port in seeds], **redis_kwargs
        )
    if url.startswith(SENTINEL_SCHEMES):
        parts = urlsplit(url)
        seeds, _ = _seeds(url, "redis+sentinel")
        path = [p for p in parts.path.split("/") if p]
        if not path or len(path) > 2:
            raise ValueError(f"a Sentinel URL names /service_name[/db], not {parts.path!r}")
        db = int(path[1]) if len(path) == 2 else 0
        if parts.password is not None:
            redis_kwargs.setdefault("password", unquote(parts.password))
        if parts.username:
            redis_kwargs.setdefault("username", unquote(parts.username))
        sentinel = Sentinel(seeds, **redis_kwargs)  # type: ignore[no-untyped-call]
        primary: aioredis.Redis = sentinel.master_for(path[0], db=db, **redis_kwargs)
        return primary
    if url.startswith(PLAIN_SCHEMES):
        return aioredis.Redis.from_url(url, **redis_kwargs)
    raise ValueError(f"not a Redis journal URL: {url!r}")


def _seeds(url: str, scheme: str) -> tuple[list[tuple[str, int]], str]:
    """The host:port list of a multi-host URL, and a one-host `redis://` URL of the first."""
    rest = url.split("://", 1)[1]
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    seeds = []
    for part in hosts.split(","):
        host, colon, port = part.strip().rpartition(":")
        if not colon or not host or not port.isdigit():
            raise ValueError(f"{scheme} URL {url!r}: {part!r} is not host:port")
        seeds.append((host.strip("[]"), int(port)))
    tls = url.startswith("rediss")
    first = f"{'rediss' if tls else 'redis'}://{userinfo}{at}{seeds[0][0]}:{seeds[0][1]}"
    return seeds, first + slash + path
