"""`orchestrator.Run`, in process: each resume rule, the lease, turns, precedence, bad input.

The server is the shop (`pay` guarded, `set_value` guarded and annotated idempotent, `notify`
neither), in memory, over a real MCP session; its ledger counts the effects, so "nothing sent" is
checked where it happens. A crash is stood in for by leaving the `Run` block with an exception
(the run is released and resumable) or by a journal whose `mark_done` fails (an intent left).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from fake_clock import FakeClock
from mcp import Client

from idempotency import MemoryKeyStore
from mcp_once.scenarios._ledger import Ledger
from mcp_once.scenarios._shop import build_server
from orchestrator import (
    JournalUnavailable,
    MemoryJournal,
    OutcomeUnknown,
    RetryingSession,
    Run,
    RunBusy,
    RunDiverged,
    RunExpired,
    RunFinished,
    SQLiteJournal,
    derive_key,
    run_key,
)
from orchestrator._journal import holder
from orchestrator.fastmcp import RetryingClient

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])]

PAY = {"call_id": "p", "account": "acme", "cents": 100}
SET = {"call_id": "s", "name": "status", "value": 1}
NOTE = {"call_id": "n", "message": "hi"}


class Crash(Exception):
    """Stands in for a killed process: leaves the `Run` block, which releases the run."""


@dataclass
class Shop:
    client: Client
    ledger: Ledger

    def count(self, call_id: str) -> int:
        return len(self.ledger.by_call().get(call_id, []))


@asynccontextmanager
async def shop(tmp_path: Path) -> AsyncIterator[Shop]:
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    async with Client(build_server(MemoryKeyStore(), ledger)) as client:
        yield Shop(client, ledger)


def text(result: Any) -> str:
    return str(result.content[0].text)


class LosingDone(MemoryJournal):
    """A journal whose `mark_done` fails: every call stays an intent (a crash in W3)."""

    async def mark_done(self, run_id: str, fence: int, position: int) -> None:
        raise JournalUnavailable("the disk is gone")


async def test_keys_come_from_the_run_id_and_position_and_every_entry_is_done(
    tmp_path: Path,
) -> None:
    journal = MemoryJournal()
    async with shop(tmp_path) as s, Run("r", journal=journal) as run:
        rs = RetryingSession(s.client, run=run)
        _, report = await rs.call_tool_with_report("pay", PAY)
        await rs.call_tool("notify", NOTE)
    assert report.key == run_key("r", 0) == derive_key("run", "r", "0")
    entries = await journal.entries("r")
    assert [(e.position, e.tool, e.state, e.server) for e in entries] == [
        (0, "pay", "done", "chaos-shop"),
        (1, "notify", "done", "chaos-shop"),
    ]
    summary = await journal.run("r")
    assert summary is not None and summary.state == "finished" and summary.holder is None


async def test_a_resumed_run_replays_its_calls_under_the_same_keys(tmp_path: Path) -> None:
    journal = LosingDone()
    async with shop(tmp_path) as s:
        with pytest.raises(Crash):
            async with Run("r", journal=journal) as run:
                rs = RetryingSession(s.client, run=run)
                first = text(await rs.call_tool("pay", PAY))
                await rs.call_tool("set_value", SET)
                await rs.call_tool("notify", NOTE)
                raise Crash
        assert [e.state for e in await journal.entries("r")] == ["intent"] * 3
        async with Run("r", journal=journal) as run:
            rs = RetryingSession(s.client, run=run)
            assert text(await rs.call_tool("pay", PAY)) == first  # replayed
            await rs.call_tool("set_value", SET)
            # An intent on a tool the gate does not open: never sent again.
            with pytest.raises(OutcomeUnknown) as unknown:
                await rs.call_tool("notify", NOTE)
        assert unknown.value.reason == "resumed_intent" and unknown.value.attempts == 0
        assert unknown.value.key == run_key("r", 2)
        assert (s.count("p"), s.count("s"), s.count("n")) == (1, 1, 1)


async def test_a_done_unguarded_call_is_not_sent_again(tmp_path: Path) -> None:
    journal = MemoryJournal()
    async with shop(tmp_path) as s:
        with pytest.raises(Crash):
            async with Run("r", journal=journal) as run:
                await RetryingSession(s.client, run=run).call_tool("notify", NOTE)
                raise Crash
        async with Run("r", journal=journal) as run:
            with pytest.raises(OutcomeUnknown) as unknown:
                await RetryingSession(s.client, run=run).call_tool("notify", NOTE)
        assert unknown.value.reason == "resumed_done"
        assert s.count("n") == 1


async def test_other_arguments_or_another_tool_at_a_position_diverge(tmp_path: Path) -> None:
    journal = MemoryJournal()
    async with shop(tmp_path) as s:
        with pytest.raises(Crash):
            async with Run("r", journal=journal) as run:
                await RetryingSession(s.client, run=run).call_tool("pay", PAY)
                raise Crash
        for tool, arguments in (("pay", {**PAY, "cents": 999}), ("set_value", SET)):
            with pytest.raises(RunDiverged) as diverged:
                async with Run("r", journal=journal) as run:
                    await RetryingSession(s.client, run=run).call_tool(tool, arguments)
            message = str(diverged.value)
            assert "'pay'" in message and f"{tool!r}" in message and "position 0" in message
            assert "999" not in message  # arguments are named by fingerprint only
            assert diverged.value.recorded.tool == "pay" and diverged.value.tool == tool
        assert s.count("p") == 1 and s.count("s") == 0


async def test_an_entry_older_than_the_servers_retention_expires(tmp_path: Path) -> None:
    clock = FakeClock()
    journal = MemoryJournal(clock=clock)
    async with shop(tmp_path) as s:
        with pytest.raises(Crash):
            async with Run("r", journal=journal, clock=clock) as run:
                await RetryingSession(s.client, run=run).call_tool("pay", PAY)
                raise Crash
        clock.advance(24 * 3600 + 1)  # the shop advertises retentionSeconds 86400
        with pytest.raises(RunExpired) as expired:
            async with Run("r", journal=journal, clock=clock) as run:
                await RetryingSession(s.client, run=run).call_tool("pay", PAY)
        assert expired.value.retention == 86400 and expired.value.position == 0
        assert s.count("p") == 1
        # Within the retention it replays.
        clock2 = FakeClock()
        with pytest.raises(Crash):
            async with Run("r2", journal=journal, clock=clock2) as run:
                await RetryingSession(s.client, run=run).call_tool("pay", {**PAY, "call_id": "q"})
                raise Crash
        clock2.advance(3600)
        async with Run("r2", journal=journal, clock=clock2) as run:
            await RetryingSession(s.client, run=run).call_tool("pay", {**PAY, "call_id": "q"})
        assert s.count("q") == 1


async def test_a_second_live_holder_is_busy_and_a_dead_ones_lease_runs_out(
    tmp_path: Path,
) -> None:
    """`wait=0`: no waiting, so what the journal says is what the caller gets."""
    clock = FakeClock()
    journal = MemoryJournal(clock=clock)
    async with Run("r", journal=journal, lease=5):
        with pytest.raises(RunBusy):
            async with Run("r", journal=journal, wait=0):
                pass
    # A holder that died where it cannot be seen: acquired, never released, never renewed.
    await journal.acquire("dead", "crashed-process", 5)
    with pytest.raises(RunBusy):
        async with Run("dead", journal=journal, wait=0):
            pass
    clock.advance(5.1)
    async with Run("dead", journal=journal, wait=0) as run:
        assert run.fence == 2


async def test_the_lease_is_renewed_while_the_run_is_held() -> None:
    journal = MemoryJournal()
    async with Run("r", journal=journal, lease=0.3):
        await anyio.sleep(0.6)  # twice the lease: only renewal keeps it
        with pytest.raises(RunBusy):
            async with Run("r", journal=journal, wait=0):
                pass


class Refusals(MemoryJournal):
    """Counts the acquires it refused: how often a waiter looked."""

    refused = 0

    async def acquire(self, run_id: str, holder: str, lease: float, **proof: Any) -> int:
        try:
            return await super().acquire(run_id, holder, lease, **proof)
        except RunBusy:
            self.refused += 1
            raise


async def test_a_run_is_waited_for_until_its_holder_lets_go(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The second copy waits (the default: the lease and a fifth) and enters, at the next fence,
    once the first finished; it says once what it waits for, however often it looks."""
    journal = Refusals()
    entered: list[int | None] = []

    async def second() -> None:
        async with Run("r", journal=journal, lease=5) as run:
            entered.append(run.fence)

    with caplog.at_level("WARNING", logger="orchestrator.run"):
        async with (
            anyio.create_task_group() as group,
            Run("r", journal=journal, lease=5) as first,
        ):
            group.start_soon(second)
            with anyio.fail_after(10):
                while journal.refused < 5:  # noqa: ASYNC110 (the journal has no event)
                    await anyio.sleep(0.01)
            assert entered == []
    assert entered == [(first.fence or 0) + 1]
    said = [r.getMessage() for r in caplog.records if "waiting up to" in r.getMessage()]
    assert len(said) == 1, said
    assert "alive on this host" in said[0], said
    assert Run("r", lease=5).wait == pytest.approx(6.0)


async def test_a_live_holder_past_the_wait_is_busy_saying_so() -> None:
    journal = MemoryJournal()
    async with Run("r", journal=journal, lease=5):
        started = anyio.current_time()
        with pytest.raises(RunBusy, match=r"alive on this host\); waited 0.2s") as raised:
            async with Run("r", journal=journal, wait=0.2):
                pass
        assert anyio.current_time() - started >= 0.2
        assert raised.value.fence == 1 and raised.value.left is not None


async def test_a_holder_proven_dead_on_this_host_is_taken_over_at_once() -> None:
    """Its proof names this boot and PID namespace and a process that is not there: with a
    30 s lease and no waiting allowed, the run is entered at once."""
    mine = holder.this_process()
    if mine is None:
        pytest.skip("a dead holder is proven from /proc")
    journal = MemoryJournal()
    gone = dataclasses.replace(mine, started=mine.started - 1)  # its PID is someone else's now
    await journal.acquire("r", "killed:1:ab", 30, alive=gone.encode())
    async with Run("r", journal=journal, wait=0) as run:
        assert run.fence == 2
        summary = await journal.run("r")
        assert summary is not None and summary.alive == mine.encode()


@pytest.mark.parametrize("wait", [-1, float("inf"), float("nan"), True, "1"])
async def test_a_bad_wait_is_refused(wait: Any) -> None:
    with pytest.raises(ValueError, match="wait must be"):
        Run("r", wait=wait)


async def test_a_holder_taken_over_sends_nothing_more(tmp_path: Path) -> None:
    clock = FakeClock()
    journal = MemoryJournal(clock=clock)
    async with shop(tmp_path) as s, Run("r", journal=journal, lease=5, clock=clock) as stale:
        clock.advance(6)  # its lease ran out (say it was paused); another copy takes over
        await journal.acquire("r", "other", 5)
        with pytest.raises(RunBusy):
            await RetryingSession(s.client, run=stale).call_tool("pay", PAY)
        assert s.count("p") == 0


async def test_a_finished_run_executes_nothing(tmp_path: Path) -> None:
    journal = MemoryJournal()
    async with shop(tmp_path) as s:
        async with Run("r", journal=journal) as run:
            rs = RetryingSession(s.client, run=run)
            first = text(await rs.call_tool("pay", PAY))
            await rs.call_tool("notify", NOTE)
        async with Run("r", journal=journal) as run:
            assert run.finished_before
            rs = RetryingSession(s.client, run=run)
            assert text(await rs.call_tool("pay", PAY)) == first
            with pytest.raises(OutcomeUnknown):
                await rs.call_tool("notify", NOTE)
            with pytest.raises(RunFinished):
                await rs.call_tool("set_value", SET)
        assert (s.count("p"), s.count("n"), s.count("s")) == (1, 1, 0)


async def test_finishing_a_run_forgets_runs_finished_longer_ago_than_the_retention() -> None:
    clock = FakeClock()
    journal = MemoryJournal(clock=clock, retention=3600)
    async with Run("old", journal=journal, clock=clock):
        pass
    clock.advance(1800)
    async with Run("recent", journal=journal, clock=clock):
        pass
    assert {run.run_id for run in await journal.runs()} == {"old", "recent"}
    clock.advance(1801)  # "old" finished 3601 s ago, "recent" 1801 s ago
    async with Run("new", journal=journal, clock=clock):
        pass
    assert {run.run_id for run in await journal.runs()} == {"recent", "new"}


async def test_a_turn_numbers_calls_by_index_not_by_completion(tmp_path: Path) -> None:
    journal = LosingDone()
    calls = [("pay", PAY), ("set_value", SET), ("pay", {**PAY, "call_id": "p2"})]
    async with shop(tmp_path) as s:
        with pytest.raises(Crash):
            async with Run("r", journal=journal) as run:
                rs = RetryingSession(s.client, run=run)
                with run.turn(3) as turn:
                    # Only the last two calls of the response went out before the "kill".
                    for index in (2, 1):
                        with turn.call(index):
                            await rs.call_tool(*calls[index])
                raise Crash
        assert [e.position for e in await journal.entries("r")] == [1, 2]
        async with Run("r", journal=journal) as run:
            rs = RetryingSession(s.client, run=run)

            async def one(index: int) -> None:
                with turn.call(index):
                    await rs.call_tool(*calls[index])

            with run.turn(3) as turn:
                async with anyio.create_task_group() as group:
                    for index in range(3):
                        group.start_soon(one, index)
            await rs.call_tool("notify", NOTE)  # after the turn: position 3
        entries = await journal.entries("r")
        assert [(e.position, e.tool) for e in entries] == [
            (0, "pay"),
            (1, "set_value"),
            (2, "pay"),
            (3, "notify"),
        ]
        assert (s.count("p"), s.count("s"), s.count("p2")) == (1, 1, 1)


async def test_precedence_explicit_then_meta_then_run_then_key_source(tmp_path: Path) -> None:
    journal = MemoryJournal()
    asked: list[object] = []

    def source(request: object) -> str:
        asked.append(request)
        return "from-source"

    async with shop(tmp_path) as s, Run("r", journal=journal) as run:
        rs = RetryingSession(s.client, run=run, key_source=source)
        _, explicit = await rs.call_tool_with_report("pay", PAY, idempotency_key="mine")
        _, in_meta = await rs.call_tool_with_report(
            "set_value", SET, meta={"io.github.mcp-once/idempotency-key": "in-meta"}
        )
        _, journalled = await rs.call_tool_with_report("notify", NOTE)
    assert (explicit.key, in_meta.key, journalled.key) == ("mine", "in-meta", run_key("r", 0))
    assert asked == []  # the run comes before the key source
    assert [e.tool for e in await journal.entries("r")] == ["notify"]


async def test_bad_input_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="run id"):
        Run("")
    with pytest.raises(TypeError, match="journal"):
        Run("r", journal=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lease"):
        Run("r", lease=0)
    with pytest.raises(ValueError, match="unknown journal URL"):
        async with Run("r", journal="postgres://x"):
            pass
    with pytest.raises(TypeError, match="Run"):
        RetryingSession(object(), run="r")  # type: ignore[arg-type]
    journal = MemoryJournal()
    async with shop(tmp_path) as s:
        run = Run("r", journal=journal)
        with pytest.raises(RuntimeError, match="enter the Run"):
            await RetryingSession(s.client, run=run).call_tool("pay", PAY)
        async with run:
            rs = RetryingSession(s.client, run=run)
            with pytest.raises(ValueError, match="plain JSON"):
                await rs.call_tool("pay", {**PAY, "cents": float("nan")})
            with run.turn(2) as turn:
                with pytest.raises(ValueError, match=r"turn\.call"):
                    await rs.call_tool("pay", PAY)
                with pytest.raises(ValueError, match="outside this turn"):
                    turn.call(2).__enter__()
                with turn.call(0):
                    await rs.call_tool("pay", PAY)
                    with pytest.raises(ValueError, match="already called"):
                        await rs.call_tool("pay", PAY)
        with pytest.raises(RuntimeError, match="entered once"):
            async with run:
                pass
        assert s.count("p") == 1
        assert [e.position for e in await journal.entries("r")] == [0]


async def test_the_default_journal_is_a_sqlite_file_under_mcp_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    async with shop(tmp_path) as s, Run("r") as run:
        await RetryingSession(s.client, run=run).call_tool("pay", PAY)
        assert isinstance(run.journal, SQLiteJournal)
    assert (tmp_path / ".mcp-once" / "journal.db").exists()
    journal = SQLiteJournal(tmp_path / ".mcp-once" / "journal.db")
    try:
        assert [e.tool for e in await journal.entries("r")] == ["pay"]
    finally:
        await journal.aclose()
    async with Run("u", journal=f"sqlite:///{tmp_path / 'j.db'}"):
        pass
    assert (tmp_path / "j.db").exists()


async def test_a_fastmcp_retrying_client_journals_with_run(
    tmp_path: Path, anyio_backend: str
) -> None:
    if anyio_backend != "asyncio":
        pytest.skip("FastMCP's client runs on asyncio only")
    journal = MemoryJournal()
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    server = build_server(MemoryKeyStore(), ledger)
    async with Run("r", journal=journal) as run, RetryingClient(server, run=run) as client:
        assert client.run is run and client.new().run is run
        await client.call_tool("pay", PAY)
    entries = await journal.entries("r")
    assert [(e.tool, e.key, e.state) for e in entries] == [("pay", run_key("r", 0), "done")]
