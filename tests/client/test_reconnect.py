"""Dead sessions: replaced through `connect`, once for all callers; never-sent vs maybe-executed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import cast

import anyio
import pytest
from _faults import Faults, faulty_transport
from _servers import Recorder, make_server
from mcp import Client

from orchestrator import NotExecuted, OutcomeUnknown, RetryingSession, RetryPolicy
from orchestrator._catalog import watch_list_changed
from orchestrator._reconnect import transport_closed

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])]


class Connector:
    """A connect factory that counts its calls."""

    def __init__(self, recorder: Recorder, faults: Faults, mode: str = "legacy") -> None:
        self.server = make_server(recorder)
        self.faults = faults
        self.mode = mode
        self.calls = 0

    def __call__(self) -> AbstractAsyncContextManager[Client]:
        self.calls += 1
        return Client(faulty_transport(self.server, self.faults), mode=self.mode)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_concurrent_callers_share_one_reconnection(mode: str) -> None:
    callers = 5
    recorder = Recorder(barrier_size=callers)
    faults = Faults(plan={"barrier": ["kill"] * callers})
    connect = Connector(recorder, faults, mode)
    results: list[str] = []
    async with RetryingSession(connect=connect) as rs:

        async def call() -> None:
            result, report = await rs.call_tool_with_report("barrier")
            assert [a.failure for a in report.attempts] == ["maybe_executed", None]
            results.append(result.content[0].text)  # type: ignore[union-attr]

        async with anyio.create_task_group() as tg:
            for _ in range(callers):
                tg.start_soon(call)
        # One connect for the first session (shared by all five), one after the link died.
        assert connect.calls == 2 and rs.connects == 2 and faults.kills == 1
    assert results == ["barrier:2"] * callers
    assert sorted(recorder.attempts("barrier")) == [1] * callers + [2] * callers
    keys = recorder.keys("barrier")
    assert len(set(keys)) == callers  # one key per logical call, each sent twice
    assert all(keys.count(key) == 2 for key in keys)


async def test_without_connect_a_dead_session_ends_the_call() -> None:
    recorder, faults = Recorder(), Faults(plan={"idem": ["kill"]})
    server = make_server(recorder)
    async with Client(faulty_transport(server, faults), mode="legacy") as client:
        rs = RetryingSession(client)
        with pytest.raises(OutcomeUnknown) as lost:
            await rs.call_tool("idem", {"x": 1})
        assert lost.value.reason == "no_connect" and lost.value.attempts == 1
        assert transport_closed(client)
        # The session is known dead before the next call: nothing is sent, and it says so.
        with pytest.raises(NotExecuted) as refused:
            await rs.call_tool("plain", {"x": 2})
    assert refused.value.reason == "no_connect"
    assert refused.value.report is not None
    assert refused.value.report.attempts[0].failure == "never_sent"
    assert recorder.counts() == {"idem": 1}
    assert len(faults.requests) == 1


async def test_failing_connect_is_never_sent_and_bounded() -> None:
    calls = 0

    @asynccontextmanager
    async def refused() -> AsyncIterator[Client]:
        nonlocal calls
        calls += 1
        raise ConnectionRefusedError("nobody listens")
        yield cast(Client, None)  # pragma: no cover

    async with RetryingSession(connect=refused, policy=RetryPolicy(max_attempts=4)) as rs:
        with pytest.raises(NotExecuted) as caught:
            await rs.call_tool("plain", {"x": 1})
    err = caught.value
    assert err.reason == "attempts" and err.attempts == 4 and calls == 4
    assert err.report is not None
    assert {a.failure for a in err.report.attempts} == {"never_sent"}
    assert isinstance(err.last_error.__cause__, ConnectionRefusedError)  # type: ignore[union-attr]


async def test_connect_that_hangs_is_cut_by_connect_timeout() -> None:
    @asynccontextmanager
    async def hangs() -> AsyncIterator[Client]:
        await anyio.sleep_forever()
        yield cast(Client, None)  # pragma: no cover

    policy = RetryPolicy(max_attempts=2, connect_timeout=0.05)
    async with RetryingSession(connect=hangs, policy=policy) as rs:
        with pytest.raises(NotExecuted) as caught:
            await rs.call_tool("plain", {"x": 1})
    assert isinstance(caught.value.last_error.__cause__, TimeoutError)  # type: ignore[union-attr]


async def test_exit_closes_the_sessions_it_opened() -> None:
    connect = Connector(Recorder(), Faults())
    async with RetryingSession(connect=connect) as rs:
        await rs.call_tool("idem", {"x": 1})
        session = rs.session
        assert session is not None and not transport_closed(session)
    assert transport_closed(session)


async def test_list_changed_refreshes_the_catalog() -> None:
    connect = Connector(Recorder(), Faults(plan={"idem": [None, "drop"]}))
    async with RetryingSession(connect=connect, policy=RetryPolicy(attempt_timeout=0.2)) as rs:
        await rs.call_tool("idem", {"x": 0})
        assert rs.session is not None
        changed = anyio.Event()
        # Chained after the wrapper's own hook, so it runs just before it, on the same turn.
        watch_list_changed(rs.session, changed.set)
        refreshes = rs._catalog.refreshes
        await rs.call_tool("mutate")
        with anyio.fail_after(5):
            await changed.wait()  # the notification is handled on a task of its own
        assert rs._catalog.fresh("idem") is None  # known stale
        await rs.call_tool("idem", {"x": 1})  # the gate lists again before deciding
        assert rs._catalog.refreshes == refreshes + 1


async def test_misuse_is_refused_clearly() -> None:
    connect = Connector(Recorder(), Faults())
    with pytest.raises(ValueError):
        RetryingSession()
    with pytest.raises(TypeError):
        RetryingSession("http://localhost/mcp")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        RetryingSession(connect=connect, policy={"max_attempts": 3})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        RetryingSession(connect="not callable")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RetryingSession(connect=connect, overrides={"x": "maybe"})  # type: ignore[dict-item]
    with pytest.raises(RuntimeError, match="async with"):
        await RetryingSession(connect=connect).call_tool("idem", {"x": 1})
    async with RetryingSession(connect=lambda: "nope") as rs:  # type: ignore[arg-type, return-value]
        with pytest.raises(TypeError, match="async context manager"):
            await rs.call_tool("idem", {"x": 1})
    assert connect.calls == 0
