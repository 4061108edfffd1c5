"""The invariant checker: what a chaos run must show, read from the ledger and the call reports.

For every logical call:
- its effect happened at most once (a naturally idempotent tool may run again: counted as a
  re-execution, not a duplicate; a copy of one attempt the *network* duplicated, on a tool the
  server does not guard, is counted apart: no client retry caused it);
- a call that returned success returned the effect's own result (the ledger's);
- a call that did not succeed ended in a clear outcome (`OutcomeUnknown`, `NotExecuted`, a
  permanent error) that reconciliation confirms: a replay of the ledger's result, a first run
  now when nothing had run, or an UNKNOWN record for an operator — never a `NotExecuted` whose
  effect had in fact happened;
- a tool not marked idempotent or read-only was never retried after a maybe-executed failure
  (the client's report, and the attempt numbers the server saw).

"Lost results" counts every call that breaks the second or third rule.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mcp_once.scenarios._ledger import Effect
from mcp_once.scenarios._shop import (
    EFFECT_TOOLS,
    READ_ONLY_TOOLS,
    REEXECUTABLE_TOOLS,
    UNGUARDED_TOOLS,
)
from mcp_once.scenarios._workload import CallRecord, RunResult
from orchestrator import GATED

__all__ = ["Report", "check"]

_MAX_PROBLEMS = 20


@dataclass(slots=True)
class Report:
    """The figures of one run and whether its invariants held."""

    mode: str
    transport: str
    era: str
    seed: int
    calls: int = 0
    succeeded: int = 0
    outcome_unknown: int = 0
    not_executed: int = 0
    permanent_errors: int = 0
    #: Calls that ended in neither a result nor a clear outcome (a raw error after retries).
    unexplained: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    #: Failed attempts by how they failed (mcp-once mode: the reports' `FailureKind`s).
    attempt_failures: dict[str, int] = field(default_factory=dict)
    replays: int = 0
    connects: int = 0
    #: Executions recorded in the ledger (all effect tools).
    effects: int = 0
    #: Extra executions of a logical call whose effect must happen once.
    duplicates: int = 0
    #: Extra executions of a naturally idempotent tool (harmless by its nature).
    reexecutions: int = 0
    #: Extra executions of one attempt of an unguarded tool that the network duplicated.
    wire_duplicates: int = 0
    #: Successes not matching the ledger, failures not explained.
    lost_results: int = 0
    #: Non-idempotent tools retried after they may have run.
    gate_violations: int = 0
    #: After the run: calls whose record answered (replay / first run now) ...
    reconciled: int = 0
    #: ... and calls whose record is UNKNOWN: an operator settles them (`mcp-once keys`).
    needs_operator: int = 0
    elapsed: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """The contract held: no duplicate, nothing lost, the gate never broken."""
        return self.duplicates == 0 and self.lost_results == 0 and self.gate_violations == 0

    @property
    def faults_injected(self) -> int:
        return sum(self.faults.values())

    def summary(self) -> str:
        """One line per run, for logs and test output."""
        faults = ",".join(f"{kind}={n}" for kind, n in sorted(self.faults.items())) or "none"
        return (
            f"[{self.mode} {self.transport}/{self.era} seed={self.seed}] calls={self.calls}"
            f" ok={self.succeeded} unknown={self.outcome_unknown}"
            f" not_executed={self.not_executed} errors={self.permanent_errors}"
            f" unexplained={self.unexplained} faults={self.faults_injected} ({faults})"
            f" retries={self.retries} replays={self.replays} effects={self.effects}"
            f" duplicates={self.duplicates} reexecutions={self.reexecutions}"
            f" wire_duplicates={self.wire_duplicates} lost={self.lost_results}"
            f" gate_violations={self.gate_violations} reconciled={self.reconciled}"
            f" needs_operator={self.needs_operator} in {self.elapsed:.1f}s"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "transport": self.transport,
            "era": self.era,
            "seed": self.seed,
            "calls": self.calls,
            "succeeded": self.succeeded,
            "outcome_unknown": self.outcome_unknown,
            "not_executed": self.not_executed,
            "permanent_errors": self.permanent_errors,
            "unexplained": self.unexplained,
            "faults_injected": self.faults_injected,
            "faults": dict(sorted(self.faults.items())),
            "retries": self.retries,
            "attempt_failures": dict(sorted(self.attempt_failures.items())),
            "replays": self.replays,
            "connects": self.connects,
            "effects": self.effects,
            "duplicate_effects": self.duplicates,
            "reexecutions": self.reexecutions,
            "wire_duplicates": self.wire_duplicates,
            "lost_results": self.lost_results,
            "gate_violations": self.gate_violations,
            "reconciled": self.reconciled,
            "needs_operator": self.needs_operator,
            "elapsed_seconds": round(self.elapsed, 3),
            "ok": self.ok,
            "problems": list(self.problems),
        }


class _Findings:
    def __init__(self, report: Report) -> None:
        self.report = report

    def problem(self, text: str) -> None:
        if len(self.report.problems) < _MAX_PROBLEMS:
            self.report.problems.append(text)


def _extra_executions(record: CallRecord, effects: list[Effect], mode: str) -> tuple[int, int, int]:
    """(duplicates, re-executions, wire duplicates) among one call's effects."""
    extra = max(0, len(effects) - 1)
    if extra == 0:
        return 0, 0, 0
    if record.tool in REEXECUTABLE_TOOLS:
        return 0, extra, 0
    if record.tool in UNGUARDED_TOOLS and mode == "mcp-once":
        # Same key and attempt twice: one request the network delivered twice, not a retry.
        attempts = {(effect.key, effect.attempt) for effect in effects}
        return len(attempts) - 1, 0, len(effects) - len(attempts)
    return extra, 0, 0


def _result_matches(result: str | None, effects: list[Effect], mode: str) -> bool:
    if mode == "mcp-once":
        # The one effect's result, whichever attempt or replay delivered it.
        return bool(effects) and result in {effects[0].result, effects[-1].result}
    return any(effect.result == result for effect in effects)


def _check_call(record: CallRecord, effects: list[Effect], mode: str, findings: _Findings) -> None:
    report = findings.report
    name = f"{record.spec.call_id} ({record.tool})"
    outcome = record.outcome
    effect_tool = record.tool in EFFECT_TOOLS
    lost = False
    if outcome == "result":
        report.succeeded += 1
        if effect_tool and not _result_matches(record.result, effects, mode):
            lost = True
            findings.problem(f"{name}: the result returned is not the effect's ({len(effects)})")
    elif outcome == "is_error":
        report.succeeded += 1
        lost = True
        findings.problem(f"{name}: an isError result ({record.result!r})")
    elif outcome == "outcome_unknown":
        report.outcome_unknown += 1
    elif outcome == "not_executed":
        report.not_executed += 1
    elif outcome == "error":
        report.permanent_errors += 1
    else:
        report.unexplained += 1
        lost = True
        findings.problem(f"{name}: ended with {record.error_type} and no clear outcome")

    if outcome in ("outcome_unknown", "not_executed") and effect_tool:
        lost |= _check_reconciled(record, effects, mode, name, findings)
    if lost:
        report.lost_results += 1


def _check_reconciled(
    record: CallRecord, effects: list[Effect], mode: str, name: str, findings: _Findings
) -> bool:
    """True when the call's failure is not explained by what reconciliation found."""
    report = findings.report
    verdict = record.reconciled
    if verdict is None:
        # Not reconciled by re-asking (an unguarded tool, or reconciliation off): the ledger is
        # the lookup. NotExecuted must mean no effect.
        if record.outcome == "not_executed" and effects:
            findings.problem(f"{name}: NotExecuted, yet the tool ran {len(effects)} time(s)")
            return True
        return False
    status, result = verdict
    if status == "unknown":
        report.needs_operator += 1
        return False
    if status == "replayed":
        report.reconciled += 1
        if record.outcome == "not_executed":
            findings.problem(f"{name}: NotExecuted, yet its record held a result")
            return True
        if not _result_matches(result, effects, mode):
            findings.problem(f"{name}: the reconciled replay is not the effect's result")
            return True
        return False
    if status == "executed":
        report.reconciled += 1
        if record.tool in REEXECUTABLE_TOOLS:
            # A takeover of an expired lease (a server died mid-run) may run it again: harmless
            # by the tool's nature; the answer must be the run that completed the record.
            if not effects or effects[-1].result != result:
                findings.problem(f"{name}: ran on reconciliation, but its result is not the last")
                return True
            return False
        # Nothing had run: the call ran now, once.
        if len(effects) != 1 or effects[0].result != result:
            findings.problem(f"{name}: ran on reconciliation, but the ledger has {len(effects)}")
            return True
        return False
    findings.problem(f"{name}: reconciliation failed ({status})")
    return True


def _gate_violations(record: CallRecord, effects: list[Effect], findings: _Findings) -> int:
    """A tool that is neither idempotent nor read-only, retried after it may have run."""
    if record.tool not in UNGUARDED_TOOLS or record.tool in READ_ONLY_TOOLS:
        return 0
    violations = 0
    if record.report is not None:
        attempts = record.report.attempts
        for before, after in itertools.pairwise(attempts):
            if before.failure in GATED:
                violations += 1
                findings.problem(
                    f"{record.spec.call_id} ({record.tool}): attempt {after.number} sent after"
                    f" a {before.failure} failure"
                )
                break
    executed_attempts = {effect.attempt for effect in effects if effect.attempt is not None}
    if len(executed_attempts) > 1 and violations == 0:
        violations += 1
        findings.problem(
            f"{record.spec.call_id} ({record.tool}): the server ran attempts"
            f" {sorted(executed_attempts)}"
        )
    return violations


def check(run: RunResult) -> Report:
    """Check one run's invariants against its ledger and return its figures."""
    report = Report(mode=run.mode, transport=run.transport, era=run.era, seed=run.seed)
    findings = _Findings(report)
    by_call = run.ledger.by_call()
    counts: Counter[str] = Counter()
    for kind, n in run.chaos.fault_counts().items():
        if n:
            counts[kind.value] += n
    for name, n in run.extra_faults.items():
        if n:
            counts[name] += n
    report.faults = dict(counts)
    report.calls = len(run.records)
    report.connects = run.connects
    report.elapsed = run.elapsed
    known = {record.spec.call_id for record in run.records}
    failures: Counter[str] = Counter()
    for record in run.records:
        if record.report is not None:
            failures.update(a.failure for a in record.report.attempts if a.failure is not None)
        effects = by_call.get(record.spec.call_id, [])
        report.effects += len(effects)
        report.retries += record.retries
        report.replays += int(record.replayed)
        duplicates, reexecutions, wire = _extra_executions(record, effects, run.mode)
        if duplicates:
            findings.problem(
                f"{record.spec.call_id} ({record.tool}): effect happened {len(effects)} times"
            )
        report.duplicates += duplicates
        report.reexecutions += reexecutions
        report.wire_duplicates += wire
        _check_call(record, effects, run.mode, findings)
        if run.mode == "mcp-once":
            report.gate_violations += _gate_violations(record, effects, findings)
    report.attempt_failures = dict(failures)
    strangers = [call_id for call_id in by_call if call_id not in known]
    if strangers:
        report.lost_results += len(strangers)
        findings.problem(f"effects for calls this run never made: {strangers[:5]}")
    return report
