"""`mcp-once demo`: the same tool calls under the same faults, with a naive retry and with mcp-once.

A real MCP server (in-process over memory streams, a stdio child or an HTTP server process) with
a payment, a naturally idempotent write, a read and an unguarded notification; a fault plan that
loses answers, duplicates requests, drops connections and restarts the server once; then a
side-by-side table. The engine is the chaos suite's (`mcp_once.scenarios`), so the demo shows
exactly what the tests assert.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import anyio

from ._common import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    fail,
    open_or_fail,
    store_problem,
)

if TYPE_CHECKING:
    from mcp_once.scenarios import CallRecord, Mode, Report, Scenario

DEFAULT_CALLS = 100
DEFAULT_SEED = 7
MAX_CALLS = 100_000

_EXPLANATION = (
    "{calls} MCP tool calls (payments, writes, reads, notifications) over {where}, through a"
    " link that loses answers, duplicates requests and drops connections, with one server"
    " restart halfway. The same calls meet the same faults twice: first with a naive retry"
    " loop (retry on any error, no keys), then with mcp-once (idempotency keys on the client,"
    " @idempotent on the server). A duplicate effect is, say, a payment charged twice."
)

_ROWS: tuple[tuple[str, str], ...] = (
    ("logical calls", "calls"),
    ("faults injected", "faults_injected"),
    ("retries", "retries"),
    ("replays served", "replays"),
    ("effects executed", "effects"),
    ("duplicate effects", "duplicate_effects"),
    ("outcome unknown (reported)", "outcome_unknown"),
    ("not executed (reported)", "not_executed"),
    ("lost results", "lost_results"),
)


def add_parser(commands: Any) -> None:
    demo = commands.add_parser(
        "demo",
        help="show duplicate effects under faults: naive retry vs mcp-once",
        description=(
            "Run the same tool calls under the same injected faults with a naive retry loop and"
            " with mcp-once, and compare the effects. Exit status 1 if mcp-once let a duplicate"
            " effect (or a lost result) through."
        ),
    )
    demo.add_argument(
        "--transport",
        choices=["memory", "stdio", "http"],
        default="memory",
        help="how the client reaches the server (default: %(default)s)",
    )
    demo.add_argument(
        "--store",
        default=None,
        help="key store URL for the mcp-once server (default: a SQLite file in a temporary"
        " directory; redis://host:port/db works too)",
    )
    demo.add_argument("--seed", type=int, default=DEFAULT_SEED, help="default: %(default)s")
    demo.add_argument(
        "--calls", type=int, default=DEFAULT_CALLS, help="logical calls (default: %(default)s)"
    )
    demo.add_argument("--json", action="store_true", help="print a machine-readable summary")
    demo.add_argument("--verbose", action="store_true", help="show the library's log output")
    demo.set_defaults(run=run)


def _check_args(args: argparse.Namespace) -> None:
    if not 1 <= args.calls <= MAX_CALLS:
        fail(f"--calls must be between 1 and {MAX_CALLS}, got {args.calls}", EXIT_USAGE)
    if args.seed < 0:
        fail(f"--seed must be >= 0, got {args.seed}", EXIT_USAGE)
    if args.store is not None and args.store.startswith("memory:") and args.transport != "memory":
        fail(
            "--store memory:// lives inside one process; the stdio and http servers run in"
            " processes of their own and restart: use a SQLite file or Redis",
            EXIT_USAGE,
        )


async def _probe_store(url: str) -> None:
    store = open_or_fail(url)
    try:
        problem = await store_problem(store, url)
    finally:
        await store.aclose()
    if problem is not None:
        fail(problem, EXIT_UNREACHABLE)


class _Live:
    """Live progress on stderr: one line rewritten on a terminal, a few lines otherwise."""

    def __init__(self, label: str, total: int, out: TextIO) -> None:
        self.label = label
        self.total = total
        self.out = out
        self.done = 0
        self.tty = out.isatty()
        self.step = max(1, total // 4)

    def __call__(self, record: CallRecord) -> None:
        self.done += 1
        if self.tty:
            width = 30
            filled = width * self.done // self.total
            bar = "#" * filled + "." * (width - filled)
            self.out.write(f"\r  {self.label:<12} [{bar}] {self.done}/{self.total}")
            if self.done == self.total:
                self.out.write("\n")
            self.out.flush()
        elif self.done % self.step == 0 or self.done == self.total:
            print(f"  {self.label}: {self.done}/{self.total} calls", file=self.out, flush=True)


def _figures(report: Report) -> dict[str, Any]:
    data = report.to_dict()
    return {key: data[key] for _, key in _ROWS}


def _table(baseline: Report, once: Report) -> str:
    left, right = _figures(baseline), _figures(once)
    label_width = max(len(label) for label, _ in _ROWS)
    lines = [f"{'':<{label_width}}  {'naive retry':>12}  {'mcp-once':>10}"]
    for label, key in _ROWS:
        lines.append(f"{label:<{label_width}}  {left[key]:>12}  {right[key]:>10}")
    return "\n".join(lines)


def _fault_line(report: Report) -> str:
    return ", ".join(f"{kind.replace('_', ' ')} {n}" for kind, n in sorted(report.faults.items()))


def _verdict(baseline: Report, once: Report) -> str:
    if not once.ok:
        return (
            f"FAILED: mcp-once let {once.duplicates} duplicate effect(s) and"
            f" {once.lost_results} lost result(s) through. Please report this with the seed."
        )
    unknown = once.outcome_unknown
    explained = (
        f" {unknown} call(s) ended in an explicit OutcomeUnknown instead of a blind retry (a"
        " notification, which is not idempotent, is never re-sent once it may have run); the"
        " caller reconciles those with their key."
        if unknown
        else ""
    )
    return (
        f"naive retry: {baseline.duplicates} duplicate effect(s). mcp-once: none, with"
        f" {once.replays} answer(s) replayed from the server's record.{explained}"
    )


def _summary(
    args: argparse.Namespace, store: str, baseline: Report, once: Report, seconds: float
) -> dict[str, Any]:
    return {
        "calls": once.calls,
        "transport": args.transport,
        "seed": args.seed,
        "store": store,
        "faults_injected": once.faults_injected,
        "faults": dict(sorted(once.faults.items())),
        "retries": once.retries,
        "replays": once.replays,
        "effects": once.effects,
        "duplicate_effects": once.duplicates,
        "lost_results": once.lost_results,
        "outcome_unknown": once.outcome_unknown,
        "baseline_faults_injected": baseline.faults_injected,
        "baseline_retries": baseline.retries,
        "baseline_effects": baseline.effects,
        "baseline_duplicate_effects": baseline.duplicates,
        "ok": once.ok,
        "seconds": round(seconds, 2),
        "mcp_once": once.to_dict(),
        "baseline": baseline.to_dict(),
    }


async def _run(args: argparse.Namespace, workdir: Path) -> tuple[Report, Report, str]:
    from mcp_once.scenarios import Scenario, default_policy, run_scenario

    store = args.store
    if store is None:
        store = f"sqlite:///{(workdir / 'keys.sqlite3').resolve()}"
    else:
        await _probe_store(store)
    timeout = 0.2 if args.transport == "memory" else 0.5
    scenario: Scenario = Scenario(
        transport=args.transport,
        calls=args.calls,
        seed=args.seed,
        store_url=store,
        policy=default_policy(attempt_timeout=timeout),
        restart_at=(args.calls // 2,),
    )
    modes: tuple[tuple[Mode, str], ...] = (("naive", "naive retry"), ("mcp-once", "mcp-once"))
    reports: list[Report] = []
    for mode, label in modes:
        live = _Live(label, args.calls, sys.stderr)
        reports.append(await run_scenario(scenario, mode, workdir, progress=live))
    return reports[0], reports[1], store


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    if not args.json:
        where = {"memory": "in-memory streams", "stdio": "stdio", "http": "streamable HTTP"}
        print(_EXPLANATION.format(calls=args.calls, where=where[args.transport]), flush=True)
        print(flush=True)
    if not args.verbose:
        logging.disable(logging.CRITICAL)
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="mcp-once-demo-") as tmp:
            baseline, once, store = anyio.run(_run, args, Path(tmp))
    finally:
        logging.disable(logging.NOTSET)
    seconds = time.monotonic() - started
    shown_store = store if args.store is not None else "a temporary SQLite file"
    if args.json:
        print(json.dumps(_summary(args, shown_store, baseline, once, seconds), indent=2))
    else:
        print()
        print(_table(baseline, once))
        print()
        print(f"faults (mcp-once run): {_fault_line(once) or 'none'}")
        print(_verdict(baseline, once))
        print(f"seed {args.seed}, store: {shown_store}, {seconds:.1f} s")
    return EXIT_OK if once.ok else EXIT_PROBLEM
