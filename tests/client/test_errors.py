"""Server answers: permanent errors, isError results, retry hints, replays (in-process)."""

from __future__ import annotations

import pytest
from _servers import Recorder, make_server
from mcp import Client, MCPError

from idempotency import wire
from orchestrator import (
    InvalidParams,
    KeyReused,
    NotExecuted,
    OutcomeUnknown,
    RetryingSession,
    RetryPolicy,
    ServerOutcomeUnknown,
    ToolCallError,
)

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"]),
    pytest.mark.parametrize("mode", ["auto", "legacy"]),
]


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (wire.KEY_REUSED, KeyReused),
        (wire.INVALID_PARAMS, InvalidParams),
        (wire.CORRUPT_RECORD, ToolCallError),
        (-32099, ToolCallError),
        (-32603, ToolCallError),
    ],
)
async def test_permanent_errors_are_not_retried_and_keep_code_and_data(
    mode: str, code: int, cls: type[ToolCallError]
) -> None:
    recorder = Recorder()
    data = {"key": "k-1", "detail": 7}
    recorder.script["idem"] = [MCPError(code, "refused", data)]
    async with Client(make_server(recorder), mode=mode) as client:
        rs = RetryingSession(client)
        with pytest.raises(cls) as caught:
            await rs.call_tool("idem", {"x": 1}, idempotency_key="k-1")
    err = caught.value
    assert type(err) is cls and isinstance(err, MCPError)
    assert (err.code, err.message, err.data) == (code, "refused", data)
    assert (err.tool, err.key, err.attempts) == ("idem", "k-1", 1)
    assert recorder.executions("idem") == 1
    assert err.report is not None and err.report.outcome == "error"
    assert rs.last_report is err.report


async def test_server_outcome_unknown_is_never_retried(mode: str) -> None:
    recorder = Recorder()
    recorder.script["idem"] = [MCPError(wire.OUTCOME_UNKNOWN, "lease expired", {"key": "k"})]
    async with Client(make_server(recorder), mode=mode) as client:
        with pytest.raises(ServerOutcomeUnknown) as caught:
            await RetryingSession(client).call_tool("idem", {"x": 1})
    err = caught.value
    assert isinstance(err, OutcomeUnknown) and err.reason == "server"
    assert (err.code, err.data) == (wire.OUTCOME_UNKNOWN, {"key": "k"})
    assert recorder.executions("idem") == 1


async def test_is_error_result_is_returned_not_retried(mode: str) -> None:
    recorder = Recorder()
    recorder.script["idem"] = ["is_error"]
    async with Client(make_server(recorder), mode=mode) as client:
        rs = RetryingSession(client)
        result, report = await rs.call_tool_with_report("idem", {"x": 1})
    assert result.is_error is True
    assert report.outcome == "is_error" and len(report.attempts) == 1
    assert recorder.executions("idem") == 1


async def test_in_progress_honours_retry_hint(mode: str) -> None:
    recorder = Recorder()
    busy = MCPError(wire.IN_PROGRESS, "busy", {"key": "k", "retryAfterMs": 250})
    recorder.script["idem"] = [busy, busy]
    async with Client(make_server(recorder), mode=mode) as client:
        rs = RetryingSession(client, policy=RetryPolicy(max_attempts=3))
        result, report = await rs.call_tool_with_report("idem", {"x": 5})
    assert result.content[0].text == "idem:5"  # type: ignore[union-attr]
    assert [a.failure for a in report.attempts] == ["in_progress", "in_progress", None]
    assert [a.wait_before for a in report.attempts] == [0.0, 0.25, 0.25]
    assert report.attempts[0].retry_after == 0.25 and report.total_wait == 0.5
    assert recorder.attempts("idem") == [1, 2, 3] and len(set(recorder.keys("idem"))) == 1


async def test_retry_hint_is_clamped_and_must_fit_the_deadline(mode: str) -> None:
    recorder = Recorder()
    slow = MCPError(wire.IN_PROGRESS, "busy", {"retryAfterMs": 60_000})
    recorder.script["idem"] = [slow]
    async with Client(make_server(recorder), mode=mode) as client:
        clamped = RetryingSession(client, policy=RetryPolicy(max_retry_after=0.5))
        _, report = await clamped.call_tool_with_report("idem", {"x": 1})
        assert [a.wait_before for a in report.attempts] == [0.0, 0.5]

        recorder.script["idem"] = [slow]
        short = RetryingSession(client, policy=RetryPolicy(max_retry_after=30, deadline=5))
        with pytest.raises(OutcomeUnknown) as caught:
            await short.call_tool("idem", {"x": 1})
    # The 30 s the server asks for cannot fit in 5 s: stop now instead of waiting for nothing.
    assert caught.value.reason == "deadline" and caught.value.attempts == 1
    assert caught.value.report is not None and caught.value.report.elapsed < 5
    assert recorder.executions("idem") == 3


async def test_store_unavailable_is_retried_then_not_executed(mode: str) -> None:
    recorder = Recorder()
    down = MCPError(wire.STORE_UNAVAILABLE, "store down", {"key": "k"})
    recorder.script["idem"] = [down]
    recorder.always["reader"] = down
    async with Client(make_server(recorder), mode=mode) as client:
        rs = RetryingSession(client, policy=RetryPolicy(max_attempts=4))
        result = await rs.call_tool("idem", {"x": 2})
        assert result.content[0].text == "idem:2"  # type: ignore[union-attr]
        with pytest.raises(NotExecuted) as caught:
            await rs.call_tool("reader", {"x": 1})
    # Every attempt was refused before running: the tool provably did not run.
    assert caught.value.reason == "attempts" and caught.value.attempts == 4
    assert recorder.counts() == {"idem": 2, "reader": 4}


async def test_store_unavailable_goes_through_the_gate(mode: str) -> None:
    recorder = Recorder()
    recorder.script["plain"] = [MCPError(wire.STORE_UNAVAILABLE, "store down")]
    async with Client(make_server(recorder), mode=mode) as client:
        with pytest.raises(NotExecuted) as caught:
            await RetryingSession(client).call_tool("plain", {"x": 1})
    assert caught.value.reason == "not_idempotent" and recorder.executions("plain") == 1


async def test_replay_marker_is_reported(mode: str) -> None:
    recorder = Recorder()
    async with Client(make_server(recorder), mode=mode) as client:
        rs = RetryingSession(client)
        _, replay = await rs.call_tool_with_report("replayed")
        _, fresh = await rs.call_tool_with_report("idem", {"x": 1})
    assert replay.replayed is True and fresh.replayed is False


async def test_bad_inputs_fail_before_anything_is_sent(mode: str) -> None:
    recorder = Recorder()
    async with Client(make_server(recorder), mode=mode) as client:
        rs = RetryingSession(client)
        bad_calls = [
            {"idempotency_key": ""},
            {"idempotency_key": "x" * 256},
            {"idempotency_key": "tab\there"},
            {"idempotency_key": 42},
            {"meta": {wire.KEY_META: "é"}},
            {"meta": {wire.KEY_META: "a"}, "idempotency_key": "b"},
            {"meta": {wire.ATTEMPT_META: 3}},
        ]
        for kwargs in bad_calls:
            with pytest.raises(ValueError):
                await rs.call_tool("idem", {"x": 1}, **kwargs)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await rs.call_tool("", {})
        with pytest.raises(ValueError):
            await rs.call_tool("idem", {"x": 1}, read_timeout_seconds=0)
        with pytest.raises(TypeError):
            await rs.call_tool("idem", [1])  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await rs.call_tool("idem", {"x": 1}, meta=["k"])  # type: ignore[arg-type]
    assert recorder.executions() == 0
