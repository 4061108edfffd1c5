"""Hypothesis searches fault schedules: which request gets which fault, where the server
restarts, how many callers run at once. Every schedule must keep the contract."""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio
import pytest
from chaos_suite_settings import SOAK
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import orchestrator
from mcp_once.scenarios import Scenario, default_policy, run_scenario
from orchestrator.chaos import Fault, FaultPlan

pytestmark = pytest.mark.chaos

CALLS = 40

schedules = st.dictionaries(
    keys=st.integers(min_value=1, max_value=CALLS + 10),
    values=st.sampled_from(list(Fault)),
    min_size=1,
    max_size=15,
)


@settings(
    max_examples=80 if SOAK else 15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=not SOAK,
)
@given(
    schedule=schedules,
    seed=st.integers(min_value=0, max_value=2**16),
    restart_at=st.one_of(st.none(), st.integers(min_value=0, max_value=CALLS - 1)),
    concurrency=st.sampled_from([1, 3]),
    era=st.sampled_from(["modern", "legacy"]),
)
def test_any_fault_schedule_keeps_the_contract(
    schedule: dict[int, Fault],
    seed: int,
    restart_at: int | None,
    concurrency: int,
    era: str,
) -> None:
    plan = FaultPlan(schedule=schedule, delay_min_seconds=0.001, delay_max_seconds=0.02)
    scenario = Scenario(
        transport="memory",
        era=era,  # type: ignore[arg-type]
        calls=CALLS,
        seed=seed,
        plan=plan,
        policy=default_policy(attempt_timeout=0.15),
        concurrency=concurrency,
        restart_at=() if restart_at is None else (restart_at,),
    )

    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp, orchestrator.testing():
            report = await run_scenario(scenario, "mcp-once", Path(tmp))
        print(report.summary())
        assert report.problems == []
        assert report.ok and report.unexplained == 0

    anyio.run(run)
