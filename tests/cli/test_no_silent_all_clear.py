"""No silent all-clear (issue 48): a command that only reads, pointed at a place that holds
nothing of mcp-once's (another Redis database, another `?prefix=`, an empty SQLite file), exits 3
naming that place and asking whether it is the right --store, where it used to print "(0
records)", "every chain holds" over 0 histories or "no events" and exit 0. `keys history` of a
record that does not exist (a wrong --server) exits 1, where it said the record was "written
before histories were kept". A store the previous release wrote (records and histories, no mark)
reads as before, and reading marks nothing.

The records are written by a real guarded tool through a real MCP session, to a private Redis
(db 0, the default prefix) and to an SQLite file; the CLI reads them in-process. The Redis URL
carries an ACL user's password, which no message may print.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import redis
from cli_run import cli, private_redis_server
from mcp.client import Client
from mcp.server.mcpserver import MCPServer
from redis_server import RedisServer

from idempotency import (
    CallScope,
    KeyStore,
    MarkedStore,
    SQLiteKeyStore,
    default_scope,
    idempotent,
    open_store,
    store_key,
    wire,
)
from mcp_once._cli import _audit, build_parser

pytestmark = pytest.mark.anyio

SERVER = "shop"
TOOL = "charge"
PASSWORD = "s3cret-ops"


def record_of(client_key: str, server: str = SERVER) -> str:
    scope = default_scope(CallScope(server, TOOL, None, None, None))
    return store_key(scope, TOOL, client_key)


RECORD = record_of("order-1")
#: Every command that only reads, as an operator types it (the record: one that exists in the
#: right store).
READS = [
    ["keys", "list"],
    ["keys", "list", "--state", "unknown"],
    ["keys", "show", RECORD],
    ["keys", "history", RECORD],
    ["audit"],
    ["audit", "verify"],
]


async def charge_once(store: KeyStore) -> None:
    """A guarded charge, called through a real MCP session: one record, one history."""
    server = MCPServer(SERVER)

    @server.tool()
    @idempotent(store)
    async def charge(order: str, cents: int) -> str:
        return f"charged {cents} for {order}"

    async with Client(server) as client:
        await client.call_tool(
            TOOL, {"order": "o-1", "cents": 500}, meta={wire.KEY_META: "order-1"}
        )


@pytest.fixture(scope="module")
def private_redis() -> Iterator[RedisServer]:
    yield from private_redis_server("no silent all-clear")


async def written_redis(private_redis: RedisServer) -> str:
    """db 0 of the private Redis, under the default prefix, as a guarded charge left it; the
    URL names an ACL user with a password."""
    with private_redis.client() as admin:
        admin.flushall()
        admin.execute_command("ACL", "SETUSER", "ops", "on", f">{PASSWORD}", "~*", "&*", "+@all")
    host = f"127.0.0.1:{private_redis.port}"
    url = f"redis://ops:{PASSWORD}@{host}/0"
    store = open_store(url)
    try:
        await charge_once(store)
    finally:
        await store.aclose()
    return url


async def written_sqlite(tmp_path: Path) -> str:
    store = SQLiteKeyStore(tmp_path / "keys.db")
    try:
        await charge_once(store)
    finally:
        await store.aclose()
    return f"sqlite:///{tmp_path / 'keys.db'}"


@pytest.fixture
async def redis_url(private_redis: RedisServer) -> str:
    return await written_redis(private_redis)


@pytest.fixture
async def sqlite_url(tmp_path: Path) -> str:
    return await written_sqlite(tmp_path)


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The right store, either kind, as a guarded charge left it."""
    if request.param == "sqlite":
        return await written_sqlite(tmp_path)
    return await written_redis(request.getfixturevalue("private_redis"))


def redis_keys(url: str) -> list[bytes]:
    with redis.Redis.from_url(url) as client:
        return sorted(client.scan_iter())


async def every_read_exits_3(capsys: pytest.CaptureFixture[str], url: str, said: str) -> None:
    for argv in READS:
        ran = await cli(capsys, *argv, "--store", url)
        assert (ran.code, ran.out, ran.err) == (3, "", f"mcp-once: {said}\n"), argv
        assert PASSWORD not in ran.err


async def every_read_succeeds(capsys: pytest.CaptureFixture[str], url: str) -> None:
    for argv in READS:
        ran = await cli(capsys, *argv, "--store", url)
        assert ran.code == 0, (argv, ran.err)
        assert "nothing of mcp-once's" not in ran.err


@pytest.mark.redis
async def test_a_wrong_redis_database_or_prefix_is_named_not_an_all_clear(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await every_read_succeeds(capsys, redis_url)
    shown = f"redis://ops:***@{redis_url.split('@')[1]}"
    wrong_db = redis_url.removesuffix("/0") + "/5"
    await every_read_exits_3(
        capsys,
        wrong_db,
        f"nothing of mcp-once's at {shown.removesuffix('/0') + '/5'!r} (prefix 'mcp-once:'):"
        " is this the right --store?",
    )
    wrong_prefix = f"{redis_url}?prefix=billing%3A"
    await every_read_exits_3(
        capsys,
        wrong_prefix,
        f"nothing of mcp-once's at {shown + '?prefix=billing%3A'!r} (prefix 'billing:'): is this"
        " the right --store?",
    )
    # Looking created nothing in either place: db 5 is empty, db 0 holds the record (its
    # history inside it), its fence memo (rule 25) and the mark its first claim made, and
    # the in-doubt index `keys list --state unknown` completed there (a cache of the records in
    # doubt, none here), and nothing under billing:.
    assert redis_keys(wrong_db) == []
    assert redis_keys(redis_url) == sorted(
        [
            f"mcp-once:{{{RECORD}}}".encode(),
            f"mcp-once:{{{RECORD}}}:f".encode(),
            b"mcp-once:meta",
            b"mcp-once:in-doubt",
        ]
    )


async def test_an_empty_sqlite_file_is_named_not_an_all_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    url = f"sqlite:///{empty}"
    said = f"nothing of mcp-once's at {url!r} (file {empty}): is this the right --store?"
    await every_read_exits_3(capsys, url, said)
    # Opened twice over: the file has the schema now, still no mark and no record.
    await every_read_exits_3(capsys, url, said)
    with sqlite3.connect(empty) as conn:
        assert conn.execute("SELECT count(*) FROM meta").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM records").fetchone() == (0,)


async def test_the_right_sqlite_file_reads_as_before(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await every_read_succeeds(capsys, sqlite_url)


async def test_a_store_whose_records_are_all_gone_is_still_ours(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Marked, nothing in it any more: an empty listing is the truth there, so it is said."""
    store = SQLiteKeyStore(tmp_path / "keys.db")
    claimed = await store.claim("a" * 64, "fp", lease=30, takeover=False, tool=TOOL)
    assert claimed.token is not None
    await store.release("a" * 64, claimed.token)
    await store.aclose()
    with sqlite3.connect(tmp_path / "keys.db") as conn:
        conn.execute("DELETE FROM records")
        conn.execute("DELETE FROM history")
        conn.execute("DELETE FROM audit")
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    listed = await cli(capsys, "keys", "list", "--state", "unknown", "--store", url)
    assert (listed.code, listed.out.splitlines()[-1], listed.err) == (
        0,
        "(0 records, oldest first)",
        "",
    )
    verified = await cli(capsys, "audit", "verify", "--store", url)
    assert (verified.code, verified.out.splitlines()[0]) == (
        0,
        "verified 0 histories (0 events): every chain holds",
    )


# -- keys history of a record that is not there ---------------------------------------------------


async def test_history_of_a_record_that_does_not_exist_exits_1(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = store_url
    missing = record_of("order-2")
    ran = await cli(capsys, "keys", "history", missing, "--store", url)
    assert (ran.code, ran.out) == (1, "")
    assert ran.err.startswith(f"mcp-once: no record {missing} in the key store at '")
    assert "and no history of one: check the key (or --client-key, --tool and --server)" in ran.err
    assert PASSWORD not in ran.err
    # A client key under a wrong --server: exit 1 too, naming the server that does hold one.
    wrong_server = ["--client-key", "order-1", "--tool", TOOL, "--server", "shop-eu"]
    ran = await cli(capsys, "keys", "history", *wrong_server, "--store", url)
    assert (ran.code, ran.out) == (1, "")
    missing = record_of("order-1", "shop-eu")
    assert ran.err.startswith(f"mcp-once: no live record for key {missing} (server 'shop-eu')")
    assert f"server {SERVER!r}: store key {record_of('order-1')}" in ran.err
    assert PASSWORD not in ran.err
    right = ["--client-key", "order-1", "--tool", TOOL, "--server", SERVER]
    found = await cli(capsys, "keys", "history", *right, "--store", url, "--json")
    assert found.code == 0 and [e["event"] for e in found.json()] == ["claimed", "completed"]


async def test_history_of_a_record_kept_without_one_says_so_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record that is there but has no history (written before histories were kept, as a
    store with `history=False` writes it) is not a wrong key."""
    store = SQLiteKeyStore(tmp_path / "keys.db", history=False)
    await store.claim(RECORD, "fp", lease=30, takeover=False, tool=TOOL)
    await store.aclose()
    ran = await cli(capsys, "keys", "history", RECORD, "--store", f"sqlite:///{tmp_path}/keys.db")
    assert (ran.code, ran.out) == (0, "")
    assert (
        ran.err
        == f"mcp-once: record {RECORD} has no history (written before histories were kept)\n"
    )


# -- a store the previous release wrote: records, no mark -----------------------------------------


async def unmark(url: str) -> None:
    """Make the store what the previous release left: the same records and histories, no mark
    (that release wrote every key this one does but `meta`; the SQLite table came with this
    one)."""
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute("DROP TABLE meta")
    else:
        with redis.Redis.from_url(url) as client:
            assert client.delete("mcp-once:meta") == 1


async def mark_of(url: str) -> object:
    store = open_store(url)
    try:
        assert isinstance(store, MarkedStore)
        return await store.mark()
    finally:
        await store.aclose()


async def test_a_store_the_previous_release_wrote_reads_as_before_and_stays_unmarked(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = store_url
    assert await mark_of(url) is not None
    await unmark(url)
    await every_read_succeeds(capsys, url)
    listed = await cli(capsys, "keys", "list", "--json", "--store", url)
    assert [row["key"] for row in listed.json()] == [RECORD]
    assert await mark_of(url) is None  # looking marked nothing
    # This release's next write marks it.
    store = open_store(url)
    try:
        await store.claim("b" * 64, "fp", lease=30, takeover=False, tool=TOOL)
        mark = await store.mark()  # type: ignore[attr-defined]
    finally:
        await store.aclose()
    assert mark is not None and mark.format == 1


# -- audit --follow: says so, and follows all the same ---------------------------------------------


async def test_a_follower_of_a_store_nothing_wrote_yet_says_so_and_follows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower may be started beside a server that is yet to write (a sidecar): it warns,
    instead of exiting, and prints what arrives."""
    monkeypatch.setattr(_audit, "_FOLLOW_EVERY", 0.02)
    path = tmp_path / "keys.db"
    url = f"sqlite:///{path}"
    path.touch()  # an empty file, as a deployment might create it before its server starts
    args = build_parser().parse_args(["audit", "--follow", "--json", "--store", url])
    reader, writer = open_store(url), open_store(url)
    printed: list[str] = []
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(_audit._audit, reader, args)
            with anyio.fail_after(30):
                while "is this the right --store?" not in (said := capsys.readouterr()).err:
                    printed += said.out.splitlines()
                    await anyio.sleep(0.01)
                await writer.claim("c" * 64, "fp", lease=30, takeover=False, tool=TOOL)
                while not printed:
                    printed += capsys.readouterr().out.splitlines()
                    await anyio.sleep(0.01)
            group.cancel_scope.cancel()
    finally:
        await reader.aclose()
        await writer.aclose()
    assert [(e["record"], e["event"]) for e in map(json.loads, printed)] == [("c" * 64, "claimed")]
