"""`attempt_once`: one keyed `tools/call` sent raw on a session of the caller's own, its failure
judged as `RetryingSession` judges an attempt's, against a real streamable HTTP server whose
tools count their executions: answered; refused before it left (`NotExecuted`, the transport
failure as the last error, nothing ran); a server that forgot the session (its 404 after a
restart: `NotExecuted`); a bare 503 that may hide an execution (`OutcomeUnknown`); a 401
(`ToolCallError` with the status). No retry in any case: one POST."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

import anyio
import pytest
from _http_server import HttpServer
from _servers import Recorder
from mcp import Client, MCPError
from mcp_types import CallToolRequest, CallToolRequestParams, CallToolResult

from idempotency import wire
from orchestrator import (
    NotExecuted,
    OutcomeUnknown,
    ToolCallError,
    TransportFailed,
    attempt_once,
    streamable_http_transport,
)

pytestmark = pytest.mark.anyio
both_backends = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])

KEY = "attempt-once-1"


def _raw(client: Client, tool: str) -> Callable[[], Awaitable[CallToolResult]]:
    """`tool`'s call under `KEY` (attempt 1), sent raw on `client`'s session."""
    meta = {wire.KEY_META: KEY, wire.ATTEMPT_META: 1}
    params = CallToolRequestParams(name=tool, arguments={"x": 1}, _meta=cast(Any, meta))
    request = CallToolRequest(params=params)
    return lambda: client.session.send_request(request, CallToolResult)


@both_backends
async def test_an_answered_attempt_is_its_result(http: HttpServer, recorder: Recorder) -> None:
    async with Client(streamable_http_transport(http.url)) as client:
        result = await attempt_once(_raw(client, "plain"), tool="plain", key=KEY)
    assert result.content[0].text == "plain:1"  # type: ignore[union-attr]
    assert recorder.executions("plain") == 1 and http.faults.tool_posts == 1


@both_backends
async def test_a_refused_attempt_is_not_executed(http: HttpServer, recorder: Recorder) -> None:
    async with Client(streamable_http_transport(http.url)) as client:
        await client.list_tools()
        await anyio.to_thread.run_sync(http.stop)
        with pytest.raises(NotExecuted) as caught:
            await attempt_once(_raw(client, "plain"), tool="plain", key=KEY)
    error = caught.value
    assert (error.tool, error.key, error.attempts) == ("plain", KEY, 1)
    assert isinstance(error.last_error, TransportFailed) and error.last_error.sent is False
    assert f"connection refused: {http.url}" in str(error)
    assert recorder.executions() == 0


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_session_the_server_forgot_is_not_executed(
    http: HttpServer, recorder: Recorder
) -> None:
    async with Client(streamable_http_transport(http.url), mode="legacy") as client:
        await client.list_tools()
        await anyio.to_thread.run_sync(http.restart)
        with pytest.raises(NotExecuted) as caught:
            await attempt_once(_raw(client, "plain"), tool="plain", key=KEY)
    last = caught.value.last_error
    assert isinstance(last, MCPError) and last.message == "Session not found", repr(last)
    assert recorder.executions() == 0


@both_backends
@pytest.mark.parametrize(
    ("status", "raised"),
    [(503, OutcomeUnknown), (401, ToolCallError)],
    ids=["bare-503-may-hide-an-execution", "401-is-permanent"],
)
async def test_an_http_status_without_a_body(
    http: HttpServer, recorder: Recorder, status: int, raised: type[Exception]
) -> None:
    http.faults.plan = [(status, {})]
    async with Client(streamable_http_transport(http.url)) as client:
        with pytest.raises(raised) as caught:
            await attempt_once(_raw(client, "plain"), tool="plain", key=KEY)
    error = caught.value
    if isinstance(error, OutcomeUnknown):
        assert error.reason == "attempts" and error.attempts == 1
    else:
        assert isinstance(error, ToolCallError) and error.http_status == status
    assert http.faults.tool_posts == 1 and recorder.executions() == 0  # one POST: no retry
