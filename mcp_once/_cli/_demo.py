"""`mcp-once demo`: the same tool calls under the same faults, with a naive retry and with mcp-once.

A real MCP server (in-process over memory streams, a stdio child or an HTTP server process) with
a payment, a naturally idempotent write, a read and an unguarded notification; a fault plan that
loses answers, duplicates requests, drops connections and restarts the server once; then a
side-by-side table. Then the agent pipeline: an agent process running a scripted eight-call
pipeline against the same shop over HTTP, SIGKILLed at seeded points and restarted with the same
run id until it finishes, once with fresh keys per process and once under `orchestrator.Run`. The
engine is the chaos suite's and the run tests' (`mcp_once.scenarios`), so the demo shows exactly
what the tests assert.

Leftovers: by default the records go to a SQLite file in a temporary directory, removed at the
end. A Redis given with `--store` is someone's: the demo writes under a prefix of its own, new
for each run (`mcp-once-demo:<12 hex>:`, or `<your prefix>demo-<12 hex>:` when the URL sets
`prefix=`), and deletes every key under it when it ends, also after a failure or Ctrl-C
(`RedisKeyStore.delete_all`, scoped to that prefix). No other key is read or written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import quote, unquote_plus

import anyio

from ._common import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    fail,
    open_or_fail,
    redacted,
    store_problem,
)

if TYPE_CHECKING:
    from mcp_once.scenarios import CallRecord, Mode, PipelineTotals, Report, Scenario
    from mcp_once.scenarios._in_doubt import InDoubtRun

#: A shell's status for a command ended by Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130
#: The shell's status for a process ended by SIGTERM (128 + 15).
EXIT_TERMINATED = 143
DEFAULT_CALLS = 100
DEFAULT_SEED = 7
MAX_CALLS = 100_000
#: Pipelines per mode by default: two seeds' worth of kills (7 or so) in a few seconds.
DEFAULT_PIPELINES = 2
MAX_PIPELINES = 50

_EXPLANATION = (
    "{calls} MCP tool calls (payments, writes, reads, notifications) over {where}, through a"
    " link that loses answers, duplicates requests and drops connections, with one server"
    " restart halfway. The same calls meet the same faults twice: first with a naive retry"
    " loop (retry on any error, no keys), then with mcp-once (idempotency keys on the client,"
    " @idempotent on the server). A duplicate effect is, say, a payment charged twice."
)

_PIPELINE_EXPLANATION = (
    "Then agent pipelines: {pipelines} eight-call pipeline(s) (payments, writes, notifications,"
    " a parallel turn of three), each run by an agent process against a guarded server over"
    " HTTP, SIGKILLed at seeded points ({kills} kills in all: before a request leaves, after the"
    " server ran the tool, after the answer came back, between calls) and restarted with the"
    " same run id until it finishes: first with fresh keys per process (what a plain agent"
    " loop has today), then with orchestrator.Run (keys from the run id and the call's"
    " position, journalled)."
)

_IN_DOUBT_EXPLANATION = (
    "Then the in-doubt payment: a server SIGKILLed right after `pay` charged and before its"
    " record completed, restarted on the same key store, and the payment retried with the same"
    " key: once without reconcile= (the record is UNKNOWN: every retry gets -32012 until an"
    " operator settles it), once with a reconciler that looks the payment up by the record's"
    " key (rule 19)."
)

_IN_DOUBT_ROWS: tuple[tuple[str, str], ...] = (
    ("payments made", "effects"),
    ("duplicate effects", "duplicates"),
    ("UNKNOWN records left", "unknown_left"),
    ("the retry got", "answer"),
)

_PIPELINE_ROWS: tuple[tuple[str, str], ...] = (
    ("pipeline calls", "calls"),
    ("agent processes", "processes"),
    ("SIGKILLs", "kills"),
    ("effects executed", "effects"),
    ("duplicate effects", "duplicate_effects"),
    ("replays served", "replays"),
    ("outcome unknown (reported)", "outcome_unknown"),
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
        " directory, removed at the end; redis://host:port/db works too: the demo writes under"
        " a prefix of its own and deletes what it wrote when it ends, even on Ctrl-C)",
    )
    demo.add_argument("--seed", type=int, default=DEFAULT_SEED, help="default: %(default)s")
    demo.add_argument(
        "--calls", type=int, default=DEFAULT_CALLS, help="logical calls (default: %(default)s)"
    )
    demo.add_argument(
        "--pipelines",
        type=int,
        default=DEFAULT_PIPELINES,
        help="agent pipelines killed and resumed, per mode (0: skip that part;"
        " default: %(default)s)",
    )
    demo.add_argument(
        "--in-doubt",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also kill a server right after a payment, without and with reconcile= (default:"
        " on; two server processes, killed and restarted)",
    )
    demo.add_argument("--json", action="store_true", help="print a machine-readable summary")
    demo.add_argument("--verbose", action="store_true", help="show the library's log output")
    demo.set_defaults(run=run)


def _check_args(args: argparse.Namespace) -> None:
    if not 1 <= args.calls <= MAX_CALLS:
        fail(f"--calls must be between 1 and {MAX_CALLS}, got {args.calls}", EXIT_USAGE)
    if args.seed < 0:
        fail(f"--seed must be >= 0, got {args.seed}", EXIT_USAGE)
    if not 0 <= args.pipelines <= MAX_PIPELINES:
        fail(f"--pipelines must be between 0 and {MAX_PIPELINES}, got {args.pipelines}", EXIT_USAGE)
    if args.store is not None and args.store.startswith("memory:") and args.transport != "memory":
        fail(
            "--store memory:// lives inside one process; the stdio and http servers run in"
            " processes of their own and restart: use a SQLite file or Redis",
            EXIT_USAGE,
        )


def _own_prefix(url: str) -> str:
    """`url` with a prefix of this run's own, so that the demo never touches a key it did not
    write: `mcp-once-demo:<12 hex>:`, or the URL's own `prefix=` followed by `demo-<12 hex>:`."""
    run = uuid.uuid4().hex[:12]
    rest, _, query = url.partition("?")
    kept: list[str] = []
    theirs = None
    for piece in query.split("&") if query else []:
        if unquote_plus(piece.partition("=")[0]) == "prefix":
            theirs = unquote_plus(piece.partition("=")[2])
        else:
            kept.append(piece)
    prefix = f"mcp-once-demo:{run}:" if theirs is None else f"{theirs}demo-{run}:"
    kept.append("prefix=" + quote(prefix, safe=":"))
    return f"{rest}?{'&'.join(kept)}"


async def _demo_store(url: str) -> str:
    """The store URL the demo writes to: `url` once it answers, under a prefix of its own if
    it is a Redis. Exits 3 if it does not answer: then nothing was written."""
    store = open_or_fail(url)
    try:
        problem = await store_problem(store, url)
    finally:
        await store.aclose()
    if problem is not None:
        fail(problem, EXIT_UNREACHABLE)
    from idempotency import RedisKeyStore  # redis-py, loaded by the demo only

    return _own_prefix(url) if isinstance(store, RedisKeyStore) else url


async def _remove_demo_records(url: str) -> int:
    from idempotency import RedisKeyStore

    store = open_or_fail(url)
    assert isinstance(store, RedisKeyStore)
    removed = 0
    try:
        with anyio.CancelScope(shield=True):
            removed = await store.delete_all()
    finally:
        await store.aclose()
    return removed


def _clean_up(url: str, *, json_output: bool) -> int | None:
    """Delete what the demo wrote under its prefix; how many keys, or None if it could not."""
    try:
        removed = anyio.run(_remove_demo_records, url)
    except Exception as exc:  # the store went away: say what is left, and where
        print(
            f"mcp-once: could not remove the demo's records ({exc}); they are the keys under"
            f" the prefix in {redacted(url)!r} and expire on their own (completed ones in 24 h)",
            file=sys.stderr,
        )
        return None
    if not json_output:
        print(f"removed the demo's {removed} record(s) from the store", file=sys.stderr)
    return removed


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


def _side_by_side(
    rows: tuple[tuple[str, str], ...],
    heads: tuple[str, str],
    left: dict[str, Any],
    right: dict[str, Any],
) -> str:
    """Two columns of figures under `heads`, one row per (label, key); both tables of the demo
    share the label width, so they line up."""
    label_width = max(len(label) for label, _ in _ROWS + _PIPELINE_ROWS + _IN_DOUBT_ROWS)
    lines = [f"{'':<{label_width}}  {heads[0]:>12}  {heads[1]:>10}"]
    for label, key in rows:
        lines.append(f"{label:<{label_width}}  {left[key]:>12}  {right[key]:>10}")
    return "\n".join(lines)


def _table(baseline: Report, once: Report) -> str:
    heads = ("naive retry", "mcp-once")
    return _side_by_side(_ROWS, heads, baseline.to_dict(), once.to_dict())


def _pipeline_table(fresh: PipelineTotals, journalled: PipelineTotals) -> str:
    heads = ("fresh keys", "Run")
    return _side_by_side(_PIPELINE_ROWS, heads, fresh.to_dict(), journalled.to_dict())


def _pipeline_verdict(fresh: PipelineTotals, journalled: PipelineTotals) -> str:
    if not journalled.ok:
        return (
            f"FAILED: under Run, {journalled.duplicates} duplicate effect(s) and"
            f" {journalled.missing} missing effect(s). Please report this with the seed."
        )
    return (
        f"fresh keys: {fresh.duplicates} duplicate effect(s), every restart sends the pipeline"
        f" again. Run: none, with {journalled.replays} answer(s) replayed by key; the"
        f" {journalled.outcome_unknown} OutcomeUnknown are notifications (unguarded) a kill"
        " left in doubt or already sent, never sent again."
    )


def _in_doubt_table(plain: InDoubtRun, reconciled: InDoubtRun) -> str:
    heads = ("without", "reconcile=")
    return _side_by_side(_IN_DOUBT_ROWS, heads, _shown(plain), _shown(reconciled))


def _shown(run: InDoubtRun) -> dict[str, Any]:
    answers = {"-32012": "-32012", "reconciled": "the payment"}
    return {**run.to_dict(), "answer": answers.get(run.answer, run.answer)}


def _in_doubt_ok(plain: InDoubtRun, reconciled: InDoubtRun) -> bool:
    return (
        plain.duplicates == reconciled.duplicates == 0
        and reconciled.unknown_left == 0
        and reconciled.answer == "reconciled"
    )


def _in_doubt_verdict(plain: InDoubtRun, reconciled: InDoubtRun) -> str:
    if not _in_doubt_ok(plain, reconciled):
        return (
            f"FAILED: with reconcile= {reconciled.duplicates} duplicate(s),"
            f" {reconciled.unknown_left} UNKNOWN record(s) left, the retry got"
            f" {reconciled.answer}. Please report this."
        )
    return (
        f"without reconcile=: {plain.unknown_left} UNKNOWN record for an operator, the retry got"
        " -32012. With it: the retry got the payment from the system of record, 0 duplicates,"
        " 0 UNKNOWN left."
    )


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
    args: argparse.Namespace,
    store: str,
    baseline: Report,
    once: Report,
    pipelines: tuple[PipelineTotals, PipelineTotals] | None,
    in_doubt: tuple[InDoubtRun, InDoubtRun] | None,
    seconds: float,
) -> dict[str, Any]:
    pipeline: dict[str, Any] | None = None
    if pipelines is not None:
        fresh, journalled = pipelines
        pipeline = {
            "pipelines": journalled.pipelines,
            "seeds": list(range(args.seed, args.seed + args.pipelines)),
            "kills": journalled.kills,
            "duplicate_effects": journalled.duplicates,
            "baseline_duplicate_effects": fresh.duplicates,
            "replays": journalled.replays,
            "ok": journalled.ok,
            "run": journalled.to_dict(),
            "fresh_keys": fresh.to_dict(),
        }
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
        "ok": once.ok
        and (pipeline is None or pipeline["ok"])
        and (in_doubt is None or _in_doubt_ok(*in_doubt)),
        "seconds": round(seconds, 2),
        "mcp_once": once.to_dict(),
        "baseline": baseline.to_dict(),
        "pipeline": pipeline,
        "in_doubt": None
        if in_doubt is None
        else {
            "without_reconcile": in_doubt[0].to_dict(),
            "with_reconcile": in_doubt[1].to_dict(),
            "ok": _in_doubt_ok(*in_doubt),
        },
    }


async def _in_doubt(workdir: Path, store: str) -> tuple[InDoubtRun, InDoubtRun]:
    """The in-doubt payment without and with reconcile=, side by side (both at once)."""
    from mcp_once.scenarios._in_doubt import run_in_doubt

    print("  in-doubt payment: a server killed after paying", file=sys.stderr, flush=True)
    runs: dict[bool, InDoubtRun] = {}
    async with anyio.create_task_group() as tg:

        async def one(reconcile: bool) -> None:
            runs[reconcile] = await run_in_doubt(workdir, store, reconcile=reconcile)

        tg.start_soon(one, False)
        tg.start_soon(one, True)
    return runs[False], runs[True]


async def _run(
    args: argparse.Namespace, workdir: Path
) -> tuple[
    Report,
    Report,
    tuple[PipelineTotals, PipelineTotals] | None,
    tuple[InDoubtRun, InDoubtRun] | None,
    str,
]:
    from mcp_once.scenarios import (
        PIPELINE_AGENT,
        Scenario,
        Zygote,
        default_policy,
        run_pipelines,
        run_scenario,
    )

    store = args.store
    if store is None:
        store = f"sqlite:///{(workdir / 'keys.sqlite3').resolve()}"
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
    pipelines = None
    folder = workdir / "pipeline"
    folder.mkdir()
    async with contextlib.AsyncExitStack() as stack:
        # Entered first: the agents' parent imports in a process of its own meanwhile.
        zygote = (
            await stack.enter_async_context(Zygote(PIPELINE_AGENT, folder))
            if args.pipelines
            else None
        )
        for mode, label in modes:
            live = _Live(label, args.calls, sys.stderr)
            reports.append(await run_scenario(scenario, mode, workdir, progress=live))
        if zygote is not None:
            print(
                f"  pipeline: {args.pipelines} agent pipeline(s) per mode, killed and restarted",
                file=sys.stderr,
                flush=True,
            )
            seeds = range(args.seed, args.seed + args.pipelines)
            pipelines = await run_pipelines(seeds, folder, zygote=zygote)
    in_doubt = None
    if args.in_doubt and not store.startswith("memory:"):  # server processes share the store
        in_doubt = await _in_doubt(workdir, store)
    return reports[0], reports[1], pipelines, in_doubt, store


class _TerminateAsInterrupt:
    """While entered, SIGTERM (a service manager's or `kill`'s polite stop) ends the demo the way
    Ctrl-C does: the event loop winds down and the records the demo wrote to a store of the
    user's are removed. Without it SIGTERM kills the process on the spot and leaves them behind.
    `signalled` tells the two apart afterwards, for the message and the exit status."""

    def __init__(self) -> None:
        self.signalled = False
        self._previous: Any = None

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.signalled = True
        signal.raise_signal(signal.SIGINT)  # asyncio's own Ctrl-C path: cancel, then unwind

    def __enter__(self) -> None:
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGTERM, self._previous)


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    if not args.json:
        where = {"memory": "in-memory streams", "stdio": "stdio", "http": "streamable HTTP"}
        print(_EXPLANATION.format(calls=args.calls, where=where[args.transport]), flush=True)
        print(flush=True)
    if not args.verbose:
        logging.disable(logging.CRITICAL)
    started = time.monotonic()
    given = args.store
    if given is not None:
        args.store = anyio.run(_demo_store, given)
    removed = None
    terminated = _TerminateAsInterrupt()
    try:
        with terminated, tempfile.TemporaryDirectory(prefix="mcp-once-demo-") as tmp:
            baseline, once, pipelines, in_doubt, store = anyio.run(_run, args, Path(tmp))
    except KeyboardInterrupt:
        if terminated.signalled:
            print("\nmcp-once: demo terminated", file=sys.stderr)
            return EXIT_TERMINATED
        print("\nmcp-once: demo interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        logging.disable(logging.NOTSET)
        if args.store != given:  # even after Ctrl-C (KeyboardInterrupt) or a failure
            removed = _clean_up(args.store, json_output=args.json)
    seconds = time.monotonic() - started
    shown_store = redacted(store) if args.store is not None else "a temporary SQLite file"
    summary = _summary(args, shown_store, baseline, once, pipelines, in_doubt, seconds)
    summary["demo_records_removed"] = removed
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print()
        print(_table(baseline, once))
        print()
        print(f"faults (mcp-once run): {_fault_line(once) or 'none'}")
        print(_verdict(baseline, once))
        if pipelines is not None:
            fresh, journalled = pipelines
            print()
            print(
                _PIPELINE_EXPLANATION.format(pipelines=journalled.pipelines, kills=journalled.kills)
            )
            print()
            print(_pipeline_table(fresh, journalled))
            print()
            print(_pipeline_verdict(fresh, journalled))
        if in_doubt is not None:
            print()
            print(_IN_DOUBT_EXPLANATION)
            print()
            print(_in_doubt_table(*in_doubt))
            print()
            print(_in_doubt_verdict(*in_doubt))
        print(f"seed {args.seed}, store: {shown_store}, {seconds:.1f} s")
    return EXIT_OK if summary["ok"] else EXIT_PROBLEM
