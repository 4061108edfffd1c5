"""The checker itself: fed hand-made runs, it must see each kind of violation (a checker that
never fails proves nothing), and the engine refuses bad settings with a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcp_once.scenarios import (
    CallRecord,
    CallSpec,
    Ledger,
    MemoryEndpoint,
    RunResult,
    Scenario,
    build_server,
    check,
    default_plan,
    plan_calls,
    run_workload,
)
from orchestrator import AttemptReport, CallReport
from orchestrator.chaos import Chaos, FaultPlan

pytestmark = pytest.mark.chaos


def spec(call_id: str, tool: str) -> CallSpec:
    return CallSpec(0, call_id, tool, {"call_id": call_id})


def report(tool: str, *failures: str | None) -> CallReport:
    attempts = tuple(
        AttemptReport(number=n, wait_before=0.0, generation=0, failure=f)  # type: ignore[arg-type]
        for n, f in enumerate(failures, start=1)
    )
    return CallReport(
        tool=tool, key="k", outcome="result", attempts=attempts, total_wait=0.0, elapsed=0.0
    )


def run_of(ledger: Ledger, *records: CallRecord, mode: str = "mcp-once") -> RunResult:
    return RunResult(
        mode=mode,  # type: ignore[arg-type]
        transport="memory",
        era="modern",
        seed=0,
        records=list(records),
        chaos=Chaos(FaultPlan(), seed=0),
        ledger=ledger,
        elapsed=0.0,
        connects=1,
    )


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.sqlite3")


def test_a_clean_run_is_ok(ledger: Ledger) -> None:
    ledger.record("c1", "pay", "receipt r1 5 to a", key="k", attempt=1)
    record = CallRecord(spec("c1", "pay"), "result", result="receipt r1 5 to a", key="k")
    result = check(run_of(ledger, record))
    assert result.ok and result.effects == 1 and result.succeeded == 1 and result.problems == []


def test_a_second_payment_is_a_duplicate(ledger: Ledger) -> None:
    ledger.record("c1", "pay", "receipt r1 5 to a", key="k", attempt=1)
    ledger.record("c1", "pay", "receipt r2 5 to a", key="k", attempt=2)
    record = CallRecord(spec("c1", "pay"), "result", result="receipt r1 5 to a", key="k")
    result = check(run_of(ledger, record))
    assert result.duplicates == 1 and not result.ok
    assert "effect happened 2 times" in result.problems[0]


def test_a_naturally_idempotent_rerun_is_not_a_duplicate(ledger: Ledger) -> None:
    ledger.record("c1", "set_value", "x=1 (write a)", key="k", attempt=1)
    ledger.record("c1", "set_value", "x=1 (write b)", key="k", attempt=2)
    record = CallRecord(spec("c1", "set_value"), "result", result="x=1 (write b)", key="k")
    result = check(run_of(ledger, record))
    assert result.ok and result.duplicates == 0 and result.reexecutions == 1


def test_a_copy_the_network_made_is_counted_apart(ledger: Ledger) -> None:
    ledger.record("c1", "notify", "sent a", key="k", attempt=1)
    ledger.record("c1", "notify", "sent b", key="k", attempt=1)
    record = CallRecord(
        spec("c1", "notify"), "result", result="sent a", key="k", report=report("notify", None)
    )
    result = check(run_of(ledger, record))
    assert result.ok and result.wire_duplicates == 1 and result.duplicates == 0


def test_a_result_that_is_not_the_effect_is_lost(ledger: Ledger) -> None:
    ledger.record("c1", "pay", "receipt r1 5 to a", key="k", attempt=1)
    record = CallRecord(spec("c1", "pay"), "result", result="receipt forged", key="k")
    result = check(run_of(ledger, record))
    assert result.lost_results == 1 and not result.ok


def test_a_success_without_an_effect_is_lost(ledger: Ledger) -> None:
    record = CallRecord(spec("c1", "pay"), "result", result="receipt r1 5 to a", key="k")
    assert check(run_of(ledger, record)).lost_results == 1


def test_not_executed_with_an_effect_is_a_lie(ledger: Ledger) -> None:
    ledger.record("c1", "notify", "sent a", key="k", attempt=1)
    record = CallRecord(spec("c1", "notify"), "not_executed", key="k")
    result = check(run_of(ledger, record))
    assert result.lost_results == 1 and "NotExecuted" in result.problems[0]


def test_reconciliation_must_agree_with_the_ledger(ledger: Ledger) -> None:
    ledger.record("c1", "pay", "receipt r1 5 to a", key="k", attempt=1)
    good = CallRecord(
        spec("c1", "pay"), "outcome_unknown", key="k", reconciled=("replayed", "receipt r1 5 to a")
    )
    assert check(run_of(ledger, good)).reconciled == 1
    bad = CallRecord(spec("c1", "pay"), "not_executed", key="k", reconciled=("replayed", "x"))
    assert check(run_of(ledger, bad)).lost_results == 1
    operator = CallRecord(
        spec("c1", "pay"), "outcome_unknown", key="k", reconciled=("unknown", None)
    )
    result = check(run_of(ledger, operator))
    assert result.ok and result.needs_operator == 1


def test_a_retried_unguarded_tool_is_a_gate_violation(ledger: Ledger) -> None:
    ledger.record("c1", "notify", "sent a", key="k", attempt=1)
    record = CallRecord(
        spec("c1", "notify"),
        "result",
        result="sent a",
        key="k",
        attempts=2,
        report=report("notify", "maybe_executed", None),
    )
    result = check(run_of(ledger, record))
    assert result.gate_violations == 1 and not result.ok
    # The server's view alone catches it too: two attempts of one call both ran.
    ledger.record("c1", "notify", "sent b", key="k", attempt=2)
    bare = CallRecord(spec("c1", "notify"), "result", result="sent a", key="k")
    assert check(run_of(ledger, bare)).gate_violations == 1


def test_an_unexplained_failure_and_a_stranger_effect_are_lost(ledger: Ledger) -> None:
    ledger.record("nobody", "pay", "receipt r9 1 to a")
    record = CallRecord(spec("c1", "get_balance"), "unexplained", error_type="RuntimeError")
    result = check(run_of(ledger, record, mode="naive"))
    assert result.unexplained == 1 and result.lost_results == 2


def test_bad_settings_are_refused(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="calls must be"):
        plan_calls(-1, 0)
    with pytest.raises(ValueError, match="no workload tool"):
        plan_calls(3, 0, tools=["nope"])
    with pytest.raises(ValueError, match="scale"):
        default_plan(scale=0)
    with pytest.raises(ValueError, match="transport"):
        Scenario(transport="pigeon")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="era"):
        Scenario(era="future")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_bad_run_settings_are_refused(ledger: Ledger) -> None:
    endpoint = MemoryEndpoint(lambda: build_server(None, ledger))
    with pytest.raises(ValueError, match="mode"):
        await run_workload(endpoint, mode="yolo", ledger=ledger, plan=FaultPlan(), seed=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="concurrency"):
        await run_workload(
            endpoint, mode="naive", ledger=ledger, plan=FaultPlan(), seed=0, concurrency=0
        )


def test_the_same_seed_makes_the_same_calls() -> None:
    assert plan_calls(50, 9) == plan_calls(50, 9)
    assert plan_calls(50, 9) != plan_calls(50, 10)
    assert {s.tool for s in plan_calls(200, 1)} == {"pay", "set_value", "get_balance", "notify"}


def test_a_takeover_on_reconciliation_answers_with_the_last_run(ledger: Ledger) -> None:
    """A server died mid-write; reconciliation took the expired lease over and ran it again."""
    ledger.record("c1", "set_value", "x=1 (write a)", key="k", attempt=1)
    ledger.record("c1", "set_value", "x=1 (write b)", key="k", attempt=1)
    record = CallRecord(
        spec("c1", "set_value"),
        "outcome_unknown",
        key="k",
        reconciled=("executed", "x=1 (write b)"),
    )
    result = check(run_of(ledger, record))
    assert result.ok and result.reexecutions == 1 and result.reconciled == 1
    stale = CallRecord(
        spec("c1", "set_value"),
        "outcome_unknown",
        key="k",
        reconciled=("executed", "x=1 (write a)"),
    )
    assert check(run_of(ledger, stale)).lost_results == 1
    # The same for a payment would be a duplicate and a mismatch.
    ledger = Ledger(ledger.path.with_name("payments.sqlite3"))
    ledger.record("c2", "pay", "receipt r1 5 to a", key="k2", attempt=1)
    ledger.record("c2", "pay", "receipt r2 5 to a", key="k2", attempt=1)
    pay = CallRecord(
        spec("c2", "pay"), "outcome_unknown", key="k2", reconciled=("executed", "receipt r2 5 to a")
    )
    result = check(run_of(ledger, pay))
    assert result.duplicates == 1 and result.lost_results == 1
