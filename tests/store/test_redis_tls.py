"""`RedisKeyStore` over TLS, on real TLS-only deployments with certificates made at test time
(`tests/redis_tls.py`): a Redis Cluster (`rediss+cluster://`, 3 masters, cluster bus over TLS)
and Sentinel (`rediss+sentinel://`, 1 primary + 2 replicas + 3 Sentinels, all TLS).

Every server requires a client certificate, so a call that succeeds proves the store's own
connections carried the CA and the client certificate to each node, including the nodes it only
learned of from `CLUSTER SLOTS` or from a Sentinel. The refusals prove the certificate is checked
against the host dialled (a name the certificate does not carry is refused) and that a wrong CA
or a missing client certificate is a prompt `StoreUnavailable`, not a hang.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.to_thread
import pytest
from redis.crc import key_slot
from redis_cluster import LocalCluster
from redis_sentinel import RedisSentinel
from redis_server import RedisServer
from redis_tls import TLSFiles

from idempotency import ClaimStatus, RecordState, RedisKeyStore, StoreUnavailable, open_store
from idempotency._stores.redis.cluster import seeds_of_url
from idempotency._stores.redis.sentinel import parse_sentinel_url

pytestmark = [pytest.mark.anyio]

FP = "fp"
LEASE = 60.0
#: A refusal must come well within this (the socket timeout is the store's default).
PROMPTLY = 10.0


# -- URLs (no server) -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "seeds", "first"),
    [
        (
            "rediss+cluster://h1:1,h2:2?ssl_ca_certs=/etc/ssl/ca.pem&ssl_cert_reqs=required",
            [("h1", 1), ("h2", 2)],
            "rediss://h1:1?ssl_ca_certs=/etc/ssl/ca.pem&ssl_cert_reqs=required",
        ),
        (
            "rediss+cluster://u:p@h1:1/0?ssl_certfile=/a/b.crt",
            [("h1", 1)],
            "rediss://u:p@h1:1/0?ssl_certfile=/a/b.crt",
        ),
    ],
)
def test_cluster_url_options_keep_the_slashes_of_their_paths(
    url: str, seeds: list[tuple[str, int]], first: str
) -> None:
    """Certificate options are file paths: a query value's slashes are not the URL's path."""
    assert seeds_of_url(url) == (seeds, first)


def test_rediss_sentinel_means_tls_to_the_data_nodes() -> None:
    hosts, service, options, _ = parse_sentinel_url(
        "rediss+sentinel://s1:26379,s2:26380/svc/2?ssl_ca_certs=/etc/ssl/ca.pem"
    )
    assert (hosts, service) == ([("s1", 26379), ("s2", 26380)], "svc")
    assert options["ssl"] is True and options["ssl_ca_certs"] == "/etc/ssl/ca.pem"
    assert options["db"] == 2
    assert "ssl" not in parse_sentinel_url("redis+sentinel://s1:26379/svc")[2]


def test_the_sentinels_get_the_data_nodes_tls_unless_told_otherwise(
    redis_tls_files: TLSFiles,
) -> None:
    url = f"rediss+sentinel://127.0.0.1:1/svc?{redis_tls_files.query()}"
    both = RedisKeyStore.from_url(url)
    plain_sentinels = RedisKeyStore.from_url(url, sentinel_kwargs={"ssl": False})
    for store, sentinel_tls in ((both, True), (plain_sentinels, False)):
        endpoint = store._endpoint
        assert endpoint.address.tls is not None
        assert endpoint.sentinel is not None
        (address,) = [sentinel.address for sentinel in endpoint.sentinel.endpoints]
        assert (address.tls is not None) is sentinel_tls
        assert address.server_hostname == "127.0.0.1"
    assert isinstance(open_store(url), RedisKeyStore)


# -- Redis Cluster over TLS -----------------------------------------------------------------------


def tls_cluster_url(cluster: LocalCluster, tls: TLSFiles, **options: Any) -> str:
    """One seed only: the other masters are reached at the addresses CLUSTER SLOTS gives.
    (Not "localhost": redis-py's cluster client rewrites it to 127.0.0.1.)"""
    return f"rediss+cluster://127.0.0.1:{cluster.masters()[0].port}?{tls.query(**options)}"


def one_key_per_master(cluster: LocalCluster, stem: str) -> dict[int, str]:
    """A record key on each master, by the master's port."""
    owners = cluster.slot_owners()
    keys: dict[int, str] = {}
    for n in range(1000):
        keys.setdefault(owners[key_slot(f"{stem}-{n}".encode())], f"{stem}-{n}")
    assert len(keys) == 3
    return keys


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_tls_cluster_serves_claims_replays_waits_and_listings_on_every_master(
    redis_tls_cluster: LocalCluster, redis_tls_files: TLSFiles, prefix: str, anyio_backend: str
) -> None:
    keys = one_key_per_master(redis_tls_cluster, f"tls-{anyio_backend}")
    store = RedisKeyStore.from_url(
        tls_cluster_url(redis_tls_cluster, redis_tls_files), prefix=prefix
    )
    store._poll_first = store._poll_cap = 3600.0  # woken by PUBLISH (over TLS) or not at all
    try:
        with anyio.fail_after(30):
            for port, key in keys.items():
                await serves_over_tls(store, redis_tls_cluster.by_port(port), prefix, key)
            listed = await store.list_records(limit=100)
            assert sorted(r.key for r in listed) == sorted(keys.values())
            assert {r.state for r in listed} == {RecordState.COMPLETED}
            # Each master was reached over its own verified TLS connection.
            assert {port for _, port in store._here().nodes} == set(keys)
    finally:
        await store.aclose()


async def refusal(url: str, prefix: str) -> str:
    """What a store at `url` says when its first call is refused (promptly)."""
    store = RedisKeyStore.from_url(url, prefix=prefix)
    try:
        with anyio.fail_after(PROMPTLY), pytest.raises(StoreUnavailable) as refused:
            await store.claim("refused", FP, lease=LEASE, takeover=False)
    finally:
        await store.aclose()
    print(f"refused: {refused.value}")
    return str(refused.value)


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize(
    ("wrong_ca", "client_cert", "says"),
    [(True, True, "certificate verify failed"), (False, False, "could not be reached")],
    ids=["wrong-ca", "no-client-certificate"],
)
async def test_a_tls_cluster_refuses_promptly_and_says_why(
    redis_tls_cluster: LocalCluster,
    redis_tls_files: TLSFiles,
    prefix: str,
    wrong_ca: bool,
    client_cert: bool,
    says: str,
) -> None:
    ca = redis_tls_files.wrong_ca if wrong_ca else None
    url = tls_cluster_url(redis_tls_cluster, redis_tls_files, ca=ca, client_cert=client_cert)
    message = await refusal(url, prefix)
    assert "no Redis Cluster node answered CLUSTER SLOTS" in message
    assert says in message


# -- Sentinel over TLS ----------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_rediss_sentinel_finds_the_primary_and_serves_over_tls(
    redis_tls_sentinel: RedisSentinel, prefix: str, anyio_backend: str
) -> None:
    store = RedisKeyStore.from_url(redis_tls_sentinel.url, prefix=prefix)
    store._poll_first = store._poll_cap = 3600.0  # woken by PUBLISH (over TLS) or not at all
    key = f"tls-sentinel-{anyio_backend}"
    try:
        with anyio.fail_after(30):
            await serves_over_tls(store, redis_tls_sentinel.master(), prefix, key)
            assert [r.key for r in await store.list_records(limit=10)] == [key]
    finally:
        await store.aclose()


async def serves_over_tls(
    store: RedisKeyStore, primary: RedisServer, prefix: str, key: str
) -> None:
    """claim, a wait woken by the completion's message, complete, replay; the record is on
    `primary` (read back by an admin TLS client)."""
    claimed = await store.claim(key, FP, lease=LEASE, takeover=False)
    assert claimed.status is ClaimStatus.CLAIMED and claimed.token is not None
    woken: list[RecordState] = []

    async def wait() -> None:
        record = await store.wait(key, timeout=3600)
        assert record is not None
        woken.append(record.state)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        # The waiter subscribes first: until the primary counts its subscription.
        while not await anyio.to_thread.run_sync(subscribed, primary, prefix, key):  # noqa: ASYNC110
            await anyio.sleep(0.01)
        assert await store.complete(key, claimed.token, b"done", retention=600)
    assert woken == [RecordState.COMPLETED]
    replayed = await store.claim(key, FP, lease=LEASE, takeover=False)
    assert replayed.status is ClaimStatus.REPLAY and replayed.result == b"done"
    with primary.client(socket_timeout=5.0) as admin:
        assert admin.exists(f"{prefix}{{{key}}}") == 1


def subscribed(node: RedisServer, prefix: str, key: str) -> bool:
    with node.client(socket_timeout=5.0) as admin:
        counts: Any = admin.pubsub_numsub(f"{prefix}{{{key}}}")
        return int(counts[0][1]) > 0


@pytest.mark.redis
@pytest.mark.slow
async def test_after_a_failover_the_store_follows_over_tls(
    fresh_tls_sentinel: RedisSentinel, prefix: str
) -> None:
    """The new primary, named by the Sentinels, is dialled and verified over TLS too; a record
    acknowledged by a replica (`wait_replicas=1`, replication over TLS) survives the crash."""
    # wait_timeout: after the failover the surviving replica resyncs with the new primary over
    # TLS before it can confirm "after"; on a loaded machine that took longer than the default
    # 1 s. The bound only matters when slow: a confirmation ends the wait at once.
    store = RedisKeyStore.from_url(
        fresh_tls_sentinel.url, prefix=prefix, wait_replicas=1, wait_timeout=4.0
    )
    store._poll_first = store._poll_cap = 3600.0
    try:
        with anyio.fail_after(60):
            await serves_over_tls(store, fresh_tls_sentinel.master(), prefix, "before")
            old = await anyio.to_thread.run_sync(fresh_tls_sentinel.kill_master)
            new = await anyio.to_thread.run_sync(fresh_tls_sentinel.wait_failover, old)
            assert new.port != old.port
            replayed = await store.claim("before", FP, lease=LEASE, takeover=False)
            assert (replayed.status, replayed.result) == (ClaimStatus.REPLAY, b"done")
            await serves_over_tls(store, new, prefix, "after")
    finally:
        await store.aclose()


@pytest.mark.redis
@pytest.mark.parametrize(
    ("wrong_ca", "host", "says"),
    [(True, "127.0.0.1", "certificate verify failed"), (False, "localhost", "mismatch")],
    ids=["wrong-ca", "name-not-in-certificate"],
)
async def test_rediss_sentinel_refuses_promptly_and_says_why(
    redis_tls_sentinel: RedisSentinel,
    redis_tls_files: TLSFiles,
    prefix: str,
    wrong_ca: bool,
    host: str,
    says: str,
) -> None:
    """The certificate must be signed by the CA given and name the host dialled: "localhost"
    resolves to the Sentinels' address, but their certificate names only IP 127.0.0.1."""
    url = redis_tls_sentinel.url.replace("127.0.0.1:", f"{host}:")
    if wrong_ca:
        url = url.replace(str(redis_tls_files.ca), str(redis_tls_files.wrong_ca))
    message = await refusal(url, prefix)
    assert "no Sentinel named the primary" in message
    assert says in message
