"""Benchmark: the primary SIGKILLed mid-run, with and without `wait_replicas=1`.

    # Sentinel, 3 rounds each, writes results/failover-sentinel.json:
    uv run --group bench python -m benchmarks.failover
    # Redis Cluster, writes results/failover-cluster.json:
    uv run --group bench python -m benchmarks.failover --deployment cluster
    uv run --group bench python -m benchmarks.failover --rounds 1 --calls 500 --json

A real replicated Redis (`_deployments.py`: Sentinel, 1 primary + 2 replicas + 3 Sentinels; or a
Redis Cluster, 3 masters + 3 replicas, the first master crashed; `appendfsync always` on every
node) keeps the records of the scenario shop's MCP server
(`mcp_once.scenarios.build_server`, in-process, every tool guarded). A `RetryingSession` makes
`calls` keyed `pay` calls (an effect that must happen once), `concurrency` at a time; when call
number `kill_at * calls` starts (an event of the workload, not a timer), the primary gets
SIGKILL. Each `pay` writes its effect to the ledger itself, so duplicates are counted by the
tool, not by the store under test. Reported per run:

* acknowledged claims lost and acknowledged completions lost (`_witness.py`: answers the store
  gave the guard, contradicted later or by the final records);
* duplicate effects (logical calls whose effect ran more than once, from the ledger);
* UNKNOWN records left for an operator, and failed calls by how they failed (every one must be
  an explicit outcome: `unexplained` counts the ones that are not);
* time to recover: kill to the first store write that succeeded, and kill to the deployment
  reporting a new writable primary.

Each round starts a fresh deployment, so the runs do not share a history; rounds alternate
`wait_replicas=0` and `wait_replicas=1`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.to_thread

from idempotency import RecordState, RedisKeyStore
from mcp_once.scenarios import (
    CallRecord,
    Ledger,
    MemoryEndpoint,
    build_server,
    check,
    plan_calls,
    run_workload,
)
from orchestrator import RetryPolicy
from orchestrator.chaos import FaultPlan

from ._deployments import DEPLOYMENTS, Deployment, Stallable
from ._stats import spread
from ._witness import Witness

#: Where each deployment's last run is written (`--out` overrides).
RESULTS = Path(__file__).resolve().parent / "results"
REPRODUCE = "uv run --group bench python -m benchmarks.failover"
#: The guard's lease and how long a duplicate waits: longer than a Sentinel failover (~2-3 s),
#: so a result computed before the crash is still stored after it (`_guard/complete.py`).
LEASE = 10.0
WAIT = 5.0
#: Seconds the store waits for a reply; above `wait_timeout`, as the store requires.
SOCKET_TIMEOUT = 2.0
WAIT_TIMEOUT = 1.0
RECOVERY_TIMEOUT = 60.0


def client_policy() -> RetryPolicy:
    """Retries that ride out a failover of a few seconds: 8 attempts, backoff to 1 s."""
    return RetryPolicy(
        max_attempts=8,
        attempt_timeout=10.0,
        deadline=60.0,
        wait_initial=0.05,
        wait_max=1.0,
        budget=None,
        connect_timeout=20.0,
    )


@dataclass
class Crash:
    """When the primary died and when the deployment had a new one (monotonic seconds)."""

    killed_at: float | None = None
    recovered_at: float | None = None


async def measure_once(
    deployment: Deployment,
    *,
    wait_replicas: int,
    calls: int = 500,
    concurrency: int = 8,
    kill_at: float = 0.4,
    lag: float = 0.0,
    seed: int = 0,
) -> dict[str, Any]:
    """One run against a started `deployment` (which it crashes); the figures as a dict.

    `lag` > 0: the primary's replicas are frozen (SIGSTOP) that many seconds before the kill
    and thawed right after it, so the writes of that window exist on the primary alone (the
    deployment must be `Stallable`)."""
    if lag > 0 and not isinstance(deployment, Stallable):
        raise ValueError(f"the {deployment.name} deployment cannot cut its replicas off (--lag)")
    crash = Crash()

    async def kill() -> None:
        stalled: object = None
        if lag > 0:
            stalled = await anyio.to_thread.run_sync(cast(Stallable, deployment).stall_replicas)
            await anyio.sleep(lag)  # the fault's length, a parameter of the run
        handle = await anyio.to_thread.run_sync(deployment.kill_primary)
        crash.killed_at = time.monotonic()
        if stalled is not None:
            await anyio.to_thread.run_sync(cast(Stallable, deployment).resume_replicas, stalled)
        await anyio.to_thread.run_sync(deployment.wait_recovered, handle, RECOVERY_TIMEOUT)
        crash.recovered_at = time.monotonic()

    store = RedisKeyStore.from_url(
        deployment.store_url(),
        prefix=f"failover-{uuid.uuid4().hex[:8]}:",
        wait_replicas=wait_replicas,
        wait_timeout=WAIT_TIMEOUT,
        socket_timeout=SOCKET_TIMEOUT,
    )
    witness = Witness(store)
    with tempfile.TemporaryDirectory(prefix="mcp-once-failover-") as workdir:
        ledger = Ledger(Path(workdir) / "ledger.db")
        endpoint = MemoryEndpoint(lambda: build_server(witness, ledger, lease=LEASE, wait=WAIT))
        try:
            run = await run_workload(
                endpoint,
                mode="mcp-once",
                ledger=ledger,
                plan=FaultPlan(),
                seed=seed,
                calls=plan_calls(calls, seed, tools=["pay"]),
                policy=client_policy(),
                concurrency=concurrency,
                actions={int(kill_at * calls): kill},
            )
            report = check(run)
            losses = await witness.audit()
            unknown = await store.list_records(state=RecordState.UNKNOWN, limit=10_000)
        finally:
            await witness.aclose()
    failures = Counter(_how(record) for record in run.records if record.outcome != "result")
    first_write = None if crash.killed_at is None else witness.first_write_after(crash.killed_at)
    return {
        "deployment": deployment.name,
        "wait_replicas": wait_replicas,
        "replica_lag_s": lag,
        "calls": len(run.records),
        "succeeded": report.succeeded,
        "acked_claims_lost": len(losses.claims),
        "acked_completions_lost": len(losses.completions),
        "duplicate_effects": report.duplicates,
        "unknown_records": len(unknown),
        "unknown_record_histories": [witness.history.get(r.key, []) for r in unknown],
        "failed_calls": sum(failures.values()),
        "failed_calls_by_kind": dict(sorted(failures.items())),
        "unexplained_failures": report.unexplained,
        "lost_results": report.lost_results,
        "reconciled_after_run": report.reconciled,
        "needs_operator": report.needs_operator,
        "retries": report.retries,
        "killed": crash.killed_at is not None,
        "recover_first_write_s": _since(crash.killed_at, first_write),
        "recover_failover_s": _since(crash.killed_at, crash.recovered_at),
        "elapsed_s": round(run.elapsed, 3),
    }


def _how(record: CallRecord) -> str:
    """How a call failed: its error, why the client stopped, the last JSON-RPC code seen."""
    how = record.error_type or record.outcome
    report = record.report
    if report is None or not report.attempts:
        return how
    return f"{how} (gave up: {report.give_up}; last code {report.attempts[-1].code})"


def _since(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(end - start, 3)


async def measure(
    kind: str = "sentinel",
    *,
    rounds: int = 3,
    calls: int = 500,
    concurrency: int = 8,
    wait_replicas_values: tuple[int, ...] = (0, 1),
    lags: tuple[float, ...] = (0.0,),
) -> dict[str, Any]:
    """`rounds` runs per (`lag`, `wait_replicas`) pair (interleaved), each on a fresh
    deployment."""
    runs: list[dict[str, Any]] = []
    pairs = [(lag, wait_replicas) for lag in lags for wait_replicas in wait_replicas_values]
    for round_no in range(rounds):
        for lag, wait_replicas in pairs:
            deployment = DEPLOYMENTS[kind]()
            await anyio.to_thread.run_sync(deployment.start)
            try:
                runs.append(
                    await measure_once(
                        deployment,
                        wait_replicas=wait_replicas,
                        calls=calls,
                        concurrency=concurrency,
                        lag=lag,
                        seed=round_no,
                    )
                )
            finally:
                await anyio.to_thread.run_sync(deployment.cleanup)
    return {"runs": runs, "summary": summarize(runs)}


_COUNTS = (
    "acked_claims_lost",
    "acked_completions_lost",
    "duplicate_effects",
    "unknown_records",
    "failed_calls",
    "unexplained_failures",
)
_TIMES = ("recover_first_write_s", "recover_failover_s")


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (replica lag, `wait_replicas`): totals of the counts over the runs, spread of the
    times."""
    summary: dict[str, Any] = {}
    for lag, wait_replicas in sorted(
        {(run["replica_lag_s"], run["wait_replicas"]) for run in runs}
    ):
        mine = [
            run
            for run in runs
            if (run["replica_lag_s"], run["wait_replicas"]) == (lag, wait_replicas)
        ]
        row: dict[str, Any] = {"runs": len(mine), "calls": sum(run["calls"] for run in mine)}
        for name in _COUNTS:
            row[name] = {
                "total": sum(run[name] for run in mine),
                "per_run": [r[name] for r in mine],
            }
        for name in _TIMES:
            values = [run[name] for run in mine if run[name] is not None]
            row[name] = spread(values) if values else None
        summary[f"replica lag {lag}s, wait_replicas={wait_replicas}"] = row
    return summary


def _table(summary: dict[str, Any]) -> str:
    lines = [
        "| scenario | acked claims lost | acked completions lost | duplicate effects"
        " | UNKNOWN records | failed calls (unexplained) | kill → first write (s)"
        " | kill → failover (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, row in summary.items():
        times = [row[name] for name in _TIMES]
        shown = ["-" if t is None else f"{t['median']} ({t['min']}–{t['max']})" for t in times]
        lines.append(
            f"| {label} ({row['runs']} runs, {row['calls']} calls)"
            f" | {row['acked_claims_lost']['total']} | {row['acked_completions_lost']['total']}"
            f" | {row['duplicate_effects']['total']} | {row['unknown_records']['total']}"
            f" | {row['failed_calls']['total']} ({row['unexplained_failures']['total']})"
            f" | {shown[0]} | {shown[1]} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deployment", choices=sorted(DEPLOYMENTS), default="sentinel")
    parser.add_argument("--rounds", type=int, default=3, help="runs per wait_replicas value")
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--wait-replicas",
        type=int,
        action="append",
        choices=(0, 1),
        help="measure only this wait_replicas value (repeatable; default: 0 and 1)",
    )
    parser.add_argument(
        "--lag",
        type=float,
        action="append",
        help="freeze the replicas this many seconds before the kill (repeatable; default:"
        " 0 and 0.5)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--out",
        type=Path,
        help="where to write the JSON (default: results/failover-<deployment>.json)",
    )
    args = parser.parse_args(argv)
    for name in ("idempotency", "orchestrator", "mcp", "httpx"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    started = time.perf_counter()
    values = tuple(args.wait_replicas or (0, 1))
    lags = tuple(args.lag or (0.0, 0.5))
    if any(lag < 0 for lag in lags):
        parser.error("--lag must be >= 0")
    out = anyio.run(
        lambda: measure(
            args.deployment,
            rounds=args.rounds,
            calls=args.calls,
            concurrency=args.concurrency,
            wait_replicas_values=values,
            lags=lags,
        )
    )
    only = "".join(f" --wait-replicas {value}" for value in args.wait_replicas or ())
    only += "".join(f" --lag {lag}" for lag in args.lag or ())
    out = {
        "benchmark": "failover",
        "reproduce": f"{REPRODUCE} --deployment {args.deployment} --rounds {args.rounds}"
        f" --calls {args.calls} --concurrency {args.concurrency}{only}",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - started, 1),
        **out,
    }
    target: Path = args.out or RESULTS / f"failover-{args.deployment}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2) if args.json else _table(out["summary"]))
    print(f"results: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
