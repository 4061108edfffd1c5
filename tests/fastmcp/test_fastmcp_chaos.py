"""The chaos suite's case for FastMCP: `RetryingSession` against the FastMCP shop, guarded by
`IdempotencyMiddleware`, over streamable HTTP through the chaos transport, with the server
killed (-9) and restarted mid-run. Effects are counted in the ledger the tools write; the engine's
checker reads it, not anything mcp-once reports. The baseline (the same shop unguarded, a naive
retry loop, the same seeded plan) shows the duplicates the checker would catch."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio.to_thread
import chaos_engine as engine
import pytest

pytestmark = [pytest.mark.chaos, pytest.mark.anyio]

SHOP = Path(__file__).with_name("fastmcp_shop.py")
CALLS = 240
SEED = 13


async def run(workdir: Path, era: str, *, guarded: bool) -> engine.Report:
    """One seeded run of `CALLS` calls, the server restarted (kill -9) halfway."""
    ledger = engine.Ledger(workdir / "ledger.sqlite3")
    argv = [sys.executable, str(SHOP), "--ledger", str(ledger.path), "--lease", "5"]
    if guarded:
        argv += ["--store", f"sqlite:///{workdir / 'keys.sqlite3'}"]
    process = engine.ServerProcess(
        lambda port: [*argv, "--port", str(port)], log=workdir / "server.log"
    )
    await anyio.to_thread.run_sync(process.start)
    endpoint = engine.HttpEndpoint(process, era)  # type: ignore[arg-type]
    try:
        result = await engine.run_workload(
            endpoint,
            mode="mcp-once" if guarded else "naive",
            ledger=ledger,
            plan=engine.default_plan(),
            seed=SEED,
            calls=CALLS,
            policy=engine.default_policy(attempt_timeout=0.5),
            concurrency=4,
            actions={CALLS // 2: endpoint.restart},
        )
    finally:
        await endpoint.aclose()
    report = engine.check(result)
    print(report.summary())
    return report


@pytest.mark.parametrize("era", ["modern", "legacy"])
async def test_no_duplicate_effect_under_a_seeded_fault_plan(tmp_path: Path, era: str) -> None:
    report = await run(tmp_path, era, guarded=True)
    assert report.calls == CALLS
    assert report.problems == [], report.problems
    assert report.duplicates == 0
    assert report.lost_results == 0
    assert report.gate_violations == 0
    assert report.unexplained == 0
    # Not a quiet run: faults happened, and retries and replays absorbed them.
    assert report.faults_injected > 0 and report.retries > 0 and report.replays > 0


async def test_the_same_plan_without_mcp_once_shows_duplicates(tmp_path: Path) -> None:
    report = await run(tmp_path, "modern", guarded=False)
    assert report.duplicates > 0
