"""`mcp-once keys reconcile --app MODULE:ATTR`: the in-doubt records of a store put to the
reconcilers of the server object that guards them, with `--dry-run` writing nothing, on SQLite and
on Redis.

The app is a module the test writes into its working directory (imported as uvicorn imports an
app); its reconciler answers from a "provider" file the test controls: a record named there
happened (with that value), one marked "gone" did not, any other cannot be told.
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
    store_key,
    wire,
)

pytestmark = pytest.mark.anyio

ARGS = {"order": "o-1", "cents": 500}

APP = """
import json
from pathlib import Path

from mcp.server.mcpserver import MCPServer

from idempotency import Reconciled, install, open_store

mcp = MCPServer("shop")
PROVIDER = Path(__file__).with_name("provider.json")


@mcp.tool()
async def charge(order: str, cents: int) -> dict[str, str]:
    raise AssertionError("never runs in these tests")


@mcp.tool()
async def refund(order: str, cents: int) -> dict[str, str]:
    raise AssertionError("never runs in these tests")


def look_up(doubt):
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
    (tmp_path / f"{name}.py").write_text(f"STORE = {store_url!r}\n" + textwrap.dedent(APP))
    (tmp_path / "provider.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", *sys.path])
    yield tmp_path / name
    sys.modules.pop(name, None)


def open_url(url: str) -> KeyStore:
    if url.startswith("redis"):
        base, _, prefix = url.partition("?prefix=")
        return RedisKeyStore.from_url(base, prefix=prefix)
    return SQLiteKeyStore(url)


def name_of(key: str, tool: str = "charge") -> str:
    return store_key(default_scope(CallScope("shop", tool, None, None, None)), tool, key)


async def in_doubt(store: KeyStore, key: str, *, tool: str = "charge", unknown: bool = True) -> str:
    """A record left by a worker that died mid-call (lease already over); UNKNOWN if a claim
    found it since, else IN_PROGRESS under a lease that ran out."""
    name, fp = name_of(key, tool), fingerprint(tool, ARGS)
    with history_saying(server="shop"):  # as the guard of MCPServer("shop") claims
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
    assert [r["record"] for r in only.json()["records"]] == [other]

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
