"""`RedisKeyStore` behind Sentinel, on a real deployment (1 primary, 2 replicas, 3 Sentinels).

The contract suite and the model test also run through Sentinel (`backend` "redis-sentinel");
these tests cover what only Sentinel has: discovery, the refusal of a node that is not a master,
re-discovery after a real failover (records acknowledged with `wait_replicas=1` survive it),
a claim left in doubt by a failover, trio, what `wait_replicas`/`wait_aof` mean there, URLs, a
redis-py `master_for` client, the CLI, and a shortened run of the failover benchmark. Where a
Sentinel's answer must be stale or change mid-call, a stand-in Sentinel gives it; the Redis
nodes are always real.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import pytest
import redis
from loopback import serving
from lossy_proxy import LossyProxy
from redis.asyncio.sentinel import Sentinel
from redis_sentinel import RedisSentinel
from redis_server import RedisServer

from idempotency import (
    ClaimStatus,
    DurabilityUnsupported,
    Record,
    RecordState,
    RedisKeyStore,
    ReplicationUnconfirmed,
    StoreUnavailable,
    open_store,
)
from idempotency._stores.redis import lua
from idempotency._stores.redis.wire import command

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

REPO = Path(__file__).resolve().parents[2]
FP = "fingerprint"
LEASE = 60.0
RETENTION = 600.0


def raw(node: RedisServer, name: bytes) -> bytes | None:
    """What `node` itself holds under `name` (no store code in between)."""
    with redis.Redis(port=node.port) as client:
        value: bytes | None = client.get(name)
        return value


def subscribers(node: RedisServer, key: str) -> int:
    """Subscribers of record `key`'s channel (default prefix) on `node`."""
    with redis.Redis(port=node.port) as client:
        counts: Any = client.pubsub_numsub(f"mcp-once:{{{key}}}")
        return int(counts[0][1])


def replica_of(deployment: RedisSentinel) -> RedisServer:
    primary = deployment.master()
    return next(n for n in deployment.nodes if n is not primary and n.proc is not None)


async def test_the_store_writes_to_the_primary_sentinel_names(
    redis_sentinel: RedisSentinel, redis_namespace: str
) -> None:
    store = RedisKeyStore.from_url(redis_sentinel.url, prefix=f"{redis_namespace}:")
    try:
        outcome = await store.claim("k", FP, lease=LEASE, takeover=False)
        assert outcome.status is ClaimStatus.CLAIMED and outcome.token is not None
        assert await store.complete("k", outcome.token, b"result", retention=RETENTION)
        assert (await store.claim("k", FP, lease=LEASE, takeover=False)).result == b"result"
    finally:
        await store.aclose()
    name = f"{redis_namespace}:{{k}}".encode()
    stored = raw(redis_sentinel.master(), name)
    assert stored is not None and stored.endswith(b"result")


class StandInSentinel:
    """Answers `SENTINEL get-master-addr-by-name` (after an optional AUTH) with the ports in
    `names`, one per question, repeating the last: a Sentinel whose view the test controls
    (stale, or changing mid-call). The nodes it names are real."""

    def __init__(self, names: list[int]) -> None:
        self.names = names
        self.asked: list[bytes] = []
        self.port = 0

    @asynccontextmanager
    async def running(self) -> AsyncIterator[StandInSentinel]:
        async with serving(self._serve) as self.port:
            yield self

    async def _serve(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                while request := await stream.receive():
                    self.asked.append(request)
                    named = str(self.names.pop(0) if len(self.names) > 1 else self.names[0])
                    answer = b"*2\r\n$9\r\n127.0.0.1\r\n$%d\r\n%s\r\n" % (
                        len(named),
                        named.encode(),
                    )
                    ok = b"+OK\r\n" if request.startswith(command(b"AUTH", b"s3cret")) else b""
                    await stream.send(ok + answer)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return


def closed_port() -> int:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_a_node_that_is_not_a_master_is_refused(
    redis_sentinel: RedisSentinel, redis_namespace: str
) -> None:
    """A Sentinel with a stale view names a replica: the handshake's ROLE refuses it, the
    call fails as unavailable, and nothing is written anywhere. The Sentinel password of the
    URL is sent to the Sentinel."""
    replica = replica_of(redis_sentinel)
    async with StandInSentinel([replica.port]).running() as stale:
        store = RedisKeyStore.from_url(
            f"redis+sentinel://127.0.0.1:{stale.port}/{redis_sentinel.service}"
            "?sentinel_password=s3cret",
            prefix=f"{redis_namespace}:",
        )
        try:
            with pytest.raises(StoreUnavailable, match="not a master"):
                await store.claim("k", FP, lease=LEASE, takeover=False)
        finally:
            await store.aclose()
    question = command(b"SENTINEL", b"GET-MASTER-ADDR-BY-NAME", redis_sentinel.service)
    assert stale.asked and all(r == command(b"AUTH", b"s3cret") + question for r in stale.asked)
    name = f"{redis_namespace}:{{k}}".encode()
    assert raw(replica, name) is None and raw(redis_sentinel.master(), name) is None


async def test_a_claim_that_may_have_landed_before_the_primary_vanished_is_claimed_again(
    redis_url: str, redis_namespace: str
) -> None:
    """Found by the failover benchmark: a claim is written, its connection dies before the
    reply (the primary is killed; the claim may already be on a replica), and the re-send
    cannot even connect (Sentinel still names the dead primary); so can the caller's next
    try. The claim stays in doubt through both, so the try that reaches the new primary
    claims under the same token instead of finding an orphan that nobody holds (BUSY until
    its lease ends, then UNKNOWN for an operator)."""
    prefix = f"{redis_namespace}:"
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with redis.Redis(port=port) as client:
        client.script_load(lua.CLAIM.source)  # the cut must hit the EVALSHA that runs
    async with LossyProxy(port).running() as proxy:
        proxy.cut_reply_to(lua.CLAIM.sha.encode())
        async with StandInSentinel([proxy.port, closed_port()]).running() as sentinel:
            store = RedisKeyStore.from_url(
                f"redis+sentinel://127.0.0.1:{sentinel.port}/svc", prefix=prefix
            )
            try:
                with pytest.raises(StoreUnavailable):
                    await store.claim("k", FP, lease=LEASE, takeover=False)
                assert proxy.cut.is_set()
                # The next try cannot connect either (never written): still in doubt.
                sentinel.names = [closed_port()]
                with pytest.raises(StoreUnavailable):
                    await store.claim("k", FP, lease=LEASE, takeover=False)
                sentinel.names = [port]  # the new primary, holding the claim
                retried = await store.claim("k", FP, lease=LEASE, takeover=False)
            finally:
                await store.aclose()
    assert retried.status is ClaimStatus.CLAIMED, retried  # not BUSY: its own claim
    assert (retried.fence, retried.attempts) == (1, 1)


async def test_a_dead_sentinel_is_passed_over_and_the_next_one_answers(
    redis_sentinel: RedisSentinel, redis_namespace: str
) -> None:
    ports = [closed_port(), *(s.port for s in redis_sentinel.sentinels)]
    hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
    store = RedisKeyStore.from_url(
        f"redis+sentinel://{hosts}/{redis_sentinel.service}", prefix=f"{redis_namespace}:"
    )
    try:
        assert (await store.claim("k", FP, lease=LEASE, takeover=False)).token is not None
    finally:
        await store.aclose()
    assert raw(redis_sentinel.master(), f"{redis_namespace}:{{k}}".encode()) is not None


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_discovery_works_under_trio(
    redis_sentinel: RedisSentinel, redis_namespace: str
) -> None:
    store = RedisKeyStore.from_url(
        redis_sentinel.url, prefix=f"{redis_namespace}:", wait_replicas=1
    )
    try:
        outcome = await store.claim("k", FP, lease=LEASE, takeover=False)
        assert outcome.token is not None
        assert await store.complete("k", outcome.token, b"r", retention=RETENTION)
        record = await store.get("k")
        assert record is not None and record.state is RecordState.COMPLETED
    finally:
        await store.aclose()


async def test_wait_replicas_counts_the_primarys_replicas(
    redis_sentinel: RedisSentinel, redis_namespace: str
) -> None:
    """Two replicas: waiting for 2 is confirmed; waiting for 3 is not, and the claim is
    withdrawn, as against a single Redis."""
    prefix = f"{redis_namespace}:"
    two = RedisKeyStore.from_url(redis_sentinel.url, prefix=prefix, wait_replicas=2)
    three = RedisKeyStore.from_url(
        redis_sentinel.url, prefix=prefix, wait_replicas=3, wait_timeout=0.2
    )
    try:
        assert (await two.claim("two", FP, lease=LEASE, takeover=False)).token is not None
        with pytest.raises(ReplicationUnconfirmed) as caught:
            await three.claim("three", FP, lease=LEASE, takeover=False)
        assert not caught.value.applied and caught.value.acked == "2 replica(s)"
        assert await two.get("three") is None
    finally:
        await two.aclose()
        await three.aclose()


async def test_wait_aof_needs_redis_7_2_behind_sentinel_too(
    redis_sentinel: RedisSentinel, redis_namespace: str
) -> None:
    with redis.Redis(port=redis_sentinel.master().port) as client:
        version = str(client.info("server")["redis_version"])
    if tuple(int(p) for p in version.split(".")[:2]) >= (7, 2):
        pytest.skip(f"Redis {version} has WAITAOF")
    store = RedisKeyStore.from_url(
        redis_sentinel.url, prefix=f"{redis_namespace}:", wait_replicas=1, wait_aof=True
    )
    try:
        with pytest.raises(DurabilityUnsupported, match=r"7\.2"):
            await store.claim("k", FP, lease=LEASE, takeover=False)
        assert await store.get("k") is None
    finally:
        await store.aclose()


async def test_a_redis_py_master_for_client_is_accepted(
    redis_sentinel: RedisSentinel, redis_namespace: str
) -> None:
    """Its Sentinel list is read; its own (asyncio) connections are never used. Sentinels
    configured without timeouts get the data nodes' (an unanswering one must not hang)."""
    hosts = [("127.0.0.1", s.port) for s in redis_sentinel.sentinels]
    manager = Sentinel(  # type: ignore[no-untyped-call]
        hosts, sentinel_kwargs={"socket_timeout": None, "socket_connect_timeout": None}
    )
    client = manager.master_for(
        redis_sentinel.service, socket_timeout=3.0, socket_connect_timeout=3.0
    )
    store = RedisKeyStore(client, prefix=f"{redis_namespace}:")
    sentinels = store._endpoint.sentinel
    assert sentinels is not None
    assert {(s.timeout, s.connect_timeout) for s in sentinels.endpoints} == {(3.0, 3.0)}
    try:
        outcome = await store.claim("k", FP, lease=LEASE, takeover=False)
        assert outcome.status is ClaimStatus.CLAIMED
    finally:
        await store.aclose()
        await client.aclose()
    assert raw(redis_sentinel.master(), f"{redis_namespace}:{{k}}".encode()) is not None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel:///svc", "no Sentinel host"),
        ("redis+sentinel://127.0.0.1:26379", "no service name"),
        ("redis+sentinel://127.0.0.1:26379/", "no service name"),
        ("redis+sentinel://127.0.0.1:26379/svc/x", "database"),
        ("redis+sentinel://127.0.0.1:26379/svc/-1", "database"),
        ("redis+sentinel://127.0.0.1:26379/svc/0/more", "too many path parts"),
        ("redis+sentinel://127.0.0.1:port/svc", "bad Sentinel address"),
        ("redis+sentinel://127.0.0.1:70000/svc", "bad Sentinel address"),
        ("redis+sentinel://:26379/svc", "bad Sentinel address"),
    ],
)
def test_bad_sentinel_urls_are_refused(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        RedisKeyStore.from_url(url)
    with pytest.raises(ValueError, match=says):
        open_store(url)


def test_a_sentinel_url_carries_credentials_db_and_options() -> None:
    from idempotency._stores.redis.sentinel import parse_sentinel_url

    url = (
        "redis+sentinel://user:p%40ss@h1:1,h2:2,[::1]:3/svc/4"
        "?socket_timeout=2.5&sentinel_password=sp&client_name=me"
    )
    hosts, service, options, sentinel = parse_sentinel_url(url)
    assert hosts == [("h1", 1), ("h2", 2), ("::1", 3)] and service == "svc"
    assert options["username"] == "user" and options["password"] == "p@ss"
    assert (options["db"], options["socket_timeout"], options["client_name"]) == (4, 2.5, "me")
    assert sentinel == {"password": "sp"}


async def test_the_cli_reads_records_through_sentinel(
    redis_sentinel: RedisSentinel,
) -> None:
    # The CLI takes no prefix: a store key (64 hex digits) unique to this test.
    key = (uuid.uuid4().hex * 2)[:64]
    store = open_store(redis_sentinel.url)
    try:
        outcome = await store.claim(key, FP, lease=LEASE, takeover=False)
        assert outcome.status is ClaimStatus.CLAIMED
    finally:
        await store.aclose()
    command = [sys.executable, "-m", "mcp_once", "keys", "show", key]
    shown = await anyio.run_process([*command, "--store", redis_sentinel.url], check=False)
    out = shown.stdout.decode()
    assert shown.returncode == 0, (out, shown.stderr.decode())
    fields = dict(line.split(": ", 1) for line in out.splitlines())
    assert (fields["key"], fields["state"], fields["fence"]) == (key, "in_progress", "1")


@pytest.mark.slow
async def test_after_a_real_failover_the_store_follows_and_durable_records_survive(
    fresh_sentinel: RedisSentinel,
) -> None:
    """Records acknowledged with `wait_replicas=1` are all on the new primary after the old one
    is SIGKILLed, and the same store object writes there without being told; so does its
    waiters' subscriber connection (a waiter that only a message can wake is woken)."""
    store = RedisKeyStore.from_url(fresh_sentinel.url, wait_replicas=1)
    store._poll_first = store._poll_cap = 120.0  # no re-reads: only the message can wake it
    other = RedisKeyStore.from_url(fresh_sentinel.url)
    keys = [f"k{i}" for i in range(20)]
    try:
        for key in keys:
            outcome = await store.claim(key, FP, lease=LEASE, takeover=False)
            assert outcome.token is not None
            assert await store.complete(key, outcome.token, key.encode(), retention=RETENTION)
        # The subscriber connection is open on the old primary when it dies.
        await woken_by_message(store, other, "before", fresh_sentinel.master())
        old = await anyio.to_thread.run_sync(fresh_sentinel.kill_master)
        new = await anyio.to_thread.run_sync(fresh_sentinel.wait_failover, old)
        assert new.port != old.port
        for key in keys:
            replay = await store.claim(key, FP, lease=LEASE, takeover=False)
            assert (replay.status, replay.result) == (ClaimStatus.REPLAY, key.encode())
        after = await store.claim("after", FP, lease=LEASE, takeover=False)
        assert after.status is ClaimStatus.CLAIMED
        await woken_by_message(store, other, "waited", new)
    finally:
        await store.aclose()
        await other.aclose()
    assert raw(new, b"mcp-once:{after}") is not None


async def woken_by_message(
    store: RedisKeyStore, other: RedisKeyStore, key: str, primary: RedisServer
) -> None:
    """`store` waits for `key` while `other` completes it; the wait must end by the message
    (its re-reads are 120 s apart), well within 30 s."""
    claim = await other.claim(key, FP, lease=LEASE, takeover=False)
    assert claim.token is not None
    found: list[object] = []

    async def waiter() -> None:
        found.append(await store.wait(key, timeout=60))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            # The waiter subscribes first: wait until the primary counts its subscription.
            while True:
                if await anyio.to_thread.run_sync(subscribers, primary, key):
                    break
                await anyio.sleep(0.01)
            assert await other.complete(key, claim.token, b"r", retention=RETENTION)
    [record] = found
    assert isinstance(record, Record) and record.state is RecordState.COMPLETED


def _run_failover_benchmark(tmp_path: Path, calls: int) -> dict[str, Any]:
    out = tmp_path / "failover.json"
    command = [sys.executable, "-m", "benchmarks.failover", "--rounds", "1", "--lag", "0.5"]
    command += ["--calls", str(calls), "--out", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


@pytest.mark.slow
def test_a_failover_with_wait_replicas_duplicates_no_effect(tmp_path: Path) -> None:
    """The failover benchmark, shortened: the replicas are cut off for 0.5 s, then the primary
    is SIGKILLed mid-run. With `wait_replicas=1` no effect runs twice, no acknowledged write is
    lost, and every call that failed failed with an explicit outcome. Without it the same run
    loses acknowledged completions: the measurement can see what it claims to measure."""
    runs = _run_failover_benchmark(tmp_path, calls=150)["runs"]
    by_wait = {run["wait_replicas"]: run for run in runs}
    durable = by_wait[1]
    assert durable["killed"] and durable["recover_failover_s"] is not None
    assert durable["calls"] == 150 and durable["succeeded"] + durable["failed_calls"] == 150
    assert durable["duplicate_effects"] == 0
    assert durable["acked_claims_lost"] == 0 and durable["acked_completions_lost"] == 0
    assert durable["unexplained_failures"] == 0 and durable["lost_results"] == 0
    explicit = ("NotExecuted", "OutcomeUnknown", "ServerOutcomeUnknown", "ToolCallError")
    assert all(kind.startswith(explicit) for kind in durable["failed_calls_by_kind"]), durable
    assert durable["recover_first_write_s"] is not None
    assert by_wait[0]["acked_completions_lost"] > 0, by_wait[0]
