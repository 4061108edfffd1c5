"""Hundreds of logical calls per transport under a seeded random fault plan, checked against the
ledger: no duplicate effect, no lost result, the gate never broken. And the baseline: the same
plan with a naive retry loop shows duplicates, which proves the checker can see them."""

from __future__ import annotations

from pathlib import Path

import pytest
from chaos_suite_settings import calls, seeds

from mcp_once.scenarios import Report, Scenario, default_policy, run_scenario

pytestmark = [pytest.mark.chaos, pytest.mark.anyio]


def assert_contract(report: Report) -> None:
    print(report.summary())
    assert report.problems == [], report.problems
    assert report.duplicates == 0
    assert report.lost_results == 0
    assert report.gate_violations == 0
    assert report.unexplained == 0
    assert report.calls == report.succeeded + report.outcome_unknown + report.not_executed + (
        report.permanent_errors
    )
    # The run was not a quiet one: faults happened and were absorbed by retries and replays.
    assert report.faults_injected > 0 and report.retries > 0 and report.replays > 0


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize("era", ["modern", "legacy"])
@pytest.mark.parametrize("seed", seeds((1, 2), soak=30))
async def test_memory(tmp_path: Path, era: str, seed: int) -> None:
    scenario = Scenario(
        transport="memory",
        era=era,  # type: ignore[arg-type]
        calls=calls(200, soak=600),
        seed=seed,
        policy=default_policy(attempt_timeout=0.2),
        concurrency=4,
        restart_at=(100,),
    )
    assert_contract(await run_scenario(scenario, "mcp-once", tmp_path))


@pytest.mark.parametrize("seed", seeds((3,), soak=8))
async def test_stdio(tmp_path: Path, seed: int) -> None:
    scenario = Scenario(
        transport="stdio",
        calls=calls(100, soak=400),
        seed=seed,
        policy=default_policy(attempt_timeout=0.5),
        concurrency=4,
        restart_at=(60,),
    )
    assert_contract(await run_scenario(scenario, "mcp-once", tmp_path))


@pytest.mark.parametrize("era", ["modern", "legacy"])
@pytest.mark.parametrize("seed", seeds((4,), soak=8))
async def test_http(tmp_path: Path, era: str, seed: int) -> None:
    scenario = Scenario(
        transport="http",
        era=era,  # type: ignore[arg-type]
        calls=calls(120, soak=400),
        seed=seed,
        policy=default_policy(attempt_timeout=0.5),
        concurrency=4,
        restart_at=(60,),
    )
    assert_contract(await run_scenario(scenario, "mcp-once", tmp_path))


@pytest.mark.parametrize("seed", seeds((1,), soak=10))
async def test_naive_baseline_shows_duplicates(tmp_path: Path, seed: int) -> None:
    """Same calls, same plan, no mcp-once: duplicates appear and the checker reports them."""
    scenario = Scenario(
        transport="memory",
        calls=calls(150, soak=600),
        seed=seed,
        policy=default_policy(attempt_timeout=0.2),
        restart_at=(75,),
    )
    naive = await run_scenario(scenario, "naive", tmp_path)
    once = await run_scenario(scenario, "mcp-once", tmp_path)
    print(naive.summary())
    print(once.summary())
    assert naive.duplicates > 0
    assert not naive.ok
    assert any("effect happened" in problem for problem in naive.problems)
    assert once.ok and once.duplicates == 0
    # One worker: both runs drew the same faults for the same calls.
    assert naive.calls == once.calls
