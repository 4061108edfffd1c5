"""The retry budget: a failing server costs about 1x its calls, not max_attempts x."""

from __future__ import annotations

import threading

import anyio
import pytest
from _servers import Recorder, make_server
from mcp import Client, MCPError

from idempotency import wire
from orchestrator import NotExecuted, RetryBudget, RetryingSession, RetryPolicy

CALLS = 200


async def _outage_cost(mode: str, policy: RetryPolicy) -> tuple[int, list[str]]:
    """Send CALLS calls to a server whose every execution fails retryably; count executions."""
    recorder = Recorder()
    recorder.always["idem"] = MCPError(wire.STORE_UNAVAILABLE, "store down")
    reasons: list[str] = []
    async with Client(make_server(recorder), mode=mode) as client:
        rs = RetryingSession(client, policy=policy)
        for i in range(CALLS):
            with pytest.raises(NotExecuted) as caught:
                await rs.call_tool("idem", {"x": i})
            reasons.append(caught.value.reason)
    return recorder.executions("idem"), reasons


@pytest.mark.anyio
@pytest.mark.parametrize(("anyio_backend", "mode"), [("asyncio", "auto"), ("trio", "legacy")])
async def test_full_outage_costs_about_one_attempt_per_call(mode: str) -> None:
    with_budget, reasons = await _outage_cost(mode, RetryPolicy())
    without_budget, _ = await _outage_cost(mode, RetryPolicy(budget=None))
    assert with_budget <= 1.2 * CALLS
    # Exactly: 10 tokens, -1 per failed attempt, retries only while > 5 tokens: the first call
    # gets its 3 attempts (10 -> 7), the second 2 (-> 5), every later call 1.
    assert with_budget == CALLS + 3
    assert without_budget == 3 * CALLS  # max_attempts x, what the budget saves
    assert reasons[0] == "attempts" and reasons.count("budget") == CALLS - 1


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_budget_is_shared_by_concurrent_calls() -> None:
    recorder = Recorder()
    recorder.always["idem"] = MCPError(wire.STORE_UNAVAILABLE, "store down")
    budget = RetryBudget()
    async with Client(make_server(recorder)) as client:
        first = RetryingSession(client, policy=RetryPolicy(budget=budget))
        second = RetryingSession(client, policy=RetryPolicy(budget=budget))
        assert first.budget is second.budget is budget

        async def call(rs: RetryingSession, i: int) -> None:
            with pytest.raises(NotExecuted):
                await rs.call_tool("idem", {"x": i})

        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(call, first if i % 2 else second, i)
    assert recorder.executions("idem") <= 1.2 * 50
    assert budget.tokens <= budget.max_tokens / 2


def test_bucket_arithmetic() -> None:
    budget = RetryBudget(max_tokens=10, token_ratio=0.5)
    assert budget.allows_retry() and budget.tokens == 10
    for _ in range(5):
        budget.record_failure()
    assert budget.tokens == 5 and not budget.allows_retry()  # strictly more than half
    budget.record_success()
    assert budget.tokens == 5.5 and budget.allows_retry()
    for _ in range(100):
        budget.record_failure()
    assert budget.tokens == 0
    for _ in range(100):
        budget.record_success()
    assert budget.tokens == 10  # never above max


def test_bucket_is_thread_safe() -> None:
    budget = RetryBudget(max_tokens=1000, token_ratio=1)
    for _ in range(500):
        budget.record_failure()

    def churn() -> None:
        for _ in range(1000):
            budget.record_failure()
            budget.record_success()

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert budget.tokens == 500


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_tokens": 0}, ValueError),
        ({"max_tokens": 1001}, ValueError),
        ({"max_tokens": float("nan")}, ValueError),
        ({"token_ratio": 0}, ValueError),
        ({"token_ratio": 1.5}, ValueError),
        ({"max_tokens": "10"}, TypeError),
        ({"token_ratio": True}, TypeError),
    ],
)
def test_bad_budget_is_refused(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        RetryBudget(**kwargs)  # type: ignore[arg-type]
