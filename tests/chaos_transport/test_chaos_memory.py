"""Each fault has its observable effect on a real MCP session over an in-memory wire.

The server is a plain MCPServer served by `Server.run` over memory streams (both eras), the
client is the SDK's `Client`; only the link between them is faulty.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from chaos_helpers import ERAS, EXPECTED_TIMEOUT, MODE, WAIT, CountingServer, text
from mcp import MCPError
from mcp.client import Client, ClientSession
from mcp.client._transport import ReadStream, TransportStreams, WriteStream
from mcp.shared.message import SessionMessage
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from orchestrator.chaos import Chaos, Fault, FaultPlan, FaultRecord, in_memory_transport

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"]),
]


@asynccontextmanager
async def connected(counting: CountingServer, chaos: Chaos, era: str) -> AsyncIterator[Client]:
    async with Client(chaos.wrap(counting.server), mode=MODE[era]) as client:
        # Listed up front so call_tool's output validation sends no tools/list mid-test.
        await client.list_tools()
        yield client


def kinds(records: tuple[FaultRecord, ...]) -> list[Fault]:
    return [record.kind for record in records]


@pytest.mark.parametrize("era", ERAS)
async def test_lost_ack_runs_the_tool_and_times_the_client_out(era: str) -> None:
    counting = CountingServer()
    chaos = Chaos(FaultPlan(schedule={1: Fault.LOST_ACK}), seed=1)
    async with connected(counting, chaos, era) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("hit", {}, read_timeout_seconds=EXPECTED_TIMEOUT)
        assert caught.value.code == REQUEST_TIMEOUT
        await counting.executed(1)
        with anyio.fail_after(WAIT):
            await chaos.settled()  # the swallowed answer came back and was dropped
        assert counting.executions == 1
        # The link keeps carrying later responses.
        assert text(await client.call_tool("hit", {})) == "2"
    assert kinds(chaos.faults) == [Fault.LOST_ACK]
    assert chaos.faults[0].tool == "hit" and chaos.faults[0].method == "tools/call"


@pytest.mark.parametrize("era", ERAS)
async def test_dropped_request_never_runs_and_times_the_client_out(era: str) -> None:
    counting = CountingServer()
    chaos = Chaos(FaultPlan(schedule={1: Fault.DROP_REQUEST}), seed=1)
    async with connected(counting, chaos, era) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("hit", {}, read_timeout_seconds=EXPECTED_TIMEOUT)
        assert caught.value.code == REQUEST_TIMEOUT
        # FIFO link: this answer can only arrive after the dropped request would have been handled.
        assert text(await client.call_tool("hit", {})) == "1"
        assert counting.executions == 1
    assert kinds(chaos.faults) == [Fault.DROP_REQUEST]


@pytest.mark.parametrize("era", ERAS)
async def test_duplicate_runs_the_tool_twice_and_answers_once(era: str) -> None:
    counting = CountingServer()
    chaos = Chaos(FaultPlan(schedule={1: Fault.DUPLICATE}), seed=1)
    async with connected(counting, chaos, era) as client:
        first = await client.call_tool("hit", {})
        await counting.executed(2)
        with anyio.fail_after(WAIT):
            await chaos.settled()
        assert counting.executions == 2
        assert text(first) in {"1", "2"}
        # The second copy's answer was swallowed: the next call gets its own, fresh answer.
        assert text(await client.call_tool("hit", {})) == "3"
    assert kinds(chaos.faults) == [Fault.DUPLICATE]


@pytest.mark.parametrize("era", ERAS)
async def test_close_before_write_fails_the_write_and_runs_nothing(era: str) -> None:
    counting = CountingServer()
    chaos = Chaos(FaultPlan(schedule={1: Fault.CLOSE_BEFORE_WRITE}), seed=1)
    transport = chaos.wrap(counting.server)
    async with Client(transport, mode=MODE[era]) as client:
        await client.list_tools()
        with pytest.raises(MCPError) as caught:
            await client.call_tool("hit", {})
        assert caught.value.code == CONNECTION_CLOSED
        assert transport.closed
        # Dead for good: the next call fails at once, and is not even numbered.
        with pytest.raises(MCPError) as again:
            await client.call_tool("hit", {})
        assert again.value.code == CONNECTION_CLOSED
    assert counting.executions == 0
    assert kinds(chaos.faults) == [Fault.CLOSE_BEFORE_WRITE]
    assert chaos.requests_seen == 1


@pytest.mark.parametrize("era", ERAS)
async def test_close_after_write_leaves_the_outcome_unknown(era: str) -> None:
    counting = CountingServer()
    chaos = Chaos(FaultPlan(schedule={1: Fault.CLOSE_AFTER_WRITE}), seed=1)
    transport = chaos.wrap(counting.server)
    async with Client(transport, mode=MODE[era]) as client:
        await client.list_tools()
        with pytest.raises(MCPError) as caught:
            await client.call_tool("hit", {})
        assert caught.value.code == CONNECTION_CLOSED
        assert transport.closed
    # The server got the request and then EOF: it may or may not have run it. Both are legal;
    # never more than once.
    assert counting.executions in {0, 1}
    assert kinds(chaos.faults) == [Fault.CLOSE_AFTER_WRITE]
    assert transport.fault_counts()[Fault.CLOSE_AFTER_WRITE] == 1


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize("kind", [Fault.DELAY_REQUEST, Fault.DELAY_RESPONSE])
async def test_delay_still_delivers_the_answer(era: str, kind: Fault) -> None:
    counting = CountingServer()
    plan = FaultPlan(schedule={1: kind}, delay_min_seconds=0.05, delay_max_seconds=0.05)
    chaos = Chaos(plan, seed=1)
    async with connected(counting, chaos, era) as client:
        started = anyio.current_time()
        result = await client.call_tool("hit", {})
        took = anyio.current_time() - started
    assert text(result) == "1" and counting.executions == 1
    assert took >= 0.05
    assert kinds(chaos.faults) == [kind]
    assert chaos.faults[0].delay_seconds == 0.05


@pytest.mark.parametrize("era", ERAS)
async def test_a_delay_longer_than_the_timeout_still_reaches_the_server(era: str) -> None:
    counting = CountingServer()
    plan = FaultPlan(
        schedule={1: Fault.DELAY_RESPONSE}, delay_min_seconds=0.2, delay_max_seconds=0.2
    )
    chaos = Chaos(plan, seed=1)
    async with connected(counting, chaos, era) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("hit", {}, read_timeout_seconds=EXPECTED_TIMEOUT)
        assert caught.value.code == REQUEST_TIMEOUT
        assert counting.executions == 1  # the answer was on its way; only late
        assert text(await client.call_tool("hit", {})) == "2"


CALLS = 20


async def run_probabilistic(seed: int) -> tuple[tuple[FaultRecord, ...], int]:
    """Twenty calls under a mixed plan; returns the fault log and the executions seen."""
    counting = CountingServer()
    plan = FaultPlan(
        lost_ack=0.05,
        drop_request=0.05,
        duplicate=0.2,
        delay_request=0.1,
        delay_response=0.1,
        tools={"hit"},
        delay_min_seconds=0.001,
        delay_max_seconds=0.005,
    )
    chaos = Chaos(plan, seed=seed)
    async with connected(counting, chaos, "modern") as client:
        await client.call_tool("other", {})  # warm-up, not numbered: first calls are slow
        for _ in range(CALLS):
            try:
                await client.call_tool("hit", {}, read_timeout_seconds=EXPECTED_TIMEOUT)
            except MCPError as exc:
                assert exc.code == REQUEST_TIMEOUT
        with anyio.fail_after(WAIT):
            await chaos.settled()
    return chaos.faults, counting.executions


async def test_same_seed_and_plan_give_the_same_fault_log() -> None:
    first, executions_first = await run_probabilistic(seed=1234)
    second, executions_second = await run_probabilistic(seed=1234)
    other, _ = await run_probabilistic(seed=4321)
    assert first == second
    assert [record.to_dict() | {"time": 0} for record in first] == [
        record.to_dict() | {"time": 0} for record in second
    ]
    assert other != first
    assert len({record.kind for record in first}) >= 3  # the plan really mixed faults
    # Effects follow from the log: drops never run, duplicates run twice.
    counts = {kind: sum(record.kind is kind for record in first) for kind in Fault}
    assert (
        executions_first
        == executions_second
        == CALLS - counts[Fault.DROP_REQUEST] + counts[Fault.DUPLICATE]
    )


async def test_one_chaos_spans_reconnections() -> None:
    counting = CountingServer()
    plan = FaultPlan(schedule={2: Fault.CLOSE_AFTER_WRITE, 4: Fault.LOST_ACK})
    chaos = Chaos(plan, seed=5)
    async with connected(counting, chaos, "modern") as client:
        assert text(await client.call_tool("hit", {})) == "1"
        with pytest.raises(MCPError) as caught:
            await client.call_tool("hit", {})
        assert caught.value.code == CONNECTION_CLOSED
    executed_before = counting.executions
    # The user reconnects: a new inner transport, the same Chaos (ordinals, RNG, log go on).
    second = chaos.wrap(counting.server)
    async with Client(second) as client:
        await client.list_tools()
        assert text(await client.call_tool("hit", {})) == str(executed_before + 1)
        with pytest.raises(MCPError) as lost:
            await client.call_tool("hit", {}, read_timeout_seconds=EXPECTED_TIMEOUT)
        assert lost.value.code == REQUEST_TIMEOUT
    assert [(record.index, record.kind, record.connection) for record in chaos.faults] == [
        (2, Fault.CLOSE_AFTER_WRITE, 1),
        (4, Fault.LOST_ACK, 2),
    ]
    assert kinds(second.faults) == [Fault.LOST_ACK]
    assert chaos.connections == 2 and chaos.requests_seen == 4
    assert chaos.fault_counts()[Fault.LOST_ACK] == 1
    with pytest.raises(RuntimeError, match="single-use"):
        async with second:
            pass


async def test_only_the_configured_methods_and_tools_are_faulted() -> None:
    counting = CountingServer()
    plan = FaultPlan(
        methods={"tools/call", "tools/list"}, tools={"hit"}, schedule={1: Fault.DROP_REQUEST}
    )
    chaos = Chaos(plan, seed=1)
    async with Client(chaos.wrap(counting.server)) as client:
        # Request #1 is this tools/list, dropped: methods are configurable.
        with anyio.move_on_after(EXPECTED_TIMEOUT) as gave_up:
            await client.session.list_tools()
        assert gave_up.cancelled_caught
        await client.list_tools()
        await client.call_tool("other", {})
        await client.call_tool("hit", {})
    assert kinds(chaos.faults) == [Fault.DROP_REQUEST]
    assert chaos.faults[0].method == "tools/list" and chaos.faults[0].tool is None
    # tools/list twice and hit once matched; the call to `other` was not even numbered.
    assert chaos.requests_seen == 3
    assert counting.others == 1 and counting.executions == 1


@pytest.mark.parametrize("era", ERAS)
async def test_works_under_a_bare_client_session(era: str) -> None:
    counting = CountingServer()
    chaos = Chaos(FaultPlan(schedule={1: Fault.LOST_ACK}), seed=1)
    async with (
        chaos.wrap(in_memory_transport(counting.server)) as (read, write),
        ClientSession(read, write) as session,
    ):
        if era == "legacy":
            await session.initialize()
        else:
            await session.discover()
        await session.list_tools()
        with pytest.raises(MCPError) as caught:
            await session.call_tool("hit", {}, read_timeout_seconds=EXPECTED_TIMEOUT)
        assert caught.value.code == REQUEST_TIMEOUT
        await counting.executed(1)
        assert text(await session.call_tool("hit", {})) == "2"
    assert kinds(chaos.faults) == [Fault.LOST_ACK]


async def test_arguments_and_results_are_never_recorded(caplog: pytest.LogCaptureFixture) -> None:
    counting = CountingServer()
    chaos = Chaos(FaultPlan(duplicate=1.0), seed=1)
    with caplog.at_level(logging.DEBUG, logger="orchestrator.chaos"):
        async with connected(counting, chaos, "modern") as client:
            await client.call_tool("hit", {"note": "card-4242-secret"})
            with anyio.fail_after(WAIT):
                await chaos.settled()
    report = json.dumps(chaos.report())
    assert "card-4242-secret" not in report
    assert "card-4242-secret" not in caplog.text
    assert "duplicate" in caplog.text and "hit" in caplog.text
    assert json.loads(report)["counts"]["duplicate"] == 1
    assert FaultPlan.from_dict(json.loads(report)["plan"]) == chaos.plan


async def test_the_callers_context_travels_through_the_link() -> None:
    """The SDK runs a request in its sender's context (its timeout clock lives there)."""
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")
    counting = CountingServer()

    @counting.server.tool()
    async def read_marker() -> str:
        return marker.get()

    async with Client(Chaos().wrap(counting.server)) as client:
        marker.set("from the caller")
        assert text(await client.call_tool("read_marker", {})) == "from the caller"


@asynccontextmanager
async def fake_inner(
    read: ReadStream[SessionMessage | Exception], write: WriteStream[SessionMessage]
) -> AsyncIterator[TransportStreams]:
    """An inner transport whose far end the test plays by hand."""
    yield read, write


async def test_an_inner_transport_that_dies_closes_the_link() -> None:
    """No fault: the inner link ends (a server crash). The client sees CONNECTION_CLOSED."""
    to_client_send, to_client_receive = anyio.create_memory_object_stream[
        SessionMessage | Exception
    ](1)
    to_server_send, to_server_receive = anyio.create_memory_object_stream[SessionMessage](1)
    chaos = Chaos(seed=1)
    transport = chaos.wrap(fake_inner(to_client_receive, to_server_send))

    async def server_dies_after_first_request() -> None:
        await to_server_receive.receive()
        to_client_send.close()

    async with transport as (read, write), ClientSession(read, write) as session:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server_dies_after_first_request)
            with pytest.raises(MCPError) as caught:
                await session.initialize()
        assert caught.value.code == CONNECTION_CLOSED
        assert transport.closed
    assert chaos.faults == ()


class ExplodingRead:
    """A read stream that fails with a non-stream error once lit: a bug below the relay."""

    def __init__(self) -> None:
        self.fuse = anyio.Event()

    async def receive(self) -> SessionMessage | Exception:
        await self.fuse.wait()
        raise RuntimeError("inner transport bug")

    async def aclose(self) -> None:
        pass

    def __aiter__(self) -> ExplodingRead:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        return await self.receive()

    async def __aenter__(self) -> ExplodingRead:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        pass


async def test_a_relay_failure_closes_the_link_without_leaking(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing a pump raises may cancel or escape into the user's `async with` body."""
    exploding = ExplodingRead()
    to_server_send, to_server_receive = anyio.create_memory_object_stream[SessionMessage](1)
    transport = Chaos(seed=1).wrap(fake_inner(exploding, to_server_send))

    async def fail_once_the_request_is_out() -> None:
        await to_server_receive.receive()
        exploding.fuse.set()

    with caplog.at_level(logging.ERROR, logger="orchestrator.chaos"):
        async with transport as (read, write), ClientSession(read, write) as session:
            async with anyio.create_task_group() as tg:
                tg.start_soon(fail_once_the_request_is_out)
                with pytest.raises(MCPError) as caught:
                    await session.initialize()
            assert caught.value.code == CONNECTION_CLOSED
            await anyio.lowlevel.checkpoint()  # the body is still running: it was not cancelled
            survived = True
    assert survived and transport.closed
    assert "relay failed" in caplog.text


@pytest.mark.parametrize("era", ERAS)
async def test_exit_does_not_wait_out_an_injected_delay(era: str) -> None:
    counting = CountingServer()
    plan = FaultPlan(schedule={1: Fault.DELAY_REQUEST}, delay_min_seconds=60, delay_max_seconds=60)
    chaos = Chaos(plan, seed=1)
    with anyio.fail_after(WAIT):
        async with connected(counting, chaos, era) as client:
            with anyio.move_on_after(EXPECTED_TIMEOUT) as gave_up:
                await client.call_tool("hit", {})
            assert gave_up.cancelled_caught  # the caller gave up; its cancel queues behind
    assert counting.executions == 0  # the request was still held when the link went away


async def test_settled_returns_at_once_when_nothing_is_pending() -> None:
    with anyio.fail_after(1):
        await Chaos().settled()
