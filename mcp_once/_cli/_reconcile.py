"""`mcp-once keys reconcile --app MODULE:ATTR`: put the in-doubt records to their reconcilers.

The records a killed worker left UNKNOWN (or IN_PROGRESS under a lease that ran out) wait for a
client's retry to be reconciled (rule 19). This asks without one: it imports the server object
(`MODULE:ATTR`, as uvicorn names an app; the working directory is importable, as for uvicorn),
finds each record's tool among its guarded tools, asks that tool's `reconcile=`, and writes the
verdict in the same fenced transition a retry would (`idempotency.reconcile_unknown`). With
`--dry-run` it asks and prints what each record would become, writing nothing.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from idempotency import KeyStore, Reconciliation, reconcile_unknown

from ._common import EXIT_PROBLEM, EXIT_USAGE, add_store_option, fail
from ._proxies import add_proxy_option

#: What each answer makes of a record, as the output says it (after "would be" when dry).
_BECOMES = {
    "happened": "completed: the client's retry replays the reconciler's value",
    "not_happened": "released: the client's retry runs the tool",
    "unknown": "UNKNOWN still: the reconciler could not tell",
    "lost": "unchanged: it was resolved meanwhile, elsewhere",
    "no_reconciler": "UNKNOWN still: its tool has no reconciler in this app",
}


def add_parser(actions: Any, run: Any) -> None:
    """`keys reconcile`, with `run` the keys command's store handling (`_keys._run`)."""
    reconcile = actions.add_parser(
        "reconcile",
        help="ask the tools' reconcilers about UNKNOWN records, and apply their verdicts",
        description="For every UNKNOWN record (or only --tool's), ask the reconciler its tool"
        " was given (reconcile=) in the server object --app names, and apply the verdict:"
        " happened completes the record, not happened releases it so the client's retry runs"
        " the tool, unknown leaves it. --dry-run only prints what each would become.",
        epilog="When to write a reconciler, and what it must never do: docs/reconcile.md.",
    )
    reconcile.add_argument(
        "--app",
        required=True,
        metavar="MODULE:ATTR",
        help="the guarded server object, as uvicorn names an app (server:mcp, pkg.app:server)",
    )
    reconcile.add_argument("--tool", metavar="NAME", help="only records of this tool")
    reconcile.add_argument(
        "--dry-run",
        action="store_true",
        help="ask, print what each record would become, write nothing",
    )
    reconcile.add_argument("--json", action="store_true", help="machine-readable output")
    reconcile.set_defaults(run=run(_reconcile, _check_app))
    add_store_option(reconcile)
    add_proxy_option(reconcile)


def load_app(spec: str) -> object:
    """The object `MODULE:ATTR` names (ATTR may be dotted), importing from the working
    directory first, as uvicorn does."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        fail(f"--app {spec!r}: give MODULE:ATTR, e.g. server:mcp", EXIT_USAGE)
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        found: object = importlib.import_module(module_name)
    except ImportError as exc:
        fail(f"--app {spec!r}: cannot import {module_name!r}: {exc}", EXIT_USAGE)
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            fail(f"--app {spec!r}: {module_name!r} has no attribute {attr!r}", EXIT_USAGE)
    return found


def _check_app(args: argparse.Namespace) -> None:
    args.app_object = load_app(args.app)


async def _reconcile(store: KeyStore, args: argparse.Namespace) -> int:
    try:
        done = await reconcile_unknown(args.app_object, store, tool=args.tool, dry_run=args.dry_run)
    except TypeError as exc:
        fail(f"--app {args.app!r}: {exc}", EXIT_USAGE)
    _print(done, dry=args.dry_run, as_json=args.json)
    left = [d for d in done if d.answer in ("unknown", "no_reconciler")]
    return EXIT_PROBLEM if left and not args.dry_run else 0


def _print(done: list[Reconciliation], *, dry: bool, as_json: bool) -> None:
    if as_json:
        rows = [
            {"record": d.record, "tool": d.tool, "answer": d.answer, "applied": d.applied}
            for d in done
        ]
        print(json.dumps({"dryRun": dry, "records": rows}, indent=2))
        return
    if not done:
        print("no UNKNOWN records")
        return
    would = "would be " if dry else ""
    for d in done:
        print(f"{d.record}  {d.tool or '-'}  {d.answer} -> {would}{_BECOMES[d.answer]}")
