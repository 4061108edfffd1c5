"""The give-up signals rule 15 reads, each on its own: a cancel scope cancelled behind the run's
shield, a `notifications/cancelled` that arrives after the answer was handed out or before the
request was in flight, and a request id delivered twice.

Real sessions over memory streams in both eras (the SDK's dispatcher, as over stdio), counting
executions outside the answers; `answers.py`'s bookkeeping is checked for what no session can
show on demand (two connections of one user, the bound on what it remembers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from mcp import MCPError
from mcp.client import Client
from mcp.server.mcpserver import MCPServer
from mcp_types import REQUEST_TIMEOUT
from server_kit import SOON, marker

from idempotency import MemoryKeyStore, install
from idempotency._guard import answers
from idempotency._system_task import cancelled_beyond
from orchestrator.chaos import Chaos, Fault, FaultPlan, in_memory_transport

pytestmark = pytest.mark.anyio

ERAS = ["legacy", "modern"]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# -- the scope behind the shield -------------------------------------------------------------


async def test_a_cancelled_scope_is_seen_through_the_runs_shield() -> None:
    with anyio.CancelScope() as outer:
        with anyio.CancelScope(shield=True) as run:
            assert not cancelled_beyond(run)
            outer.cancel()
            assert cancelled_beyond(run)
            await anyio.lowlevel.checkpoint()  # shielded: still running
        assert not run.cancelled_caught
        await anyio.lowlevel.checkpoint()
    assert outer.cancelled_caught


async def test_a_shield_further_out_ends_the_search() -> None:
    with anyio.CancelScope() as outermost:
        with anyio.CancelScope(shield=True), anyio.CancelScope() as between:
            with anyio.CancelScope(shield=True) as run:
                outermost.cancel()  # beyond a shield of its own: reaches nobody here
                assert not cancelled_beyond(run)
                between.cancel()
                assert cancelled_beyond(run)
                await anyio.lowlevel.checkpoint()  # shielded: still running
            await anyio.lowlevel.checkpoint()  # `between` is cancelled: caught there
        assert between.cancelled_caught
        await anyio.lowlevel.checkpoint()  # and `outermost`, now no shield is in the way
    assert outermost.cancelled_caught


# -- cancels that race the answer ------------------------------------------------------------


@dataclass
class Hits:
    count: int = 0


def hit_server(hits: Hits) -> MCPServer:
    server = MCPServer("signals")

    @server.tool()
    async def hit() -> str:
        hits.count += 1
        return f"hit {hits.count}"

    install(server, MemoryKeyStore())
    return server


def connect(server: Any, era: str, chaos: Chaos | None = None) -> Client:
    target = in_memory_transport(server) if era == "modern" else server
    if chaos is not None:
        target = chaos.wrap(target)
    return Client(target, mode="auto" if era == "modern" else "legacy")


@pytest.mark.parametrize("era", ERAS)
async def test_a_cancel_sent_before_the_request_was_in_flight_still_counts(era: str) -> None:
    """A zero timeout: the client gives up at once, its cancel racing the request itself (the
    SDK registers a request in flight only once its task runs). Whether the first call ran
    (and its re-send replays) or was cancelled before its tool started (and the re-send runs),
    the two are one execution; the repeat after that is another."""
    hits = Hits()
    with anyio.fail_after(SOON):
        async with connect(hit_server(hits), era) as client:
            await client.list_tools()
            with pytest.raises(MCPError) as caught:
                await client.session.call_tool("hit", {}, read_timeout_seconds=0.0)
            assert caught.value.code == REQUEST_TIMEOUT
            resent = await client.call_tool("hit", {})
            ran = hits.count
            repeat = await client.call_tool("hit", {})
    assert ran == 1
    assert marker(resent)["status"] in {"replayed", "executed"}
    assert marker(repeat)["status"] == "executed" and hits.count == 2


@pytest.mark.parametrize("era", ERAS)
async def test_a_cancel_after_the_answer_was_written_marks_it_undelivered(era: str) -> None:
    """A lost acknowledgement: the server wrote the answer, the link swallowed it, the client's
    timeout sent a cancel for a request the server had finished. Its re-send replays."""
    hits = Hits()
    chaos = Chaos(FaultPlan(schedule={1: Fault.LOST_ACK}), seed=1)
    with anyio.fail_after(SOON):
        async with connect(hit_server(hits), era, chaos) as client:
            await client.list_tools()
            with pytest.raises(MCPError) as caught:
                await client.call_tool("hit", {}, read_timeout_seconds=0.2)
            assert caught.value.code == REQUEST_TIMEOUT
            await chaos.settled()
            resent = await client.call_tool("hit", {})
            repeat = await client.call_tool("hit", {})
    assert [f.kind for f in chaos.faults] == [Fault.LOST_ACK]
    assert hits.count == 2
    assert marker(resent)["status"] == "replayed"
    assert marker(repeat)["status"] == "executed"


# -- the bookkeeping -------------------------------------------------------------------------


class _Connection:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id


class _Session:
    def __init__(self, session_id: str) -> None:
        self._connection = _Connection(session_id)


@dataclass
class _Request:
    """What `answers` reads of a request: its connection (a legacy HTTP session) and its id."""

    session: _Session
    request_id: object


class _Marks(MemoryKeyStore):
    def __init__(self) -> None:
        super().__init__()
        self.marked: list[tuple[str, int]] = []

    async def abandon(self, key: str, fence: int) -> bool:
        self.marked.append((key, fence))
        return True


async def test_a_cancel_marks_only_the_answer_of_its_own_connection() -> None:
    """Request ids are unique within a connection only: one user's second connection reusing
    an id never marks the first connection's answer."""
    store = _Marks()
    first, second = _Session("first"), _Session("second")
    answers.sent(_Request(first, 7), store, "record-a", 3)
    await answers.cancelled(_Request(second, None), {"requestId": 7})
    assert store.marked == []
    assert answers.gave_up(_Request(second, 7))  # kept for the guard of that connection's 7
    await answers.cancelled(_Request(first, None), {"requestId": 7})
    assert store.marked == [("record-a", 3)]
    await answers.cancelled(_Request(first, None), {"requestId": 7})  # once only
    assert store.marked == [("record-a", 3)]
    assert answers.answered(_Request(second, 9), "record-b") is False


async def test_what_it_remembers_is_bounded() -> None:
    store = _Marks()
    session = _Session("bounded")
    for n in range(answers.KEPT + 10):
        answers.sent(_Request(session, n), store, f"record-{n}", 1)
    await answers.cancelled(_Request(session, None), {"requestId": 0})  # forgotten: oldest
    assert store.marked == []
    assert answers.gave_up(_Request(session, 0))  # so it counts as an early cancel instead
    await answers.cancelled(_Request(session, None), {"requestId": answers.KEPT + 9})
    assert store.marked == [(f"record-{answers.KEPT + 9}", 1)]


@pytest.mark.parametrize("era", ERAS)
async def test_a_twin_waiting_for_an_abandoned_call_takes_its_answer_over(era: str) -> None:
    """Two copies at once (a client that dispatches twice): the first's caller gives up while
    the second waits. The second gets the answer and it counts as delivered from then on: the
    next identical call is a repeat and runs."""
    runs: list[int] = []
    entered, gate = anyio.Event(), anyio.Event()
    server = MCPServer("twins")

    @server.tool()
    async def slow() -> str:
        runs.append(1)
        entered.set()
        await gate.wait()
        return f"slow {len(runs)}"

    install(server, MemoryKeyStore())
    answers_seen: list[str] = []
    with anyio.fail_after(SOON):
        async with connect(server, era) as client:
            await client.list_tools()

            async def first() -> None:
                with pytest.raises(MCPError):
                    await client.session.call_tool("slow", {}, read_timeout_seconds=0.3)
                gate.set()  # the tool finishes only once its caller has given up

            async def twin() -> None:
                await entered.wait()
                answers_seen.append(marker(await client.call_tool("slow", {}))["status"])

            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                tg.start_soon(twin)
            repeat = await client.call_tool("slow", {})
    assert answers_seen == ["replayed"]
    assert marker(repeat)["status"] == "executed"
    assert len(runs) == 2
