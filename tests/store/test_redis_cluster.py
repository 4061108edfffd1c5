"""What only a Redis Cluster has to prove, on a real 3-master + 3-replica cluster (`LocalCluster`):
records spread over every master, one round trip per transition on the owning node, a slot
migrated mid-run (ASK, then MOVED) losing no record and granting no second claim, waits woken
wherever the record lives, operator scans covering every shard, durable writes confirmed by the
owner's replica, a failover followed, and clear errors for bad URLs. The behaviour every backend
shares is proved on the cluster by `test_contract.py` and `test_model.py`.

Counts come from Redis itself (`INFO commandstats`/`errorstats`, SCAN on each node), never from
timing. Admin commands use redis-py's synchronous client in a worker thread.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import pytest
import pytest_asyncio
from mcp_types import CallToolResult, TextContent
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis_cluster import LocalCluster
from redis_server import RedisServer, free_port

from idempotency import (
    ClaimStatus,
    RecordState,
    RedisKeyStore,
    StoreError,
    StoreUnavailable,
    encode_result,
    open_store,
)
from mcp_once._cli import _common, main

pytestmark = [pytest.mark.anyio, pytest.mark.redis, pytest.mark.slow]

FP = "fp"
LEASE = 60.0
T = TypeVar("T")
#: The commands a store may send on its own (those run inside scripts are counted as well).
TOP_LEVEL = ("evalsha", "eval", "asking", "cluster|slots", "script|load", "scan", "wait")


@pytest_asyncio.fixture
async def store(redis_cluster_url: str, prefix: str) -> AsyncIterator[RedisKeyStore]:
    made = RedisKeyStore.from_url(redis_cluster_url, prefix=prefix)
    yield made
    await made.aclose()


async def admin(cluster: LocalCluster, node: RedisServer, *args: Any) -> Any:
    """One command to one node, from a worker thread."""

    def run() -> Any:
        with cluster.client(node) as client:
            return client.execute_command(*args)

    return await anyio.to_thread.run_sync(run)


async def in_thread(call: Callable[[], T]) -> T:
    return await anyio.to_thread.run_sync(call)


def names_on(cluster: LocalCluster, node: RedisServer, prefix: str) -> list[bytes]:
    """The record keys under `prefix` that `node` holds (SCAN on that node alone)."""
    with cluster.client(node) as client:
        return list(client.scan_iter(match=f"{prefix}*", count=1000))


async def ours_in_slot(cluster: LocalCluster, node: RedisServer, slot: int, prefix: str) -> int:
    """How many of this test's records (`prefix`) `node` holds in `slot`. Not COUNTKEYSINSLOT:
    the cluster is shared by the session, and other tests' random keys land in any slot."""
    names = await admin(cluster, node, "CLUSTER", "GETKEYSINSLOT", slot, 10_000)
    # Records, not their histories (`:h`, rule 20) or fence memos (`:f`, rule 25), which move
    # with them.
    return sum(1 for n in names if n.decode().startswith(prefix) and not n.endswith((b":h", b":f")))


def stats(cluster: LocalCluster, node: RedisServer, section: str) -> dict[str, Any]:
    with cluster.client(node) as client:
        found: dict[str, Any] = client.info(section)
        return found


def calls(found: dict[str, Any], name: str) -> int:
    return int(found.get(f"cmdstat_{name}", {}).get("calls", 0))


def errors(found: dict[str, Any], code: str) -> int:
    return int(found.get(f"errorstat_{code}", {}).get("count", 0))


def keys_in_slot(slot: int, count: int) -> list[str]:
    """`count` record keys whose hash tag (the key itself) falls in `slot`."""
    found: list[str] = []
    n = 0
    while len(found) < count:
        key = f"mig-{n}"
        if key_slot(key.encode()) == slot:
            found.append(key)
        n += 1
    return found


async def first_execution(store: RedisKeyStore, key: str, result: bytes = b"r") -> None:
    outcome = await store.claim(key, FP, lease=LEASE, takeover=False)
    assert outcome.status is ClaimStatus.CLAIMED and outcome.token is not None
    assert await store.complete(key, outcome.token, result, retention=3600)


async def first_executions(store: RedisKeyStore, keys: list[str]) -> None:
    """`first_execution` of every key, all at once."""
    async with anyio.create_task_group() as tg:
        for key in keys:
            tg.start_soon(first_execution, store, key)


async def warm_up(store: RedisKeyStore) -> None:
    """Every master runs every transition script once, so that counted runs see no NOSCRIPT
    (a node's first EVALSHA of a script costs an EVAL more), and the store holds the slot map.
    """
    owners: set[int] = set()
    for _ in range(30):
        key = f"warm-{uuid.uuid4().hex}"
        await first_execution(store, key)
        assert (await store.claim(key, FP, lease=LEASE, takeover=False)).result == b"r"
        node = store._cluster.owner(store._rkey(key)) if store._cluster else None
        owners.add(node[1] if node else 0)
    assert len(owners) == 3


# -- spread and round trips -----------------------------------------------------------------------


async def test_records_spread_over_every_master(
    store: RedisKeyStore, redis_cluster: LocalCluster, prefix: str
) -> None:
    keys = [f"spread-{n}" for n in range(300)]
    await first_executions(store, keys)
    masters = await in_thread(redis_cluster.masters)
    per_master = {
        m.port: await in_thread(functools.partial(names_on, redis_cluster, m, prefix))
        for m in masters
    }
    # Records only; each one's history (`:h`) and its slot's audit stream sit beside it (rule 20),
    # on the same owner, which the loop below checks for every name.
    record = prefix.encode() + b"{"
    counts = {
        port: sum(1 for n in names if n.startswith(record) and n.endswith(b"}"))
        for port, names in per_master.items()
    }
    assert len(counts) == 3 and sum(counts.values()) == 300, counts
    assert min(counts.values()) >= 60, counts  # about a third each (CRC16 spreads them)
    owners = await in_thread(redis_cluster.slot_owners)
    for port, names in per_master.items():  # each record sits on its slot's owner
        assert all(owners[key_slot(name)] == port for name in names)
    print(f"records per master: {counts}")


async def test_one_round_trip_per_transition_on_the_owning_node(
    store: RedisKeyStore, redis_cluster: LocalCluster
) -> None:
    await warm_up(store)
    masters = await in_thread(redis_cluster.masters)
    seen: dict[int, int] = {}
    for n in range(3 * 8):
        key = f"trip-{n}"
        owner = await in_thread(functools.partial(redis_cluster.owner, key_slot(key.encode())))
        if seen.get(owner.port, 0) >= 2:
            continue
        seen[owner.port] = seen.get(owner.port, 0) + 1
        for master in masters:
            await admin(redis_cluster, master, "CONFIG", "RESETSTAT")
        await store.get(key)  # this node's connection is open before counting
        for master in masters:
            await admin(redis_cluster, master, "CONFIG", "RESETSTAT")
        writes = store._traffic.writes
        claimed = await store.claim(key, FP, lease=LEASE, takeover=False)
        assert claimed.token is not None
        assert store._traffic.writes - writes == 1
        assert await store.complete(key, claimed.token, b"r", retention=60)
        assert store._traffic.writes - writes == 2
        replay = await store.claim(key, FP, lease=LEASE, takeover=False)
        assert replay.status is ClaimStatus.REPLAY and replay.result == b"r"
        assert store._traffic.writes - writes == 3
        for master in masters:
            found = stats(redis_cluster, master, "commandstats")
            ran = {name: calls(found, name) for name in TOP_LEVEL if calls(found, name)}
            refused = stats(redis_cluster, master, "errorstats")
            # Three scripts on the owner and nothing else anywhere: no redirect, no lookup.
            assert ran == ({"evalsha": 3} if master.port == owner.port else {}), ran
            assert [errors(refused, code) for code in ("MOVED", "ASK", "NOSCRIPT")] == [0, 0, 0]
    assert sorted(seen.values()) == [2, 2, 2]  # every master was the owner twice


# -- a slot migrated mid-run ----------------------------------------------------------------------


class Runs:
    """Claims granted and effects run, per key, by any worker."""

    def __init__(self) -> None:
        self.claims: collections.Counter[str] = collections.Counter()
        self.effects: collections.Counter[str] = collections.Counter()
        #: Set (and replaced) whenever a claim is granted.
        self.granted = anyio.Event()

    async def attempt(self, store: RedisKeyStore, key: str, gate: anyio.Event | None) -> None:
        """One worker's call with `key`: claim, run (after `gate`), complete; a duplicate waits
        for the running one and ends with its replay."""
        while True:
            outcome = await store.claim(key, FP, lease=LEASE, takeover=False)
            if outcome.status is ClaimStatus.REPLAY:
                assert outcome.result == f"done {key}".encode()
                return
            if outcome.status is ClaimStatus.BUSY:
                await store.wait(key, timeout=LEASE)
                continue
            assert outcome.status is ClaimStatus.CLAIMED and outcome.token is not None
            self.claims[key] += 1
            self.granted.set()
            self.granted = anyio.Event()
            if gate is not None:
                await gate.wait()
            self.effects[key] += 1
            assert await store.complete(key, outcome.token, f"done {key}".encode(), retention=600)
            return


async def test_a_slot_migrated_mid_run_loses_no_record_and_grants_no_second_claim(
    redis_cluster_url: str, redis_cluster: LocalCluster, prefix: str
) -> None:
    """Half the slot's records are claimed, then the slot is migrated key by key while those
    claims complete and duplicates of every key arrive from two stores (ASK), and finally handed
    over (MOVED). Waiters subscribed on the old owner are woken by completions on the new one:
    polling is turned off, so only the broadcast PUBLISH can wake them in time."""
    slot = 777
    keys = keys_in_slot(slot, 12)
    early = keys[:6]  # claimed before the migration starts; the rest are created during it
    masters = await in_thread(redis_cluster.masters)
    source = await in_thread(functools.partial(redis_cluster.owner, slot))
    target = next(m for m in masters if m.port != source.port)
    source_id = (await admin(redis_cluster, source, "CLUSTER", "MYID")).decode()
    target_id = (await admin(redis_cluster, target, "CLUSTER", "MYID")).decode()
    stores = [RedisKeyStore.from_url(redis_cluster_url, prefix=prefix) for _ in range(2)]
    for each in stores:
        each._poll_first = each._poll_cap = 3600.0  # no re-reads: only messages wake waiters
    runs = Runs()
    gate = anyio.Event()
    moving = False  # the slot is set MIGRATING/IMPORTING
    # Another application's key in the same slot, as on any shared cluster: it moves too.
    stray = f"other-{prefix}{{{keys[0]}}}"
    try:
        await admin(redis_cluster, source, "SET", stray, "theirs")
        for master in masters:
            await admin(redis_cluster, master, "CONFIG", "RESETSTAT")
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for key in early:  # claimed on the source, held mid-effect by the gate
                    tg.start_soon(runs.attempt, stores[0], key, gate)

                while sum(runs.claims.values()) < len(early):
                    await runs.granted.wait()
                moving = True
                await admin(
                    redis_cluster, target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id
                )
                await admin(
                    redis_cluster, source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id
                )
                await migrate(redis_cluster, source, target, prefix, early[:3])
                # Duplicates of every key from both stores: BUSY ones wait (subscribed on the
                # source, or on the target), new keys are created on the target (ASK).
                for key in keys:
                    for each in stores:
                        tg.start_soon(runs.attempt, each, key, None)
                gate.set()  # the held claims complete: 3 on the target (ASK), 3 on the source
                await migrate(redis_cluster, source, target, prefix, early[3:])
            assert await ours_in_slot(redis_cluster, source, slot, prefix) == 0
            await migrate_strays(redis_cluster, source, target, slot)
            for master in masters:
                await admin(redis_cluster, master, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
            await in_thread(redis_cluster.wait_healthy)
            # After the hand-over: every key again, from both stores (MOVED for the store whose
            # map still names the source).
            async with anyio.create_task_group() as tg:
                for key in keys:
                    for each in stores:
                        tg.start_soon(runs.attempt, each, key, None)
        assert runs.claims == {key: 1 for key in keys}, runs.claims
        assert runs.effects == {key: 1 for key in keys}, runs.effects
        for key in keys:
            record = await stores[1].get(key)
            assert record is not None and record.state is RecordState.COMPLETED
            assert record.result == f"done {key}".encode() and record.fence == 1
        assert await ours_in_slot(redis_cluster, target, slot, prefix) == len(keys)
        assert await admin(redis_cluster, target, "GET", stray) == b"theirs"
        source_errors = stats(redis_cluster, source, "errorstats")
        target_calls = stats(redis_cluster, target, "commandstats")
        assert errors(source_errors, "ASK") > 0 and calls(target_calls, "asking") > 0
        assert errors(source_errors, "MOVED") > 0
        print(
            f"migration: {len(keys)} records, claims {sum(runs.claims.values())},"
            f" effects {sum(runs.effects.values())}, ASK {errors(source_errors, 'ASK')},"
            f" MOVED {errors(source_errors, 'MOVED')}"
        )
    finally:
        for each in stores:
            await each.aclose()
        # A failure above may have left the slot half-migrated: finish it, so that one failing
        # test does not leave the session's cluster unhealthy for every test after it.
        if moving:
            there = set(names_on(redis_cluster, source, prefix))
            left = [key for key in keys if f"{prefix}{{{key}}}".encode() in there]
            await migrate(redis_cluster, source, target, prefix, left)
            await migrate_strays(redis_cluster, source, target, slot)
            for master in masters:
                await admin(redis_cluster, master, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        await in_thread(redis_cluster.wait_healthy)


async def migrate(
    cluster: LocalCluster, source: RedisServer, target: RedisServer, prefix: str, keys: list[str]
) -> None:
    """Move `keys` from `source` to `target`, one MIGRATE per key (each is atomic), each with its
    history (rule 20), as the pair they are."""
    for key in keys:
        name = f"{prefix}{{{key}}}"
        await admin(
            cluster, source, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000,
            "KEYS", name, f"{name}:h",
        )  # fmt: skip


async def migrate_strays(
    cluster: LocalCluster, source: RedisServer, target: RedisServer, slot: int
) -> None:
    """Move whatever else `source` still holds in `slot` to `target`, as a resharding tool does
    before the hand-over: the cluster is shared by the session, and another test's key that
    happens to hash to `slot` makes `SETSLOT NODE` refuse ("I still hold keys")."""
    while names := await admin(cluster, source, "CLUSTER", "GETKEYSINSLOT", slot, 1000):
        await admin(
            cluster, source, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *names
        )


# -- waits, scans, durability ----------------------------------------------------------------------


async def test_a_wait_is_woken_by_the_completion_on_every_shard(
    redis_cluster_url: str, redis_cluster: LocalCluster, prefix: str
) -> None:
    """One waiting duplicate per master, polling off: each is woken by its record's PUBLISH."""
    owners = await in_thread(redis_cluster.slot_owners)
    keys: dict[int, str] = {}
    for n in range(100):
        keys.setdefault(owners[key_slot(f"wait-{n}".encode())], f"wait-{n}")
    assert len(keys) == 3
    worker = RedisKeyStore.from_url(redis_cluster_url, prefix=prefix)
    waiter = RedisKeyStore.from_url(redis_cluster_url, prefix=prefix)
    waiter._poll_first = waiter._poll_cap = 3600.0
    try:
        tokens = {}
        for key in keys.values():
            claimed = await worker.claim(key, FP, lease=LEASE, takeover=False)
            assert claimed.token is not None
            tokens[key] = claimed.token
        woken: dict[str, RecordState] = {}

        async def wait(key: str) -> None:
            record = await waiter.wait(key, timeout=3600)
            assert record is not None
            woken[key] = record.state

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for key in keys.values():
                    tg.start_soon(wait, key)

                async def subscribed() -> None:
                    # Until all three subscriptions are confirmed, each on its record's owner.
                    while confirmed(waiter) < 3:  # noqa: ASYNC110 (no event to wait for)
                        await anyio.sleep(0.01)

                await subscribed()
                for key, token in tokens.items():
                    assert await worker.complete(key, token, b"r", retention=60)
        assert woken == {key: RecordState.COMPLETED for key in keys.values()}
    finally:
        await worker.aclose()
        await waiter.aclose()


def confirmed(store: RedisKeyStore) -> int:
    nodes = store._here().nodes.values()
    return sum(
        1 for n in nodes for entry in n.waiters()._channels.values() if entry.wire is not None
    )


async def test_list_and_purge_cover_every_shard(
    store: RedisKeyStore, redis_cluster: LocalCluster, prefix: str
) -> None:
    keys = [f"scan-{n}" for n in range(90)]
    await first_executions(store, keys)
    owners = await in_thread(redis_cluster.slot_owners)
    assert len({owners[key_slot(key.encode())] for key in keys}) == 3
    listed = await store.list_records(limit=1000)
    assert sorted(r.key for r in listed) == sorted(keys)
    assert {r.state for r in listed} == {RecordState.COMPLETED}
    assert await store.purge_expired() == 0
    store.advance_clock_for_testing(3600 + 60)
    assert await store.purge_expired() == 90
    assert await store.list_records() == []
    for master in await in_thread(redis_cluster.masters):
        names = await in_thread(functools.partial(names_on, redis_cluster, master, prefix))
        # Only each record's last fence stays, for a day (rule 25), and the store's mark on the
        # master of its slot (`mark.py`): the histories went with their records (rule 24).
        kept = [name for name in names if name != prefix.encode() + b"meta"]
        assert all(name.endswith(b":f") for name in kept), names
    assert await store.histories() == []


async def test_the_keys_cli_lists_and_purges_every_shard(
    redis_cluster_url: str,
    redis_cluster: LocalCluster,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`mcp-once keys list|show|purge --store redis+cluster://...` (the CLI's own key prefix)."""
    namespace = uuid.uuid4().hex[:8]
    keys = [hashlib.sha256(f"cli-{namespace}-{n}".encode()).hexdigest() for n in range(30)]
    writer = open_store(redis_cluster_url)
    assert isinstance(writer, RedisKeyStore)
    try:
        # A result as the server layer stores it, so the CLI can read it.
        result = encode_result(CallToolResult(content=[TextContent(type="text", text="ok")]), 0.0)
        for key in keys:
            await first_execution(writer, key, result)

        def cli(*argv: str) -> tuple[int, str]:
            capsys.readouterr()
            try:
                code = main(list(argv))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            captured = capsys.readouterr()
            assert code == 0, captured.err
            return code, captured.out

        code, out = await in_thread(
            functools.partial(
                cli, "keys", "list", "--json", "--limit", "1000000", "--store", redis_cluster_url
            )
        )
        assert code == 0
        listed = {row["key"] for row in json.loads(out)}
        assert set(keys) <= listed
        owners = await in_thread(redis_cluster.slot_owners)
        assert len({owners[key_slot(key.encode())] for key in keys}) == 3
        code, out = await in_thread(
            functools.partial(cli, "keys", "show", keys[0], "--json", "--store", redis_cluster_url)
        )
        assert code == 0 and json.loads(out)["state"] == "completed"

        def later(url: str) -> RedisKeyStore:  # the operator's store, a day later
            opened = RedisKeyStore.from_url(url)
            opened.advance_clock_for_testing(24 * 3600)
            return opened

        monkeypatch.setattr(_common, "open_store", later)
        code, out = await in_thread(
            functools.partial(cli, "keys", "purge", "--store", redis_cluster_url)
        )
        assert out.strip() == f"purged {len(keys)} expired records"
        for master in await in_thread(redis_cluster.masters):
            left = await in_thread(functools.partial(names_on, redis_cluster, master, "mcp-once:"))
            assert not set(left) & {f"mcp-once:{{{key}}}".encode() for key in keys}
    finally:
        for key in keys:  # the CLI's prefix is shared: leave nothing behind
            name = f"mcp-once:{{{key}}}"
            owner = await in_thread(functools.partial(redis_cluster.owner, key_slot(key.encode())))
            await admin(redis_cluster, owner, "DEL", name)
        mark = b"mcp-once:meta"  # the prefix's mark, which the writer's first claim made
        owner = await in_thread(functools.partial(redis_cluster.owner, key_slot(mark)))
        await admin(redis_cluster, owner, "DEL", mark.decode())
        await writer.aclose()


async def test_durable_writes_wait_on_the_node_that_ran_them(
    redis_cluster_url: str, redis_cluster: LocalCluster, prefix: str
) -> None:
    durable = RedisKeyStore.from_url(
        redis_cluster_url, prefix=prefix, wait_replicas=1, wait_timeout=2.0
    )
    masters = await in_thread(redis_cluster.masters)
    try:
        await warm_up(durable)
        for master in masters:
            await admin(redis_cluster, master, "CONFIG", "RESETSTAT")
        owners = await in_thread(redis_cluster.slot_owners)
        keys: dict[int, str] = {}
        for n in range(100):
            keys.setdefault(owners[key_slot(f"durable-{n}".encode())], f"durable-{n}")
        for key in keys.values():
            await first_execution(durable, key)  # raises ReplicationUnconfirmed if unconfirmed
        for master in masters:
            found = stats(redis_cluster, master, "commandstats")
            # One claim and one complete here, each followed by its WAIT on this connection.
            assert (calls(found, "evalsha"), calls(found, "wait")) == (2, 2), found
    finally:
        await durable.aclose()


async def test_a_durable_write_sent_on_by_ask_is_confirmed_by_the_new_owners_replica(
    redis_cluster_url: str, redis_cluster: LocalCluster, prefix: str
) -> None:
    """While a slot migrates, a claim of a new key is answered ASK and runs on the importing
    node (ASKING + script + WAIT in one write there); the record and its WAIT land there."""
    slot = 4242
    [key] = keys_in_slot(slot, 1)
    masters = await in_thread(redis_cluster.masters)
    source = await in_thread(functools.partial(redis_cluster.owner, slot))
    target = next(m for m in masters if m.port != source.port)
    source_id = (await admin(redis_cluster, source, "CLUSTER", "MYID")).decode()
    target_id = (await admin(redis_cluster, target, "CLUSTER", "MYID")).decode()
    durable = RedisKeyStore.from_url(
        redis_cluster_url, prefix=prefix, wait_replicas=1, wait_timeout=2.0
    )
    try:
        await warm_up(durable)  # the slot map, before the migration starts
        await admin(redis_cluster, target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        await admin(redis_cluster, source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        for master in masters:
            await admin(redis_cluster, master, "CONFIG", "RESETSTAT")
        await first_execution(durable, key)  # raises ReplicationUnconfirmed if unconfirmed
        found = stats(redis_cluster, target, "commandstats")
        assert (calls(found, "asking"), calls(found, "evalsha"), calls(found, "wait")) == (2, 2, 2)
        assert await ours_in_slot(redis_cluster, target, slot, prefix) == 1
    finally:
        # Another test's key that hashes to the slot would make the hand-over refuse.
        await migrate_strays(redis_cluster, source, target, slot)
        for master in masters:
            await admin(redis_cluster, master, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        await durable.aclose()
        await in_thread(redis_cluster.wait_healthy)


# -- the redis-py cluster client, bad URLs, a plain redis:// at a cluster node --------------------


async def test_a_redis_py_cluster_client_gives_its_configuration_only(
    redis_cluster: LocalCluster, prefix: str
) -> None:
    """40 concurrent first calls through a store built from an uninitialized `RedisCluster`:
    the store reads the slot map once and never initializes or uses the client."""
    node = redis_cluster.masters()[0]
    client = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", node.port)])
    made = RedisKeyStore(client, prefix=prefix)
    try:
        async with anyio.create_task_group() as tg:
            for n in range(40):
                tg.start_soon(first_execution, made, f"client-{n}")
        assert len(await made.list_records(limit=100)) == 40
        assert made._cluster is not None and made._cluster.generation == 1
        assert client._initialize is True  # never initialized: still to do on first use
    finally:
        await made.aclose()
        await client.aclose()
    with pytest.raises(ValueError, match="decode_responses"):
        RedisKeyStore(RedisCluster(host="127.0.0.1", port=node.port, decode_responses=True))


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+cluster://", "at least one host:port"),
        ("redis+cluster://,", "at least one host:port"),
        ("redis+cluster://127.0.0.1", "host:port"),
        ("redis+cluster://127.0.0.1:0", "port 1-65535"),
        ("redis+cluster://127.0.0.1:99999", "port 1-65535"),
        ("redis+cluster://127.0.0.1:7000,127.0.0.1:x", "'127.0.0.1:x'"),
        ("redis+cluster://127.0.0.1:7000/2", "only database 0"),
        ("redis+cluster://127.0.0.1:7000?db=3", "only database 0"),
    ],
)
async def test_a_bad_cluster_url_is_refused_clearly(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        RedisKeyStore.from_url(url)
    with pytest.raises(ValueError, match=why):
        open_store(url)


async def test_seeds_that_do_not_answer_are_skipped_and_none_is_unavailable(
    redis_cluster: LocalCluster, prefix: str
) -> None:
    dead = [free_port(), free_port()]
    live = redis_cluster.masters()[0].port
    found = RedisKeyStore.from_url(
        f"redis+cluster://127.0.0.1:{dead[0]},127.0.0.1:{dead[1]},127.0.0.1:{live}", prefix=prefix
    )
    lost = RedisKeyStore.from_url(
        f"redis+cluster://127.0.0.1:{dead[0]},127.0.0.1:{dead[1]}", prefix=prefix
    )
    try:
        await first_execution(found, "seeded")
        with pytest.raises(StoreUnavailable, match="no Redis Cluster node answered CLUSTER SLOTS"):
            await lost.claim("seeded", FP, lease=LEASE, takeover=False)
    finally:
        await found.aclose()
        await lost.aclose()


async def test_a_plain_redis_url_at_a_cluster_node_says_to_use_the_cluster_scheme(
    redis_cluster: LocalCluster, prefix: str
) -> None:
    owners = redis_cluster.slot_owners()
    key = next(f"k{n}" for n in range(100) if owners[key_slot(f"k{n}".encode())] != owners[0])
    plain = RedisKeyStore.from_url(f"redis://127.0.0.1:{owners[0]}/0", prefix=prefix)
    try:
        with pytest.raises(StoreError, match="redis\\+cluster://"):
            await plain.claim(key, FP, lease=LEASE, takeover=False)
    finally:
        await plain.aclose()


# -- a failover ----------------------------------------------------------------------------------


async def test_a_killed_master_is_replaced_and_its_records_served_by_the_new_one(
    store: RedisKeyStore, redis_cluster: LocalCluster
) -> None:
    """Records written before a master is killed are read and replayed from the promoted
    replica, and new claims on its slots succeed, once the cluster has failed over; the store
    finds the new master by re-reading the map when the old one cannot be reached."""
    victim = redis_cluster.masters()[0]
    owners = redis_cluster.slot_owners()
    keys = [
        k for k in (f"fo-{n}" for n in range(60)) if owners[key_slot(k.encode())] == victim.port
    ]
    assert keys
    for key in keys:
        await first_execution(store, key)
    with redis_cluster.client(victim) as client:  # the replica has every record before the kill
        assert client.execute_command("WAIT", 1, 5000) == 1
    generation = store._cluster.generation if store._cluster else 0
    await in_thread(functools.partial(redis_cluster.kill, victim))
    try:
        await in_thread(redis_cluster.wait_healthy)
        for key in keys:
            replay = await store.claim(key, FP, lease=LEASE, takeover=False)
            assert replay.status is ClaimStatus.REPLAY and replay.result == b"r"
        await first_execution(store, f"{keys[0]}-after")
        assert store._cluster is not None and store._cluster.generation > generation
        assert victim.port not in [p for p in (await in_thread(redis_cluster.slot_owners))]
    finally:
        await in_thread(functools.partial(redis_cluster.restart, victim))
        await in_thread(redis_cluster.wait_healthy)
