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
from collections import Counter
from typing import TYPE_CHECKING, Any

from idempotency import KeyStore

from . import _audit
from ._common import EXIT_PROBLEM, EXIT_USAGE, add_store_option, fail, server_cell
from ._proxies import add_proxy_option

#: The answer of a record another server's history names: left alone, counted, not listed.
_OTHER_SERVER = "other_server"

if TYPE_CHECKING:
    from idempotency import Reconciliation

#: What each answer makes of a record, as the output says it (after "would be" when dry).
_BECOMES = {
    "happened": "completed: the client's retry replays the reconciler's value",
    "not_happened": "released: the client's retry runs the tool",
    "unknown": "UNKNOWN still: the reconciler could not tell",
    "lost": "unchanged: it was resolved meanwhile, elsewhere",
    "no_reconciler": "UNKNOWN still: its tool has no reconciler in this app",
    "server_unknown": "UNKNOWN still, not asked: its history names no server (a store keeping"
    " no history, or claimed before histories named servers); check the system of record, then"
    " `mcp-once keys settle` it",
}


def add_parser(actions: Any, run: Any) -> None:
    """`keys reconcile`, with `run` the keys command's store handling (`_keys._run`)."""
    reconcile = actions.add_parser(
        "reconcile",
        help="ask the tools' reconcilers about UNKNOWN records, and apply their verdicts",
        description="For every UNKNOWN record of the server --app names (or only --tool's),"
        " ask the reconciler its tool was given (reconcile=) in that server object, and apply"
        " the verdict: happened completes the record, not happened releases it so the client's"
        " retry runs the tool, unknown leaves it. Only records whose history names that server"
        " are asked about: other servers' records in the same store are left alone, and one"
        " whose server cannot be read is listed, not asked. --dry-run asks and prints what each"
        " would become, with its server, writing nothing.",
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
        "--server",
        metavar="NAME",
        help="the server whose records are meant, MCPServer(name) or FastMCP(name): refused"
        " unless it is the name of --app's server (records of other servers are never asked"
        " about)",
    )
    reconcile.add_argument(
        "--dry-run",
        action="store_true",
        help="ask, print what each record would become, write nothing",
    )
    reconcile.add_argument("--json", action="store_true", help="machine-readable output")
    _audit.add_operator_arguments(reconcile, "asks")
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
    except Exception as exc:  # the app's own code failed while building the server object
        fail(f"--app {spec!r}: importing {module_name!r} failed: {exc}", EXIT_USAGE)
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            fail(f"--app {spec!r}: {module_name!r} has no attribute {attr!r}", EXIT_USAGE)
    return found


def _check_app(args: argparse.Namespace) -> None:
    args.app_object = load_app(args.app)


async def _reconcile(store: KeyStore, args: argparse.Namespace) -> int:
    from idempotency import reconcile_unknown  # the guard: loads the SDK, as the app did

    named = _audit.settled_by(args)
    try:
        done = await reconcile_unknown(
            args.app_object,
            store,
            tool=args.tool,
            server=args.server,
            dry_run=args.dry_run,
            by=named["by"],
            reason=named["reason"],
        )
    except TypeError as exc:
        fail(f"--app {args.app!r}: {exc}", EXIT_USAGE)
    except ValueError as exc:
        fail(f"--server {args.server!r}: {exc}", EXIT_USAGE)
    mine = [d for d in done if d.answer != _OTHER_SERVER]
    others = Counter(d.server or "-" for d in done if d.answer == _OTHER_SERVER)
    _print(mine, others, dry=args.dry_run, as_json=args.json)
    left = [d for d in mine if d.answer in ("unknown", "no_reconciler", "server_unknown")]
    return EXIT_PROBLEM if left and not args.dry_run else 0


def _print(done: list[Reconciliation], others: Counter[str], *, dry: bool, as_json: bool) -> None:
    if as_json:
        rows = [
            {
                "record": d.record,
                "tool": d.tool,
                "server": d.server,
                "answer": d.answer,
                "applied": d.applied,
            }
            for d in done
        ]
        print(json.dumps({"dryRun": dry, "records": rows, "otherServers": others}, indent=2))
        return
    if not done:
        print("no UNKNOWN records")
    would = "would be " if dry else ""
    for d in done:
        print(
            f"{d.record}  {server_cell(d.server)}  {d.tool or '-'}  {d.answer} ->"
            f" {would}{_BECOMES[d.answer]}"
        )
    if others:
        counted = ", ".join(f"{count} of {name}" for name, count in sorted(others.items()))
        print(f"left alone: in-doubt records of other servers ({counted}): not this app's")
