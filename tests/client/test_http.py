"""Streamable HTTP: statuses and Retry-After captured, transport errors kept inside the call,
a restarted server survived, and the budget measured against a server that answers 503."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Iterator

import anyio
import pytest
from _http_server import HttpFaults, HttpServer
from _servers import Recorder, make_server
from mcp import Client

from orchestrator import (
    NotExecuted,
    OutcomeUnknown,
    RetryingSession,
    RetryPolicy,
    ToolCallError,
    streamable_http_transport,
)

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def http(recorder: Recorder) -> Iterator[HttpServer]:
    server = HttpServer(make_server(recorder))
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_503_retry_after_is_captured_and_honoured(
    http: HttpServer, recorder: Recorder, mode: str
) -> None:
    http.faults.plan = [(503, {"retry-after": "2"})]
    async with Client(streamable_http_transport(http.url), mode=mode) as client:
        rs = RetryingSession(client)
        result, report = await rs.call_tool_with_report("idem", {"x": 1})
    assert result.content[0].text == "idem:1"  # type: ignore[union-attr]
    first, second = report.attempts
    assert (first.failure, first.code, first.http_status, first.retry_after) == (
        "maybe_executed",
        -32603,
        503,
        2.0,
    )
    assert second.wait_before == 2.0 and report.total_wait == 2.0
    assert recorder.executions("idem") == 1  # the 503 came from the proxy layer
    assert http.faults.tool_posts == 2


async def test_429_with_http_date_and_the_gate(http: HttpServer, recorder: Recorder) -> None:
    later = email.utils.formatdate(time.time() + 3, usegmt=True)
    http.faults.plan = [(429, {"retry-after": later}), None, (503, {})]
    async with Client(streamable_http_transport(http.url)) as client:
        rs = RetryingSession(client)
        _, report = await rs.call_tool_with_report("reader", {"x": 1})
        with pytest.raises(OutcomeUnknown) as caught:
            await rs.call_tool("plain", {"x": 1})  # a bare 503 may hide an execution
    hint = report.attempts[0].retry_after
    assert report.attempts[0].http_status == 429 and hint is not None and 1 <= hint <= 3
    assert report.attempts[1].wait_before == hint
    assert caught.value.reason == "not_idempotent"
    assert caught.value.report is not None
    assert caught.value.report.attempts[0].http_status == 503
    assert recorder.counts() == {"reader": 1}


async def test_other_4xx_is_permanent(http: HttpServer, recorder: Recorder) -> None:
    http.faults.plan = [(401, {})]
    async with Client(streamable_http_transport(http.url)) as client:
        with pytest.raises(ToolCallError) as caught:
            await RetryingSession(client).call_tool("idem", {"x": 1})
    assert caught.value.http_status == 401 and caught.value.code == -32603
    assert http.faults.tool_posts == 1 and recorder.executions() == 0


async def test_without_the_transport_a_bare_status_is_maybe_executed(
    http: HttpServer, recorder: Recorder
) -> None:
    http.faults.plan = [(503, {"retry-after": "1"})]
    async with Client(http.url) as client:
        _, report = await RetryingSession(client).call_tool_with_report("idem", {"x": 1})
    first = report.attempts[0]
    assert (first.failure, first.http_status, first.retry_after) == ("maybe_executed", None, None)
    assert recorder.executions("idem") == 1 and len(report.attempts) == 2


async def test_connection_refused_is_never_sent_and_stays_inside_the_call(
    http: HttpServer, recorder: Recorder
) -> None:
    async with Client(streamable_http_transport(http.url)) as client:
        rs = RetryingSession(client, policy=RetryPolicy(max_attempts=3))
        await rs.call_tool("idem", {"x": 0})
        await anyio.to_thread.run_sync(http.stop)
        # Not idempotent, yet retried: nothing reached a server, nothing can be duplicated.
        with pytest.raises(NotExecuted) as caught:
            await rs.call_tool("plain", {"x": 1})
    err = caught.value
    assert err.reason == "attempts" and err.attempts == 3
    assert err.report is not None
    assert {a.failure for a in err.report.attempts} == {"never_sent"}
    assert recorder.counts() == {"idem": 1}


async def test_modern_server_restarted_mid_call(
    http: HttpServer, recorder: Recorder, real_waits: None
) -> None:
    policy = RetryPolicy(max_attempts=10, wait_initial=0.05, wait_max=0.5, budget=None)
    async with RetryingSession(
        connect=lambda: Client(streamable_http_transport(http.url)), policy=policy
    ) as rs:

        async def restart_when_running() -> None:
            await anyio.to_thread.run_sync(recorder.started.wait)
            await anyio.to_thread.run_sync(http.restart)

        async with anyio.create_task_group() as tg:
            tg.start_soon(restart_when_running)
            result, report = await rs.call_tool_with_report("slow_first")
        assert rs.connects == 1  # stateless HTTP: the same session carried on
    assert result.content[0].text.startswith("slow_first:")  # type: ignore[union-attr]
    assert report.attempts[0].failure == "maybe_executed"
    assert len(set(recorder.keys("slow_first"))) == 1


async def test_legacy_server_restarted_mid_call_reconnects(
    http: HttpServer, recorder: Recorder, real_waits: None
) -> None:
    # A plain SDK client, no retry-aware transport: its crashes end the host task, not the call.
    policy = RetryPolicy(max_attempts=10, wait_initial=0.05, wait_max=0.5, budget=None)
    connects = 0

    def connect() -> Client:
        nonlocal connects
        connects += 1
        return Client(http.url, mode="legacy")

    async with RetryingSession(connect=connect, policy=policy) as rs:

        async def restart_when_running() -> None:
            await anyio.to_thread.run_sync(recorder.started.wait)
            await anyio.to_thread.run_sync(http.restart)

        async with anyio.create_task_group() as tg:
            tg.start_soon(restart_when_running)
            result, report = await rs.call_tool_with_report("slow_first")
        assert rs.connects >= 2  # the old session died with the server
    assert result.content[0].text.startswith("slow_first:")  # type: ignore[union-attr]
    assert report.attempts[0].failure == "maybe_executed"
    assert len(set(recorder.keys("slow_first"))) == 1
    assert report.connects == rs.connects and connects >= rs.connects


async def test_budget_against_a_server_answering_503(http: HttpServer, recorder: Recorder) -> None:
    calls = 200
    http.faults.always = (503, {})

    async def cost(policy: RetryPolicy) -> int:
        before = http.faults.tool_posts
        async with Client(streamable_http_transport(http.url)) as client:
            rs = RetryingSession(client, policy=policy)
            for i in range(calls):
                with pytest.raises(OutcomeUnknown):
                    await rs.call_tool("idem", {"x": i})
        return http.faults.tool_posts - before

    with_budget = await cost(RetryPolicy())
    without_budget = await cost(RetryPolicy(budget=None))
    assert with_budget <= 1.2 * calls and with_budget == calls + 3
    assert without_budget == 3 * calls
    assert recorder.executions() == 0
