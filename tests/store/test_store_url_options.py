"""Store options written in the URL's query (`redis://…?wait_replicas=1`), as `open_store`,
`--store` and `$MCP_ONCE_STORE` pass them: ours are taken out and parsed with their types, the
rest is redis-py's, and an option neither of us knows is an error naming it.

"Really applies" is shown by behaviour against a real Redis, not only by attributes: a store
opened from `?wait_replicas=1` on a server without replicas refuses to confirm a claim, which
the same URL without the option confirms."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from idempotency import (
    RedisKeyStore,
    ReplicationUnconfirmed,
    SQLiteKeyStore,
    open_store,
)
from idempotency._stores import sqlite
from idempotency._stores.redis import store as redis_store

pytestmark = pytest.mark.anyio

FP = "fp"


def with_query(url: str, query: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{query}"


def redis_opened(url: str) -> RedisKeyStore:
    store = open_store(url)
    assert isinstance(store, RedisKeyStore)
    return store


@pytest.mark.redis
async def test_wait_replicas_in_the_url_really_applies(redis_url: str, prefix: str) -> None:
    plain = redis_opened(with_query(redis_url, f"prefix={prefix}"))
    durable = redis_opened(
        with_query(redis_url, f"prefix={prefix}&wait_replicas=1&wait_timeout=0.2")
    )
    try:
        assert durable._wait_replicas == 1 and durable._wait_timeout == 0.2
        assert durable._prefix == prefix
        # The session's Redis has no replica: only a store that really waits for one refuses.
        assert (await plain.claim("k-plain", FP, lease=30, takeover=False)).token
        with pytest.raises(ReplicationUnconfirmed, match="0 replica"):
            await durable.claim("k-durable", FP, lease=30, takeover=False)
        assert await plain.get("k-durable") is None  # withdrawn, under the URL's prefix
    finally:
        await plain.aclose()
        await durable.aclose()


@pytest.mark.redis
async def test_a_redis_py_option_still_reaches_the_connection(redis_url: str, prefix: str) -> None:
    store = redis_opened(with_query(redis_url, f"client_name=url%2Dnamed&prefix={prefix}"))
    try:
        await store.get("anything")
        client = redis.Redis.from_url(redis_url)
        names = [entry["name"] for entry in client.client_list()]
        client.close()
        assert "url-named" in names  # percent-decoded by redis-py
    finally:
        await store.aclose()


def test_every_option_is_parsed_with_its_type() -> None:
    store = redis_opened(
        "redis://127.0.0.1:1/0?prefix=app%3Aone%3A&max_key_bytes=300&max_result_bytes=4096"
        "&orphan_retention=60.5&wait_replicas=2&wait_timeout=0.5&wait_aof=TRUE&socket_timeout=3"
    )
    assert store._prefix == "app:one:"
    assert (store._limits.max_key_bytes, store._limits.max_result_bytes) == (300, 4096)
    assert store._orphan_retention_us == 60_500_000
    assert (store._wait_replicas, store._wait_timeout, store._wait_aof) == (2, 0.5, True)
    # socket_timeout is ours: the connect timeout follows it, as with the keyword.
    assert (store._endpoint.timeout, store._endpoint.connect_timeout) == (3.0, 3.0)
    forever = redis_opened("redis://127.0.0.1:1/0?socket_timeout=none&wait_aof=off")
    assert forever._endpoint.timeout is None and forever._wait_aof is False


def test_a_url_option_wins_over_the_keyword_as_redis_py_does() -> None:
    store = RedisKeyStore.from_url("redis://127.0.0.1:1/0?wait_replicas=0", wait_replicas=3)
    assert store._wait_replicas == 0
    kept = RedisKeyStore.from_url("redis://127.0.0.1:1/0", wait_replicas=3)
    assert kept._wait_replicas == 3


def test_the_sentinel_and_cluster_urls_take_the_options_too() -> None:
    sentinel = redis_opened("redis+sentinel://127.0.0.1:1/svc?wait_replicas=1&client_name=x")
    assert sentinel._wait_replicas == 1 and sentinel._endpoint.client_name == "x"
    cluster = redis_opened("redis+cluster://127.0.0.1:1,127.0.0.1:2?wait_aof=yes")
    assert cluster._wait_aof is True and cluster._cluster is not None


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("wait_replicas=one", "wait_replicas='one': expected an integer"),
        ("wait_aof=flase", "wait_aof='flase': expected true or false"),
        ("wait_timeout=nan", "wait_timeout='nan': expected a finite number"),
        ("socket_timeout=soon", "socket_timeout='soon': expected a number or none"),
        ("wait_replicas=", "'wait_replicas' has no value"),
        ("wait_replicas=1&wait_replicas=2", "'wait_replicas' is given twice"),
        ("wait_replicas=-1", "wait_replicas must be >= 0"),
        ("bogus=1", "unknown key store URL option 'bogus'"),
        ("wait_replica=1", "unknown key store URL option 'wait_replica'"),
        # redis-py parses `timeout` for its blocking pool only; a plain pool refuses it.
        ("timeout=1", "unknown key store URL option 'timeout'"),
    ],
)
@pytest.mark.parametrize(
    "base",
    [
        "redis://:s3cret@127.0.0.1:1/0",
        "redis+sentinel://127.0.0.1:1/svc",
        "redis+cluster://127.0.0.1:1",
    ],
)
def test_a_bad_option_names_itself(base: str, query: str, why: str) -> None:
    with pytest.raises(ValueError, match=why.replace("(", r"\(")) as caught:
        open_store(f"{base}?{query}")
    assert "s3cret" not in str(caught.value)


def test_an_option_of_another_kind_of_url_names_itself() -> None:
    with pytest.raises(ValueError, match="unknown key store URL option 'ssl_ca_certs'"):
        open_store("unix:///tmp/redis.sock?ssl_ca_certs=/etc/ca.pem")
    # ...which the TLS kind accepts.
    assert redis_opened("rediss://127.0.0.1:1/0?ssl_cert_reqs=none")


def test_sqlite_urls_take_their_options(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/k.db?busy_timeout=1.5&orphan_retention=60")
    assert isinstance(store, SQLiteKeyStore) and store.path == tmp_path / "k.db"
    assert (store._busy_timeout, store._orphan_retention) == (1.5, 60.0)
    with pytest.raises(ValueError, match="unknown key store URL option 'mode'"):
        open_store(f"sqlite:///{tmp_path}/k.db?busy_timeout=1&mode=ro")
    with pytest.raises(ValueError, match="busy_timeout='x': expected a number"):
        open_store(f"sqlite:///{tmp_path}/k.db?busy_timeout=x")
    assert store._synchronous == "FULL"
    relaxed = open_store(f"sqlite:///{tmp_path}/n.db?synchronous=normal")
    assert isinstance(relaxed, SQLiteKeyStore) and relaxed._synchronous == "NORMAL"
    with pytest.raises(ValueError, match="synchronous must be one of"):
        open_store(f"sqlite:///{tmp_path}/k.db?synchronous=off")


@pytest.mark.parametrize(
    ("from_url", "options", "not_in_url"),
    [
        (RedisKeyStore.from_url, redis_store.URL_OPTIONS, {"url", "redis_kwargs"}),
        (SQLiteKeyStore.from_url, sqlite.URL_OPTIONS, {"url", "clock"}),
    ],
)
def test_every_keyword_option_can_be_written_in_the_url(
    from_url: Callable[..., Any], options: dict[str, Any], not_in_url: set[str]
) -> None:
    """A new keyword of `from_url` must get a parser, or the URL silently could not carry it."""
    keywords = set(inspect.signature(from_url).parameters) - not_in_url
    assert keywords == set(options)


def test_the_history_options_are_parsed_and_refused_where_they_cannot_hold() -> None:
    """Issue 45: `audit_stream` (off by default) and `record_format` (3 by default; 2 for a
    rolling upgrade), in the URL as by keyword; each combination that cannot be kept is a
    `ValueError` naming it."""
    default = redis_opened("redis://127.0.0.1:1/0")
    assert (default._history, default._audit_stream) == (True, False)
    streamed = redis_opened("redis://127.0.0.1:1/0?audit_stream=true")
    assert (streamed._history, streamed._audit_stream) == (True, True)
    pinned = redis_opened("redis://127.0.0.1:1/0?record_format=2")
    assert pinned._history is False  # format 2 carries no history
    assert RedisKeyStore.from_url("redis://127.0.0.1:1/0", record_format=2)._history is False
    refused = {
        "record_format=4": "record_format must be 2",
        "record_format=two": "record_format='two': expected an integer",
        "audit_stream=true&history=false": "audit_stream=true needs the histories",
        "audit_stream=true&record_format=2": "audit_stream=true needs the histories",
    }
    for query, why in refused.items():
        with pytest.raises(ValueError, match=why):
            open_store(f"redis://127.0.0.1:1/0?{query}")
    with pytest.raises(ValueError, match="audit_stream=true is not available on a Redis Cluster"):
        open_store("redis+cluster://127.0.0.1:1?audit_stream=true")


def test_every_store_option_is_in_the_configuration_reference() -> None:
    """Issue 45: every option a store's URL takes has its row in docs/configuration.md."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    table = doc.split("### Store options", 1)[1].split("\n###", 1)[0]
    for option in {*redis_store.URL_OPTIONS, *sqlite.URL_OPTIONS}:
        assert f"`{option}`" in table, option
