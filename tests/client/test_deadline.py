"""One deadline over the whole call, cancellable waits, and a caller's cancellation is final.

These tests sleep for real (fixture `real_waits`): what they check is time and cancellation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import pytest
from _servers import Recorder, make_server
from mcp import Client, MCPError

from idempotency import wire
from orchestrator import OutcomeUnknown, RetryingSession, RetryPolicy

# Generous for a loaded 2-core machine, still far below one backoff or attempt.
TICK = 0.25

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"]),
    pytest.mark.usefixtures("real_waits"),
]


@contextmanager
def on_retry(callback: object) -> Iterator[list[logging.LogRecord]]:
    """Call `callback(record)` when the loop announces a retry (just before its wait)."""
    records: list[logging.LogRecord] = []

    class Hook(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if hasattr(record, "mcp_once_wait"):
                records.append(record)
                callback(record)  # type: ignore[operator]

    logger = logging.getLogger("orchestrator")
    hook, level = Hook(logging.DEBUG), logger.level
    logger.addHandler(hook)
    logger.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        logger.removeHandler(hook)
        logger.setLevel(level)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_deadline_cuts_a_hanging_attempt(mode: str) -> None:
    recorder = Recorder()
    async with Client(make_server(recorder), mode=mode) as client:
        rs = RetryingSession(client, policy=RetryPolicy(deadline=0.3))
        start = anyio.current_time()
        with pytest.raises(OutcomeUnknown) as caught:
            await rs.call_tool("hang")
        elapsed = anyio.current_time() - start
    assert 0.3 <= elapsed <= 0.3 + TICK
    assert caught.value.reason == "deadline" and recorder.executions("hang") == 1


async def test_deadline_covers_attempts_and_waits() -> None:
    recorder = Recorder()
    policy = RetryPolicy(
        deadline=0.8,
        attempt_timeout=0.15,
        max_attempts=10,
        wait_initial=0.05,
        wait_max=0.1,
        budget=None,
    )
    async with Client(make_server(recorder)) as client:
        rs = RetryingSession(client, policy=policy)
        start = anyio.current_time()
        with pytest.raises(OutcomeUnknown) as caught:
            await rs.call_tool("hang")
        elapsed = anyio.current_time() - start
    report = caught.value.report
    assert report is not None and elapsed <= 0.8 + TICK
    assert caught.value.reason in ("deadline", "attempts")
    # Every attempt that reached the server is maybe executed; on a loaded machine the last one
    # may be cut by the deadline before its request was written (never sent, never executed).
    *sent, last = report.attempts
    assert all(a.failure == "maybe_executed" for a in sent)
    assert last.failure in ("maybe_executed", "never_sent")
    executed = [a for a in report.attempts if a.failure == "maybe_executed"]
    assert 2 <= len(executed) == recorder.executions("hang") <= len(report.attempts) <= 10


async def test_cancelling_the_caller_mid_backoff_stops_at_once() -> None:
    recorder = Recorder()
    recorder.always["idem"] = MCPError(wire.IN_PROGRESS, "busy", {"retryAfterMs": 5000})
    async with Client(make_server(recorder)) as client:
        rs = RetryingSession(client, policy=RetryPolicy(max_retry_after=10))
        with anyio.CancelScope() as scope:
            with on_retry(lambda _record: scope.cancel()) as retries:
                start = anyio.current_time()
                await rs.call_tool("idem", {"x": 1})
        elapsed = anyio.current_time() - start
        assert scope.cancelled_caught and len(retries) == 1
        assert elapsed < TICK  # the 5 s wait was interrupted, not slept
        assert rs.last_report is not None and rs.last_report.outcome == "cancelled"
        # No attempt was sent after the cancellation, and the session still works.
        recorder.always.clear()
        assert (await rs.call_tool("idem", {"x": 2})).is_error is False
    assert recorder.attempts("idem") == [1, 1]


async def test_cancelling_the_caller_mid_attempt_is_not_retried() -> None:
    recorder = Recorder()
    async with Client(make_server(recorder), mode="legacy") as client:
        rs = RetryingSession(client)
        with anyio.move_on_after(0.2) as scope:
            await rs.call_tool("hang")
        assert scope.cancelled_caught
        assert rs.last_report is not None and rs.last_report.outcome == "cancelled"
        assert len(rs.last_report.attempts) == 0  # cut mid-attempt: nothing failed, nothing retried
    assert recorder.executions("hang") == 1
