"""Streamable HTTP: statuses and Retry-After captured, transport errors kept inside the call,
a restarted server survived, and the budget measured against a server that answers 503."""

from __future__ import annotations

import email.utils
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import pytest
from _http_server import HoldWhileDown, HttpServer
from _servers import Recorder
from mcp import Client

from orchestrator import (
    NotExecuted,
    OutcomeUnknown,
    RetryingSession,
    RetryPolicy,
    ToolCallError,
    TransportFailed,
    streamable_http_transport,
)

pytestmark = pytest.mark.anyio
both_backends = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])


@both_backends
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


@both_backends
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


@both_backends
async def test_other_4xx_is_permanent(http: HttpServer, recorder: Recorder) -> None:
    http.faults.plan = [(401, {})]
    async with Client(streamable_http_transport(http.url)) as client:
        with pytest.raises(ToolCallError) as caught:
            await RetryingSession(client).call_tool("idem", {"x": 1})
    assert caught.value.http_status == 401 and caught.value.code == -32603
    assert http.faults.tool_posts == 1 and recorder.executions() == 0


@both_backends
async def test_without_the_transport_a_bare_status_is_maybe_executed(
    http: HttpServer, recorder: Recorder
) -> None:
    http.faults.plan = [(503, {"retry-after": "1"})]
    async with Client(http.url) as client:
        _, report = await RetryingSession(client).call_tool_with_report("idem", {"x": 1})
    first = report.attempts[0]
    assert (first.failure, first.http_status, first.retry_after) == ("maybe_executed", None, None)
    assert recorder.executions("idem") == 1 and len(report.attempts) == 2


@both_backends
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
    # The failure as it is, naming the URL: no stand-in -32603 or 503 (issue 38).
    assert isinstance(err.last_error, TransportFailed) and err.last_error.url == http.url
    assert f"connection refused: {http.url}" in str(err)
    assert {(a.code, a.http_status) for a in err.report.attempts} == {(None, None)}


@both_backends
async def test_a_crashing_plain_transport_cancels_and_is_not_swallowed(
    http: HttpServer, recorder: Recorder
) -> None:
    # Without the retry-aware transport, a refused connection crashes the SDK's transport task
    # group, which cancels the code inside `async with Client`. That cancellation must win: no
    # retry, no result, the crash surfaces from `async with`.
    rs: RetryingSession | None = None
    with pytest.raises(BaseExceptionGroup) as caught:
        async with Client(http.url) as client:
            rs = RetryingSession(client)
            await rs.call_tool("idem", {"x": 0})
            await anyio.to_thread.run_sync(http.stop)
            await rs.call_tool("plain", {"x": 1})
    assert caught.value.subgroup(httpx2.ConnectError) is not None
    assert rs is not None and rs.last_report is not None
    assert rs.last_report.outcome == "cancelled" and rs.last_report.attempts == ()
    assert recorder.counts() == {"idem": 1}


def restart_when_running(
    http: HttpServer, recorder: Recorder
) -> Callable[[], Coroutine[Any, Any, None]]:
    async def restart() -> None:
        await anyio.to_thread.run_sync(recorder.started.wait)
        await anyio.to_thread.run_sync(http.restart)

    return restart


@both_backends
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_server_restarted_mid_call(http: HttpServer, recorder: Recorder, mode: str) -> None:
    # Requests made while the server is down wait for it (HoldWhileDown): what is tested here is
    # the state after the restart, not how long one takes.
    def connect() -> Client:
        return Client(streamable_http_transport(http.url, inner=HoldWhileDown(http)), mode=mode)

    async with RetryingSession(connect=connect) as rs, anyio.create_task_group() as tg:
        tg.start_soon(restart_when_running(http, recorder))
        result, report = await rs.call_tool_with_report("slow_first")
    assert result.content[0].text == f"slow_first:{len(report.attempts)}"  # type: ignore[union-attr]
    assert len(set(recorder.keys("slow_first"))) == 1
    first, *_, last = report.attempts
    assert first.failure == "maybe_executed"  # the server went down while the tool ran
    if mode == "auto":
        # Stateless HTTP: the same session simply carries on.
        assert report.connects == 1 and len(report.attempts) == 2
    else:
        # The restarted server does not know the session: 404, never executed; reconnect.
        assert report.connects == 2 and len(report.attempts) == 3
        assert (report.attempts[1].failure, report.attempts[1].http_status) == ("never_sent", 404)
        assert last.generation == 2


@both_backends
async def test_legacy_restart_with_a_plain_client_reconnects(
    http: HttpServer, recorder: Recorder
) -> None:
    # A plain SDK client (no retry-aware transport): when its transport crashes, the crash ends
    # the session's host task, and the call sees an ordinary "Connection closed".
    @asynccontextmanager
    async def connect() -> AsyncIterator[Client]:
        await http.wait_up()
        async with Client(http.url, mode="legacy") as client:
            yield client

    policy = RetryPolicy(max_attempts=5)
    async with (
        RetryingSession(connect=connect, policy=policy) as rs,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(restart_when_running(http, recorder))
        result, report = await rs.call_tool_with_report("slow_first")
    assert result.content[0].text.startswith("slow_first:")  # type: ignore[union-attr]
    assert report.attempts[0].failure == "maybe_executed"
    assert report.connects == 2 and report.attempts[-1].generation == 2
    assert len(set(recorder.keys("slow_first"))) == 1


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
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
