"""Operator commands cost what they show, not what the store holds (issue 48, item 7).

On stores of 5,000 records written in bulk by the stores' own encoders (`benchmarks/_populate.py`,
what the million-record benchmark uses): `keys list --limit 10` reads about ten records (Redis's
own counters: no script, one TIME, a few keys), `audit verify` streams the histories (it never
asks for all of them at once) with batched reads, and the table's last line says which records
it shows. The CLI runs in-process (`cli_run.cli`); the SQLite half of "reads along an index" is
`tests/store/test_sqlite_store.py`'s (the statement's plan).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from cli_run import cli, private_redis_server
from redis_server import RedisServer

from benchmarks import _populate
from benchmarks._redis import read_counters
from idempotency import RedisKeyStore, SQLiteKeyStore

pytestmark = pytest.mark.anyio

RECORDS = 5_000
#: One record in so many is UNKNOWN, one IN_PROGRESS (what the filters find).
UNKNOWN_EVERY, RUNNING_EVERY = 1_000, 1_001


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    yield from private_redis_server("keys-at-scale")


@pytest.fixture(scope="module")
def redis_url(redis_server: RedisServer) -> str:
    _populate.fill_redis(
        redis_server.url, RECORDS, unknown_every=UNKNOWN_EVERY, running_every=RUNNING_EVERY
    )
    return redis_server.url


@pytest.fixture(scope="module")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("keys-at-scale") / "keys.db"
    _populate.fill_sqlite(path, RECORDS, unknown_every=UNKNOWN_EVERY, running_every=RUNNING_EVERY)
    return f"sqlite:///{path}"


@contextlib.contextmanager
def counting(server: RedisServer) -> Iterator[dict[str, Any]]:
    """What the commands run inside the block sent (`Counters.minus`: round trips, calls per
    command, keys looked up), filled in when the block ends."""
    client = server.client()
    try:
        before = read_counters(client)
        used: dict[str, Any] = {}
        yield used
        used.update(read_counters(client).minus(before))
    finally:
        client.close()


async def test_a_redis_listing_reads_about_as_many_records_as_it_shows(
    redis_server: RedisServer, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with counting(redis_server) as used:
        listed = await cli(capsys, "keys", "list", "--limit", "10", "--store", redis_url)
    assert listed.code == 0, listed.err
    assert len(listed.out.splitlines()) == 1 + 10 + 1  # header, ten records, the count
    assert listed.out.splitlines()[-1] == (
        "(10 records, the first 10 the store's scan met, not the 10 oldest; oldest first)"
    )
    # Was: one EVALSHA (each with a TIME inside) per record of the store, 5,000 of each. Now
    # one SCAN, one MGET (each record with its history inside: the server and principal
    # columns, issue 45), one TIME, besides the store's mark: nothing in proportion to the
    # store, and no read per row.
    sent = used["commands"]
    assert sent["time"] == 1, used  # the clock read once for the listing
    assert sent.get("evalsha", 0) + sent.get("eval", 0) <= 2, used
    assert used["keys_looked_up"] <= 2 * 10 + 5, used
    assert sent["scan"] <= 2 and sent["mget"] == 1, used


async def test_a_redis_listing_filters_before_the_limit_and_says_when_it_has_every_match(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Five UNKNOWN records among 5,000: fewer than --limit, so the scan read on to the end,
    and the listing is every match, oldest first (the footer says so)."""
    listed = await cli(capsys, "keys", "list", "--state", "unknown", "--store", redis_url)
    assert listed.code == 0, listed.err
    assert listed.out.splitlines()[-1] == "(5 records, oldest first)"
    rows = (
        await cli(capsys, "keys", "list", "--state", "unknown", "--json", "--store", redis_url)
    ).json()
    assert len(rows) == RECORDS // UNKNOWN_EVERY and {row["state"] for row in rows} == {"unknown"}
    created = [row["createdAt"] for row in rows]
    assert created == sorted(created) and len(set(created)) == len(created)


@pytest.mark.parametrize("store", ["redis", "sqlite"])
async def test_audit_verify_streams_every_history(
    store: str,
    redis_server: RedisServer,
    redis_url: str,
    sqlite_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`audit verify` reads the histories as the store streams them (`iter_histories`), never
    the whole list at once (`histories()`, which would hold a million in memory)."""

    async def whole_list(self: object) -> list[tuple[str, str]]:
        raise AssertionError("audit verify asked for every history at once")

    for cls in (RedisKeyStore, SQLiteKeyStore):
        monkeypatch.setattr(cls, "histories", whole_list)
    url = redis_url if store == "redis" else sqlite_url
    with counting(redis_server) as used:
        verified = await cli(capsys, "audit", "verify", "--store", url)
    assert verified.code == 0, verified.err
    # Two events each (claimed, then completed or lease ran out); IN_PROGRESS ones one.
    running = sum(1 for n in range(1, RECORDS + 1) if n % RUNNING_EVERY == 0 and n % UNKNOWN_EVERY)
    events = 2 * RECORDS - running
    assert verified.out.splitlines()[0] == (
        f"verified {RECORDS} histories ({events} events): every chain holds"
    )
    if store == "redis":
        # Was one script (and round trip) per history; now batches, and the store's mark.
        assert used["commands"].get("evalsha", 0) + used["commands"].get("eval", 0) <= 2, used
        assert sum(used["commands"].values()) <= RECORDS // 100, used
