"""`mcp-once keys reconcile --app MODULE:ATTR`: the in-doubt records of a store put to the
reconcilers of the server object that guards them, with `--dry-run` writing nothing, on SQLite and
on Redis.

The app is a module the test writes into its working directory (imported as uvicorn imports an
app); its reconciler answers from a "provider" file the test controls: a record named there
happened (with that value), one marked "gone" did not, any other cannot be told. Each question
is noted in an "asked" file, so a test counts them.

Rule 25: a second server ("depot") with a tool of the same name shares the store; the app's
reconciler is asked only about records whose history names the app's server ("shop").
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from cli_run import cli
from mcp.client import Client

from idempotency import (
    CallScope,
    ClaimStatus,
    KeyStore,
    RedisKeyStore,
    SQLiteKeyStore,
    default_scope,
    fingerprint,
    history_saying,
    open_store,
    store_key,
    wire,
)
from mcp_once._cli import _audit

pytestmark = pytest.mark.anyio

ARGS = {"order": "o-1", "cents": 500}

APP = """
import json
from pathlib import Path

from mcp.server.mcpserver import MCPServer

from idempotency import Reconciled, install, open_store

mcp = MCPServer(SERVER)
PROVIDER = Path(__file__).with_name("provider.json")
ASKED = Path(__file__).with_name("asked")


@mcp.tool()
async def charge(order: str, cents: int) -> dict[str, str]:
    raise AssertionError("never runs in these tests")


@mcp.tool()
async def refund(order: str, cents: int) -> dict[str, str]:
    raise AssertionError("never runs in these tests")


def look_up(doubt):
    with ASKED.open("a") as asked:
        asked.write(f"{SERVER} {doubt.record}\\n")
    said = json.loads(PROVIDER.read_text()).get(doubt.record)
    if said is None:
        return Reconciled.unknown()
    if said == "gone":
        return Reconciled.not_happened()
    return Reconciled.happened(said)


install(mcp, open_store(STORE), reconcile={"charge": look_up})
"""


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "keys.db")
        return
    url = str(request.getfixturevalue("redis_url"))
    yield f"{url}{'&' if '?' in url else '?'}prefix={request.getfixturevalue('redis_namespace')}:"


@pytest.fixture
def app_dir(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The working directory, holding `payapp.py` (the app) and `provider.json`."""
    name = f"payapp_{abs(hash(tmp_path)) % 10**8}"
    write_app(tmp_path / f"{name}.py", store_url, "shop")
    (tmp_path / "provider.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", *sys.path])
    yield tmp_path / name
    sys.modules.pop(name, None)


def write_app(path: Path, store_url: str, server: str) -> None:
    path.write_text(f"STORE = {store_url!r}\nSERVER = {server!r}\n" + textwrap.dedent(APP))


def asked(app_dir: Path) -> list[str]:
    """Every question the apps' reconcilers were asked, as "SERVER RECORD", in order."""
    path = app_dir.parent / "asked"
    return path.read_text().splitlines() if path.exists() else []


def open_url(url: str) -> KeyStore:
    if url.startswith("redis"):
        base, _, prefix = url.partition("?prefix=")
        return RedisKeyStore.from_url(base, prefix=prefix)
    return SQLiteKeyStore(url)


def name_of(key: str, tool: str = "charge", server: str = "shop") -> str:
    return store_key(default_scope(CallScope(server, tool, None, None, None)), tool, key)


async def in_doubt(
    store: KeyStore,
    key: str,
    *,
    tool: str = "charge",
    unknown: bool = True,
    server: str | None = "shop",
) -> str:
    """A record left by a worker that died mid-call (lease already over); UNKNOWN if a claim
    found it since, else IN_PROGRESS under a lease that ran out. Claimed as the guard of
    `MCPServer(server)` claims (its claimed event names the server); `server` None: as a store
    user or an earlier release claims, naming none."""
    name, fp = name_of(key, tool, server or "shop"), fingerprint(tool, ARGS)
    with history_saying(server=server):
        claimed = await store.claim(name, fp, lease=1e-3, takeover=False, tool=tool)
    assert claimed.status is ClaimStatus.CLAIMED
    if unknown:
        while (await store.claim(name, fp, lease=1e-3, takeover=False)).status is not (
            ClaimStatus.UNKNOWN
        ):  # the millisecond lease runs out on the store's own clock
            pass
    return name


async def states(url: str, *names: str) -> list[str | None]:
    store = open_url(url)
    try:
        found = [await store.get(n) for n in names]
    finally:
        await store.aclose()
    return [None if r is None else r.state.value for r in found]


async def test_dry_run_says_what_each_would_become_and_changes_nothing(
    app_dir: Path, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = open_url(store_url)
    try:
        happened = await in_doubt(store, "k-happened")
        gone = await in_doubt(store, "k-gone", unknown=False)
        untold = await in_doubt(store, "k-untold")
        other = await in_doubt(store, "k-refund", tool="refund")
    finally:
        await store.aclose()
    (app_dir.parent / "provider.json").write_text(
        json.dumps({happened: {"charge": "ch_1"}, gone: "gone"})
    )
    app = f"{app_dir.name}:mcp"
    ran = await cli(capsys, "keys", "reconcile", "--app", app, "--store", store_url, "--dry-run")
    assert ran.code == 0, ran.err
    lines = {line.split()[0]: line for line in ran.out.splitlines()}
    assert f"{happened}  shop  charge  happened -> would be completed" in ran.out
    assert "happened -> would be completed" in lines[happened]
    assert "not_happened -> would be released" in lines[gone]
    assert "unknown -> would be UNKNOWN still" in lines[untold]
    assert "no_reconciler" in lines[other]
    assert await states(store_url, happened, gone, untold, other) == [
        "unknown",
        "in_progress",
        "unknown",
        "unknown",
    ]

    only = await cli(
        capsys,
        "keys",
        "reconcile",
        "--app",
        app,
        "--store",
        store_url,
        "--tool",
        "refund",
        "--dry-run",
        "--json",
    )
    assert [(r["record"], r["server"]) for r in only.json()["records"]] == [(other, "shop")]
    assert asked(app_dir) == [f"shop {name}" for name in (happened, gone, untold)]

    ran = await cli(capsys, "keys", "reconcile", "--app", app, "--store", store_url, "--json")
    assert ran.code == 1  # two records stay in doubt: an operator has work left
    answers = {r["record"]: (r["answer"], r["applied"]) for r in ran.json()["records"]}
    assert answers == {
        happened: ("happened", True),
        gone: ("not_happened", True),
        untold: ("unknown", False),
        other: ("no_reconciler", False),
    }
    assert await states(store_url, happened, gone, untold, other) == [
        "completed",
        None,  # released: the client's retry runs the tool
        "unknown",
        "unknown",
    ]

    # The client's retry of the happened call replays the provider's value, converted as the
    # tool's own return value is (structured output).
    sys.modules.pop(app_dir.name, None)
    from importlib import import_module

    server = import_module(app_dir.name).mcp
    async with Client(server, mode="legacy") as client:
        replay = await client.call_tool("charge", ARGS, meta={wire.KEY_META: "k-happened"})
    assert replay.structured_content == {"charge": "ch_1"}
    assert (replay.meta or {})[wire.IDEMPOTENCY_META]["status"] == "replayed"


async def test_a_bad_app_is_a_clear_usage_error(
    app_dir: Path, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    made = open_url(store_url)  # the store exists: only the app is wrong
    await made.purge_expired()
    await made.aclose()
    for app, said in [
        ("nocolon", "MODULE:ATTR"),
        ("no_such_module_here:mcp", "cannot import"),
        (f"{app_dir.name}:nothing", "no attribute"),
        (f"{app_dir.name}:PROVIDER", "not a server mcp-once guards"),
    ]:
        ran = await cli(capsys, "keys", "reconcile", "--app", app, "--store", store_url)
        assert ran.code == 2 and said in ran.err, (app, ran)


async def test_only_the_apps_own_records_are_asked_about(
    app_dir: Path, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rule 25. "shop" and "depot" both guard a tool `charge` on one store, and each left a
    record in doubt under the same client key; a third record's history names no server (a
    store user's claim, or an earlier release's). `keys reconcile --app shop` asks shop's
    reconciler about shop's record only, leaves depot's alone (counted), lists the nameless one
    as not asked, and its verdict's history names the operator. Then depot's app settles its
    own."""
    write_app(app_dir.with_name("depot_app.py"), store_url, "depot")
    store = open_url(store_url)
    try:
        mine = await in_doubt(store, "k-1")
        theirs = await in_doubt(store, "k-1", server="depot")
        nameless = await in_doubt(store, "k-2", server=None)
    finally:
        await store.aclose()
    provider = {mine: {"charge": "ch_shop"}, theirs: {"charge": "ch_depot"}}
    (app_dir.parent / "provider.json").write_text(json.dumps(provider))
    shop = ("--app", f"{app_dir.name}:mcp", "--store", store_url)

    dry = await cli(capsys, "keys", "reconcile", *shop, "--dry-run")
    assert dry.code == 0, dry.err
    assert dry.out.splitlines() == [
        f"{mine}  shop  charge  happened -> would be completed: the client's retry replays the"
        " reconciler's value",
        f"{nameless}  -  charge  server_unknown -> would be UNKNOWN still, not asked: its"
        " history names no server (a store keeping no history, or claimed before histories"
        " named servers); check the system of record, then `mcp-once keys settle` it",
        "left alone: in-doubt records of other servers (1 of depot): not this app's",
    ]
    assert asked(app_dir) == [f"shop {mine}"]

    wrong = await cli(capsys, "keys", "reconcile", *shop, "--server", "depot")
    assert wrong.code == 2 and "the app is server 'shop', not 'depot'" in wrong.err
    assert asked(app_dir) == [f"shop {mine}"]  # refused before anything was asked

    ran = await cli(
        capsys, "keys", "reconcile", *shop, "--server", "shop", "--by", "ana@ops",
        "--reason", "INC-9", "--json",
    )  # fmt: skip
    assert ran.code == 1  # the nameless record is left for an operator
    assert ran.json() == {
        "dryRun": False,
        "records": [
            {"record": mine, "tool": "charge", "server": "shop", "answer": "happened",
             "applied": True},
            {"record": nameless, "tool": "charge", "server": None, "answer": "server_unknown",
             "applied": False},
        ],
        "otherServers": {"depot": 1},
    }  # fmt: skip
    assert asked(app_dir) == [f"shop {mine}"] * 2
    assert await states(store_url, mine, theirs, nameless) == ["completed", "unknown", "unknown"]
    history = (await cli(capsys, "keys", "history", mine, "--store", store_url, "--json")).json()
    [verdict] = [e for e in history if e["event"] == "reconciled"]
    assert (verdict["answer"], verdict["by"], verdict["reason"]) == ("happened", "ana@ops", "INC-9")
    assert {e["server"] for e in history if e["event"] == "claimed"} == {"shop"}

    depot = await cli(capsys, "keys", "reconcile", "--app", "depot_app:mcp", "--store", store_url)
    assert depot.code == 1 and f"{theirs}  depot  charge  happened -> completed" in depot.out
    assert asked(app_dir)[-1] == f"depot {theirs}" and len(asked(app_dir)) == 3
    history = (await cli(capsys, "keys", "history", theirs, "--store", store_url, "--json")).json()
    [verdict] = [e for e in history if e["event"] == "reconciled"]
    assert verdict["by"] == _audit.operator()  # by default, the OS user at this host
    sys.modules.pop("depot_app", None)


async def test_a_store_keeping_no_history_has_no_record_asked_about(
    app_dir: Path, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without histories (`history=false`) no record can say its server: none is asked about,
    each is listed as such, and the command exits 1 (an operator settles them)."""
    url = store_url if store_url.startswith("redis") else f"sqlite:///{store_url}"
    bare = f"{url}{'&' if '?' in url else '?'}history=false"
    store = open_store(bare)
    try:
        record = await in_doubt(store, "k-1")
    finally:
        await store.aclose()
    (app_dir.parent / "provider.json").write_text(json.dumps({record: {"charge": "ch_1"}}))
    ran = await cli(
        capsys, "keys", "reconcile", "--app", f"{app_dir.name}:mcp", "--store", bare, "--json"
    )
    assert ran.code == 1
    assert [(r["record"], r["server"], r["answer"]) for r in ran.json()["records"]] == [
        (record, None, "server_unknown")
    ]
    assert asked(app_dir) == []
    assert await states(store_url, record) == ["unknown"]
