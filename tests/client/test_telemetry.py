"""OpenTelemetry counters: attempts, retries, budget exhausted, outcome unknown, reconnects."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from _faults import Faults, faulty_transport
from _servers import Recorder, make_server
from mcp import Client, MCPError

from idempotency import wire
from orchestrator import NotExecuted, OutcomeUnknown, RetryingSession, RetryPolicy
from orchestrator import _telemetry as telemetry

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


class FakeCounter:
    def __init__(self) -> None:
        self.adds: Counter[tuple[tuple[str, Any], ...]] = Counter()

    def add(self, amount: int, attributes: dict[str, Any] | None = None) -> None:
        self.adds[tuple(sorted((attributes or {}).items()))] += amount

    @property
    def total(self) -> int:
        return sum(self.adds.values())


@pytest.fixture
def counters(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeCounter]:
    fakes = {name: FakeCounter() for name in ("attempts", "retries", "budget_exhausted")}
    fakes |= {name: FakeCounter() for name in ("outcome_unknown", "reconnects")}
    for name, fake in fakes.items():
        monkeypatch.setattr(telemetry, f"_{name}", fake)
    return fakes


async def test_counters(counters: dict[str, FakeCounter]) -> None:
    recorder = Recorder()
    recorder.always["reader"] = MCPError(wire.STORE_UNAVAILABLE, "down")
    server = make_server(recorder)
    faults = Faults(plan={"idem": ["kill"], "plain": ["drop"]})
    async with RetryingSession(
        connect=lambda: Client(faulty_transport(server, faults)),
        policy=RetryPolicy(attempt_timeout=0.2),
    ) as rs:
        await rs.call_tool("idem", {"x": 1})  # 2 attempts, 1 reconnect (+1 first connect)
        with pytest.raises(OutcomeUnknown):
            await rs.call_tool("plain", {"x": 1})  # 1 attempt, outcome unknown
        reasons = []
        for _ in range(2):  # 3 attempts drain the budget to half: the next call gets one
            with pytest.raises(NotExecuted) as caught:
                await rs.call_tool("reader", {"x": 1})
            reasons.append(caught.value.reason)
    assert reasons == ["attempts", "budget"]
    assert counters["attempts"].adds[(("gen_ai.tool.name", "idem"),)] == 2
    assert counters["retries"].adds[(("gen_ai.tool.name", "idem"),)] == 1
    assert (
        counters["outcome_unknown"].adds[
            (("gen_ai.tool.name", "plain"), ("mcp_once.give_up_reason", "not_idempotent"))
        ]
        == 1
    )
    assert counters["reconnects"].total == 2
    assert counters["budget_exhausted"].adds == {(("gen_ai.tool.name", "reader"),): 1}
    assert counters["attempts"].total == 2 + 1 + 3 + 1
    assert counters["retries"].total == 1 + 2
