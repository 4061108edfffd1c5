"""Soak: many seeds, many calls, every transport — `python -m mcp_once.scenarios.soak --seeds 50`.

The CI suite runs a few fixed seeds; a soak runs the same engine for as long as you like and
prints one line per run, then the totals. Exit status 1 if any run broke the contract (a
duplicate effect, a lost result, a non-idempotent tool retried after it may have run).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from mcp_once.scenarios._invariants import Report
from mcp_once.scenarios._suite import Scenario, default_plan, run_scenario
from mcp_once.scenarios._workload import Mode, default_policy
from orchestrator import testing

_TIMEOUTS: dict[str, float] = {"memory": 0.2, "stdio": 0.5, "http": 0.5}
_TOTALS = (
    "calls",
    "faults_injected",
    "retries",
    "replays",
    "effects",
    "duplicates",
    "lost_results",
    "gate_violations",
    "outcome_unknown",
    "not_executed",
)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m mcp_once.scenarios.soak", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seeds", type=int, default=20, help="seeds 1..N (default 20)")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--calls", type=int, default=500, help="calls per run (default 500)")
    parser.add_argument(
        "--transports", default="memory,stdio,http", help="comma-separated (default: all)"
    )
    parser.add_argument("--eras", default="modern,legacy", help="comma-separated")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--scale", type=float, default=1.0, help="fault rate multiplier")
    parser.add_argument("--store", default=None, help="key store URL (default: SQLite per run)")
    parser.add_argument("--baseline", action="store_true", help="also run the naive baseline")
    parser.add_argument("--json", action="store_true", help="print the totals as JSON")
    return parser.parse_args(argv)


async def soak(args: argparse.Namespace, workdir: Path) -> list[Report]:
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    eras = [e.strip() for e in args.eras.split(",") if e.strip()]
    modes: list[Mode] = ["mcp-once", "naive"] if args.baseline else ["mcp-once"]
    reports: list[Report] = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for transport in transports:
            for era in eras:
                scenario = Scenario(
                    transport=transport,
                    era=era,
                    calls=args.calls,
                    seed=seed,
                    plan=default_plan(scale=args.scale),
                    store_url=args.store,
                    policy=default_policy(attempt_timeout=_TIMEOUTS.get(transport, 1.0)),
                    concurrency=args.concurrency,
                    restart_at=(args.calls // 2,),
                )
                for mode in modes:
                    report = await run_scenario(scenario, mode, workdir / f"{seed}")
                    reports.append(report)
                    label = "base " if mode == "naive" else "OK   " if report.ok else "FAIL "
                    print(label + report.summary(), flush=True)
                    for problem in report.problems if mode == "mcp-once" else ():
                        print(f"     {problem}", flush=True)
    return reports


def totals(reports: Sequence[Report], mode: str) -> dict[str, int]:
    chosen = [report for report in reports if report.mode == mode]
    figures = {name: sum(getattr(report, name) for report in chosen) for name in _TOTALS}
    figures["runs"] = len(chosen)
    figures["failed_runs"] = sum(1 for report in chosen if not report.ok)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    logging.disable(logging.CRITICAL)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mcp-once-soak-") as tmp, testing():
        reports = anyio.run(soak, args, Path(tmp))
    once = totals(reports, "mcp-once")
    summary: dict[str, Any] = {"mcp-once": once, "seconds": round(time.monotonic() - started, 1)}
    if args.baseline:
        summary["naive"] = totals(reports, "naive")
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"totals: {summary}")
    return 0 if once["failed_runs"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
