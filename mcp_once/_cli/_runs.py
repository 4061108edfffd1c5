"""`mcp-once runs`: see and forget the runs an agent's `orchestrator.Run` journalled, for the
operator who must tell a run waiting for its restart from one that is done, or clear old ones.

Same conventions as `mcp-once keys`: a table (or `--json`), exit 0 ok, 1 the command ran and
found a problem (no such run, a purge refused), 2 bad usage or a bad journal URL, 3 the journal
cannot be reached. Every usage error is found before the journal is touched.

Nothing is created by looking: an SQLite journal file that does not exist is an error (exit 3),
not an empty journal made on the spot, so a mistyped path never reads as "no runs" and leaves no
stray file behind. The calls' keys are never printed, only their store keys (the SHA-256 digest
`mcp-once keys show` takes): a key is what makes a server replay a stored result to whoever
sends it, and an operator's terminal is no place for it.

Purging is guarded like `keys settle --failed`: a run a live lease holds, or an unfinished run
with dangling intents (calls whose outcome the run never learnt), is refused unless `--force`.
Forgetting those intents would let a restart send their unguarded calls again.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn

import anyio

from idempotency import CallScope, default_scope, rfc3339, store_key

from ._common import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    fail,
    from_environment,
    print_table,
    redacted,
    require_file,
)

if TYPE_CHECKING:
    from orchestrator import Entry, Journal, RunSummary

#: What `Run` opens when given no journal (`orchestrator.default_journal_path`): the SQLite file
#: under `.mcp-once/` of the working directory, named as a URL so the option, its help and the
#: messages all say the same thing (a test checks it is the file `Run` writes).
DEFAULT_JOURNAL_URL = "sqlite:///.mcp-once/journal.db"
#: The environment variable `--journal` defaults to, as `$MCP_ONCE_STORE` is `--store`'s.
JOURNAL_VARIABLE = "MCP_ONCE_JOURNAL"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def add_parser(commands: Any) -> None:
    runs = commands.add_parser(
        "runs",
        help="list, show and purge the runs a Run journalled",
        description="See and forget the runs an agent's orchestrator.Run journalled: tell a run"
        " waiting for its restart from one that is done, and clear old ones.",
    )
    actions = runs.add_subparsers(dest="action", required=True, metavar="ACTION")

    listing = actions.add_parser(
        "list",
        help="list runs: state, calls, dangling intents, age",
        description="List the journalled runs: their state, calls, dangling"
        " intents (calls whose outcome the run never learnt), whether a live lease holds them,"
        " and their age.",
    )
    listing.add_argument("--state", choices=["running", "finished"], help="only runs in this state")
    listing.add_argument(
        "--limit", type=int, default=100, help="list at most N runs (default: %(default)s)"
    )
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(run=_run(_list, _check_limit))

    show = actions.add_parser(
        "show",
        help="show one run, position by position",
        description="Show one run, position by position: each call's tool, state and store key"
        " (what `mcp-once keys show` takes; the call's own key is never printed).",
    )
    show.add_argument("run_id", metavar="RUN", help="the run id, as `runs list` prints it")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(run=_run(_show))

    purge = actions.add_parser(
        "purge",
        help="forget one run, or finished runs",
        description="Forget one run (RUN), or the finished runs (--finished, optionally only"
        " those finished more than --older-than ago). A run a live lease holds, or an"
        " unfinished run with dangling intents, is refused unless --force.",
    )
    purge.add_argument("run_id", metavar="RUN", nargs="?", help="the run to forget")
    purge.add_argument("--finished", action="store_true", help="forget finished runs")
    purge.add_argument(
        "--older-than",
        metavar="AGE",
        help="with --finished: only runs finished more than AGE ago (seconds, or 30m, 12h, 7d)",
    )
    purge.add_argument(
        "--force",
        action="store_true",
        help="with RUN: forget it even if a live lease holds it or it has dangling intents"
        " (only once its agent is known dead and those calls are reconciled)",
    )
    purge.add_argument("--json", action="store_true", help="machine-readable output")
    purge.set_defaults(run=_run(_purge, _check_purge))

    for parser in (listing, show, purge):
        parser.add_argument(
            "--journal",
            default=from_environment(JOURNAL_VARIABLE, DEFAULT_JOURNAL_URL),
            help="journal URL: sqlite:///path.db, redis://host:port/db, rediss://…, unix://…,"
            " redis+cluster://host:port[,host:port...] or"
            " redis+sentinel://host:port[,host:port...]/service_name[/db]"
            f" (default: ${JOURNAL_VARIABLE} if set, else {DEFAULT_JOURNAL_URL}, where Run keeps"
            " it)",
        )


def _run(
    action: Callable[[Journal, argparse.Namespace], Awaitable[int]],
    prepare: Callable[[argparse.Namespace], None] | None = None,
) -> Callable[[argparse.Namespace], int]:
    """Check the arguments, open the journal, run `action`, close it, and turn journal failures
    into exit codes (as `keys` does for its store)."""

    def run(args: argparse.Namespace) -> int:
        # The client library loads the MCP SDK: imported by these commands, not by `--help`.
        from orchestrator import JournalUnavailable

        if prepare is not None:
            prepare(args)
        journal = _open_or_fail(args.journal)

        async def go() -> int:
            try:
                return await action(journal, args)
            finally:
                with anyio.CancelScope(shield=True):
                    await journal.aclose()

        try:
            return anyio.run(go)
        except JournalUnavailable as exc:
            _unreachable(args.journal, exc)

    return run


def _unreachable(url: str, exc: Exception) -> NoReturn:
    fail(f"the journal at {redacted(url)!r} cannot be reached: {exc}", EXIT_UNREACHABLE)


def _open_or_fail(url: str) -> Journal:
    """The journal at `url`, or an exit saying what is wrong with the URL; an SQLite file that
    does not exist is not created (see the module's docstring)."""
    from orchestrator import SQLiteJournal, open_journal

    try:
        journal = open_journal(url)  # opens nothing yet: SQLite connects on first use
    except (ValueError, TypeError) as exc:
        fail(f"bad journal URL: {str(exc).replace(url, redacted(url))}", EXIT_USAGE)
    if isinstance(journal, SQLiteJournal):
        require_file("journal", url, journal.path, made_by="an agent's orchestrator.Run")
    return journal


def _when(timestamp: float | None) -> str | None:
    return None if timestamp is None else rfc3339(timestamp)


def _age(seconds: float) -> str:
    """A run's age for the table: whole seconds, minutes, hours or days."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _describe(run: RunSummary, now: float) -> dict[str, Any]:
    """One run for an operator: `held` says whether a live lease holds it (an agent is running
    it, or died less than a lease ago), `dangling` how many calls never had an answer recorded."""
    return {
        "runId": run.run_id,
        "state": run.state,
        "calls": run.calls,
        "dangling": run.dangling,
        "held": run.held(now),
        "holder": run.holder,
        "fence": run.fence,
        "ageSeconds": round(run.age(now), 3),
        "createdAt": _when(run.created_at),
        "updatedAt": _when(run.updated_at),
        "finishedAt": _when(run.finished_at),
        "leaseDeadline": _when(run.lease_deadline),
    }


def _position(entry: Entry) -> dict[str, Any]:
    """One position. `storeKey` is the name the server's record of this call has under the
    default scope (no authenticated principal): what `mcp-once keys show` takes."""
    scope = default_scope(
        CallScope(server=entry.server, tool=entry.tool, principal=None, meta=None, request=None)
    )
    return {
        "position": entry.position,
        "server": entry.server,
        "tool": entry.tool,
        "state": entry.state,
        "storeKey": store_key(scope, entry.tool, entry.key),
        "fingerprint": entry.fingerprint,
        "at": _when(entry.at),
    }


_COLUMNS = ("runId", "state", "calls", "dangling", "held", "age", "updatedAt")
_POSITION_COLUMNS = ("position", "tool", "state", "storeKey", "server", "at")


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _print_rows(columns: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    print_table(columns, [[_cell(row[c]) for c in columns] for row in rows])


def _check_limit(args: argparse.Namespace) -> None:
    if args.limit < 1:
        fail("--limit must be at least 1", EXIT_USAGE)


async def _list(journal: Journal, args: argparse.Namespace) -> int:
    now = time.time()
    runs = [run for run in await journal.runs() if args.state in (None, run.state)]
    rows = [_describe(run, now) for run in runs[: args.limit]]
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return EXIT_OK
    for row in rows:
        row["age"] = _age(row["ageSeconds"])
    _print_rows(_COLUMNS, rows)
    print(f"({len(rows)} run{'s' if len(rows) != 1 else ''})")
    return EXIT_OK


async def _show(journal: Journal, args: argparse.Namespace) -> int:
    run = await journal.run(args.run_id)
    if run is None:
        print(f"mcp-once: no run {args.run_id!r} in the journal", file=sys.stderr)
        return EXIT_PROBLEM
    described = _describe(run, time.time())
    positions = [_position(entry) for entry in await journal.entries(args.run_id)]
    if args.json:
        json.dump({**described, "positions": positions}, sys.stdout, indent=2)
        print()
        return EXIT_OK
    for name, value in described.items():
        print(f"{name}: {_cell(value)}")
    print()
    _print_rows(_POSITION_COLUMNS, positions)
    print(f"({len(positions)} position{'s' if len(positions) != 1 else ''})")
    return EXIT_OK


def _duration(text: str) -> float:
    found = _DURATION.fullmatch(text.strip())
    if found is None:
        fail(
            f"--older-than: {text!r} is not an age (seconds, or a number with s, m, h or d)",
            EXIT_USAGE,
        )
    seconds = float(found.group(1)) * _UNITS[found.group(2)]
    if not math.isfinite(seconds):
        fail(f"--older-than: {text!r} is too large", EXIT_USAGE)
    return seconds


def _check_purge(args: argparse.Namespace) -> None:
    if (args.run_id is None) == (not args.finished):
        fail("give a RUN to purge, or --finished, not both", EXIT_USAGE)
    if args.older_than is not None and not args.finished:
        fail("--older-than goes with --finished", EXIT_USAGE)
    if args.force and args.finished:
        fail("--force purges one named RUN only, never a batch", EXIT_USAGE)
    args.older_than = None if args.older_than is None else _duration(args.older_than)


def _refusal(run: RunSummary, now: float) -> str | None:
    """Why `run` is not purged without --force, or None."""
    if run.held(now):
        left = (run.lease_deadline or now) - now
        return (
            f"run {run.run_id!r} is held by {run.holder!r} (its lease runs {left:.0f}s more):"
            " its agent may be running it. Nothing purged; --force purges it anyway, once that"
            " agent is known dead"
        )
    if run.state != "finished" and run.dangling:
        return (
            f"run {run.run_id!r} is unfinished with {run.dangling} dangling intent(s): a restart"
            " resumes them under their keys, and once they are forgotten it would send their"
            " unguarded calls again. Nothing purged; --force purges it anyway, once those calls"
            " are reconciled"
        )
    return None


async def _purge(journal: Journal, args: argparse.Namespace) -> int:
    from orchestrator import RunBusy

    now = time.time()
    if args.run_id is not None:
        targets = [run] if (run := await journal.run(args.run_id)) is not None else []
        if not targets:
            print(f"mcp-once: no run {args.run_id!r} in the journal", file=sys.stderr)
            return EXIT_PROBLEM
    else:
        cutoff = now - (args.older_than or 0.0)
        targets = [
            run
            for run in await journal.runs()
            if run.state == "finished" and (run.finished_at or now) <= cutoff
        ]
    purged: list[str] = []
    refused: dict[str, str] = {}
    for run in targets:
        why = None if args.force else _refusal(run, now)
        if why is None:
            try:
                # Without --force the journal checks the lease again, atomically: a run taken
                # since it was read is refused, never pulled from under its new holder.
                if await journal.purge(run.run_id, force=args.force):
                    purged.append(run.run_id)
                continue
            except RunBusy as busy:
                why = f"{busy}; nothing purged"
        refused[run.run_id] = why
    if args.json:
        json.dump({"purged": purged, "refused": refused}, sys.stdout, indent=2)
        print()
    else:
        print(f"purged {len(purged)} run{'s' if len(purged) != 1 else ''}")
    for why in refused.values():
        print(f"mcp-once: {why}", file=sys.stderr)
    return EXIT_PROBLEM if refused else EXIT_OK


__all__ = ["DEFAULT_JOURNAL_URL", "add_parser"]
