"""`mcp-once runs list|show|purge` against runs a real `orchestrator.Run` journalled.

Every run here is made by calling the shop's tools (a guarded `pay`, an unguarded `notify`)
through a real MCP session with `RetryingSession(..., run=run)`, into a real journal: an SQLite
file, and a private redis-server. A dangling intent is a `mark_done` that failed (a kill in W3);
a live lease is an agent that acquired the run and has not let it go. The CLI runs in-process
through `main([...])` (in a worker thread: it runs its own event loop), and once as the installed
console script. What matters after a refused or bad command is that the journal is unchanged.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from cli_run import cli, private_redis_server, sync_cli
from mcp import Client
from redis_server import RedisServer, free_port

from idempotency import SQLiteKeyStore
from mcp_once.scenarios._ledger import Ledger
from mcp_once.scenarios._shop import build_server
from orchestrator import Journal, RetryingSession, Run, open_journal

pytestmark = pytest.mark.anyio

PAY = {"call_id": "p", "account": "acme", "cents": 100}
NOTE = {"call_id": "n", "message": "hi"}
DAY = 86400.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the Redis journal's client is asyncio's


class Crash(Exception):
    """Stands in for a killed agent: leaves the `Run` block, which releases the run."""


class LosingDone:
    """A journal whose `mark_done` fails at `position`: that call stays a dangling intent."""

    def __init__(self, inner: Journal, position: int) -> None:
        self.inner = inner
        self.position = position
        self.retention = inner.retention

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def mark_done(self, run_id: str, fence: int, position: int) -> None:
        if position == self.position:
            raise OSError("killed before the done was written")
        await self.inner.mark_done(run_id, fence, position)


@pytest.fixture(scope="module")
def private_redis() -> Iterator[RedisServer]:
    yield from private_redis_server("runs CLI")


@dataclass
class Backend:
    name: str
    url: str
    keys: SQLiteKeyStore
    ledger: Ledger

    def journal(self, *, ago: float = 0.0) -> Journal:
        """The journal at `url`, its clock `ago` seconds behind the real one."""
        return open_journal(self.url, clock=(lambda: time.time() - ago) if ago else None)

    async def snapshot(self) -> list[tuple[Any, ...]]:
        """Every run with its entries: what a refused command must leave as it was."""
        journal = self.journal()
        try:
            return [
                (run.run_id, run.state, run.calls, run.dangling, run.fence, run.holder,
                 [(e.position, e.state, e.key) for e in await journal.entries(run.run_id)])
                for run in await journal.runs()
            ]  # fmt: skip
        finally:
            await journal.aclose()

    async def pipeline(
        self, run_id: str, *, crash: bool = False, lose_done_at: int | None = None, ago: float = 0
    ) -> None:
        """pay then notify under `Run(run_id)`; `crash` leaves with an exception (released,
        unfinished), `lose_done_at` leaves that position an intent."""
        journal = self.journal(ago=ago)
        used: Any = journal if lose_done_at is None else LosingDone(journal, lose_done_at)
        try:
            async with Client(build_server(self.keys, self.ledger, name="shop")) as client:
                try:
                    async with Run(run_id, journal=used) as run:
                        session = RetryingSession(client, run=run)
                        await session.call_tool("pay", PAY)
                        await session.call_tool("notify", NOTE)
                        if crash:
                            raise Crash
                except Crash:
                    pass
        finally:
            await journal.aclose()

    async def hold(self, run_id: str) -> None:
        """An agent holding `run_id` under a live lease (it acquired the run and is running)."""
        journal = self.journal()
        try:
            await journal.acquire(run_id, "agent-on-host-7", 600.0)
        finally:
            await journal.aclose()


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'journal.db'}"
    else:
        server: RedisServer = request.getfixturevalue("private_redis")
        import redis

        client = redis.Redis.from_url(server.url)
        client.flushdb()  # our private server: nothing else lives there
        client.close()
        url = server.url
    keys = SQLiteKeyStore(tmp_path / "keys.sqlite3")
    try:
        yield Backend(request.param, url, keys, Ledger(tmp_path / "ledger.sqlite3"))
    finally:
        await keys.aclose()


def cells(line: str) -> list[str]:
    """A table line's cells (cells hold no spaces; columns are two or more apart)."""
    return line.split()


def aligned(lines: list[str]) -> bool:
    """Every cell starts where its column's name starts."""
    starts = [[cell.start() for cell in re.finditer(r"\S+", line)] for line in lines]
    return all(found == starts[0][: len(found)] for found in starts[1:])


# -- list ----------------------------------------------------------------------------------------


async def test_list_shows_state_calls_dangling_intents_held_and_age(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    await backend.pipeline("done", ago=2 * 3600)
    await backend.pipeline("killed", crash=True, lose_done_at=1)
    await backend.hold("live")

    listed = await cli(capsys, "runs", "list", "--json", "--journal", backend.url)
    assert listed.code == 0, listed.err
    rows = {row["runId"]: row for row in listed.json()}
    assert [row["runId"] for row in listed.json()] == ["done", "killed", "live"]  # oldest first
    assert {k: rows["done"][k] for k in ("state", "calls", "dangling", "held")} == {
        "state": "finished", "calls": 2, "dangling": 0, "held": False,
    }  # fmt: skip
    assert rows["done"]["ageSeconds"] >= 2 * 3600 and rows["done"]["finishedAt"]
    assert (rows["killed"]["state"], rows["killed"]["calls"], rows["killed"]["dangling"]) == (
        "running", 2, 1,
    )  # fmt: skip
    assert rows["killed"]["held"] is False and rows["killed"]["holder"] is None
    assert rows["live"]["held"] is True and rows["live"]["holder"] == "agent-on-host-7"

    table = await cli(capsys, "runs", "list", "--journal", backend.url)
    assert table.code == 0
    lines = table.out.splitlines()
    assert aligned(lines[:-1])
    assert cells(lines[0]) == ["runId", "state", "calls", "dangling", "held", "age", "updatedAt"]
    assert cells(lines[1])[:6] == ["done", "finished", "2", "0", "false", "2h"]
    assert cells(lines[2])[:5] == ["killed", "running", "2", "1", "false"]
    assert cells(lines[3])[:5] == ["live", "running", "0", "0", "true"]
    assert lines[-1] == "(3 runs)"

    finished = await cli(capsys, "runs", "list", "--state", "finished", "--journal", backend.url)
    assert finished.out.splitlines()[1:] and finished.out.splitlines()[-1] == "(1 run)"
    limited = await cli(capsys, "runs", "list", "--json", "--limit", "1", "--journal", backend.url)
    assert [row["runId"] for row in limited.json()] == ["done"]


# -- show ----------------------------------------------------------------------------------------


async def test_show_gives_each_position_and_its_store_key_which_keys_show_finds(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    await backend.pipeline("r-1", crash=True, lose_done_at=1)
    shown = await cli(capsys, "runs", "show", "r-1", "--json", "--journal", backend.url)
    assert shown.code == 0, shown.err
    data = shown.json()
    assert (data["runId"], data["state"], data["calls"], data["dangling"]) == (
        "r-1",
        "running",
        2,
        1,
    )
    positions = data["positions"]
    assert [(p["position"], p["tool"], p["state"], p["server"]) for p in positions] == [
        (0, "pay", "done", "shop"),
        (1, "notify", "intent", "shop"),
    ]
    # The key itself is never printed; its store key names the server's record of the call.
    assert "run-" not in shown.out
    pay_record = await cli(
        capsys, "keys", "show", positions[0]["storeKey"], "--json",
        "--store", f"sqlite:///{backend.keys.path}",
    )  # fmt: skip
    assert pay_record.code == 0, pay_record.err
    assert pay_record.json()["state"] == "completed"

    table = await cli(capsys, "runs", "show", "r-1", "--journal", backend.url)
    assert table.code == 0
    assert "runId: r-1" in table.out and "dangling: 1" in table.out and "holder: -" in table.out
    rows = table.out.split("\n\n", 1)[1].splitlines()
    assert aligned(rows[:-1])
    assert cells(rows[0]) == ["position", "tool", "state", "storeKey", "server", "at"]
    assert cells(rows[1])[:5] == ["0", "pay", "done", positions[0]["storeKey"], "shop"]
    assert cells(rows[2])[:3] == ["1", "notify", "intent"]
    assert rows[-1] == "(2 positions)"


async def test_show_an_unknown_run_exits_1_and_changes_nothing(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    await backend.pipeline("known")
    before = await backend.snapshot()
    for json_flag in ([], ["--json"]):
        missing = await cli(capsys, "runs", "show", "nope", *json_flag, "--journal", backend.url)
        assert (missing.code, missing.out) == (1, "")
        assert missing.err == "mcp-once: no run 'nope' in the journal\n"
    assert await backend.snapshot() == before


# -- purge ---------------------------------------------------------------------------------------


async def test_purge_refuses_a_held_run_unless_forced(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    await backend.hold("live")
    before = await backend.snapshot()
    refused = await cli(capsys, "runs", "purge", "live", "--journal", backend.url)
    assert (refused.code, refused.out.strip()) == (1, "purged 0 runs")
    assert "is held by 'agent-on-host-7'" in refused.err and "--force" in refused.err
    assert await backend.snapshot() == before

    forced = await cli(
        capsys, "runs", "purge", "live", "--force", "--json", "--journal", backend.url
    )
    assert forced.code == 0 and forced.json() == {"purged": ["live"], "refused": {}}
    assert await backend.snapshot() == []


async def test_purge_refuses_an_unfinished_run_with_dangling_intents_unless_forced(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    await backend.pipeline("killed", crash=True, lose_done_at=1)
    await backend.pipeline("clean-crash", crash=True)  # released, every call done
    before = await backend.snapshot()
    refused = await cli(capsys, "runs", "purge", "killed", "--journal", backend.url)
    assert refused.code == 1 and "1 dangling intent(s)" in refused.err
    assert await backend.snapshot() == before

    clean = await cli(capsys, "runs", "purge", "clean-crash", "--journal", backend.url)
    assert (clean.code, clean.out.strip()) == (0, "purged 1 run")
    forced = await cli(capsys, "runs", "purge", "killed", "--force", "--journal", backend.url)
    assert (forced.code, forced.out.strip()) == (0, "purged 1 run")
    assert await backend.snapshot() == []


async def test_purge_finished_runs_older_than_an_age(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    # Within the journal's retention (7 days): older finished runs are already swept by every
    # run that finishes (tests/run/test_run_rules.py), so the operator's cut is a shorter age.
    await backend.pipeline("old", ago=5 * DAY)
    await backend.pipeline("recent", ago=2 * 3600)
    await backend.pipeline("unfinished", crash=True, ago=30 * DAY)
    await backend.hold("held-new")

    cut = await cli(
        capsys, "runs", "purge", "--finished", "--older-than", "3d", "--json",
        "--journal", backend.url,
    )  # fmt: skip
    assert cut.code == 0 and cut.json() == {"purged": ["old"], "refused": {}}
    everything = await cli(capsys, "runs", "purge", "--finished", "--journal", backend.url)
    assert (everything.code, everything.out.strip()) == (0, "purged 1 run")
    left = await cli(capsys, "runs", "list", "--json", "--journal", backend.url)
    assert [row["runId"] for row in left.json()] == ["unfinished", "held-new"]


async def test_purge_finished_leaves_a_finished_run_that_an_agent_entered_again(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    await backend.pipeline("again")
    await backend.hold("again")  # a restarted agent re-entered the finished run: it is held
    purged = await cli(capsys, "runs", "purge", "--finished", "--journal", backend.url)
    assert purged.code == 1 and "is held by" in purged.err
    assert [run[0] for run in await backend.snapshot()] == ["again"]


async def test_purge_an_unknown_run_exits_1_and_changes_nothing(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    await backend.pipeline("known")
    before = await backend.snapshot()
    missing = await cli(capsys, "runs", "purge", "nope", "--force", "--journal", backend.url)
    assert (missing.code, missing.out) == (1, "")
    assert missing.err == "mcp-once: no run 'nope' in the journal\n"
    assert await backend.snapshot() == before


# -- bad input -----------------------------------------------------------------------------------

ACTIONS = (["runs", "list"], ["runs", "show", "r"], ["runs", "purge", "r"])


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("foo://somewhere", "unknown journal URL scheme 'foo'"),
        ("memory://elsewhere", "the memory journal takes no location"),
        ("sqlite:///", "names no file"),
        ("sqlite:///journal.db?mode=ro", "has a query or fragment"),
        ("sqlite:journal.db", "expected sqlite:///relative/path.db"),
        ("", "must be a non-empty string"),
    ],
)
def test_a_bad_journal_url_exits_2_with_a_clear_message(
    url: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in ACTIONS:
        ran = sync_cli(capsys, *argv, "--journal", url)
        assert ran.code == 2 and ran.out == ""
        assert ran.err.startswith("mcp-once: bad journal URL:") and why in ran.err


def test_a_missing_sqlite_journal_exits_3_and_is_not_created(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for argv in ACTIONS:
        ran = sync_cli(capsys, *argv)  # the default: .mcp-once/journal.db, where Run keeps it
        assert ran.code == 3 and ran.out == ""
        assert ran.err.startswith(
            "mcp-once: the journal at 'sqlite:///.mcp-once/journal.db' cannot be reached:"
        )
        assert "no journal file at .mcp-once/journal.db" in ran.err
    assert list(tmp_path.iterdir()) == []


async def test_the_default_journal_is_the_one_run_writes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    async with Run("by-default"):  # no journal given: Run's default file
        pass
    listed = await cli(capsys, "runs", "list", "--json")
    assert listed.code == 0 and [row["runId"] for row in listed.json()] == ["by-default"]


def test_a_foreign_sqlite_file_exits_3_and_is_left_alone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import sqlite3

    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE mine (x)")
    before = path.read_bytes()
    ran = sync_cli(capsys, "runs", "list", "--journal", f"sqlite:///{path}")
    assert ran.code == 3 and "not an mcp-once journal" in ran.err and ran.out == ""
    assert path.read_bytes() == before


def test_an_unreachable_redis_exits_3_without_its_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = free_port()  # nothing listens there
    for argv in ACTIONS:
        ran = sync_cli(capsys, *argv, "--journal", f"redis://:s3cret@127.0.0.1:{port}/0")
        assert ran.code == 3 and ran.out == ""
        assert ran.err.startswith(
            f"mcp-once: the journal at 'redis://:***@127.0.0.1:{port}/0' cannot be reached:"
        )
        assert "s3cret" not in ran.err and "Traceback" not in ran.err


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["runs", "purge"], "give a RUN to purge, or --finished, not both"),
        (["runs", "purge", "r", "--finished"], "give a RUN to purge, or --finished, not both"),
        (["runs", "purge", "r", "--older-than", "1d"], "--older-than goes with --finished"),
        (["runs", "purge", "--finished", "--force"], "--force purges one named RUN only"),
        (["runs", "purge", "--finished", "--older-than", "soon"], "'soon' is not an age"),
        (["runs", "purge", "--finished", "--older-than=-1d"], "'-1d' is not an age"),
        (["runs", "list", "--limit", "0"], "--limit must be at least 1"),
    ],
)
def test_usage_errors_exit_2_before_the_journal_is_opened(
    argv: list[str], why: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ran = sync_cli(capsys, *argv, "--journal", f"sqlite:///{tmp_path}/missing.db")
    assert ran.code == 2 and why in ran.err and ran.out == ""  # not 3: checked before opening


# -- the installed console script ----------------------------------------------------------------


async def test_the_console_script_lists_shows_and_purges_like_main(backend: Backend) -> None:
    await backend.pipeline("sub")
    script = Path(sys.executable).with_name("mcp-once")
    assert script.exists(), f"the console script is not installed next to {sys.executable}"

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(script), "runs", *argv, "--journal", backend.url],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    listed = await anyio.to_thread.run_sync(functools.partial(run, "list", "--json"))
    assert listed.returncode == 0, listed.stderr
    assert [(r["runId"], r["state"]) for r in json.loads(listed.stdout)] == [("sub", "finished")]
    missing = await anyio.to_thread.run_sync(functools.partial(run, "show", "nope"))
    assert missing.returncode == 1 and "no run 'nope'" in missing.stderr
    purged = await anyio.to_thread.run_sync(functools.partial(run, "purge", "sub"))
    assert purged.returncode == 0 and purged.stdout.strip() == "purged 1 run"
