"""`mcp-once keys history RECORD` and `mcp-once audit [verify]`: the story of a key, and of all.

A record shows where a key stands; its history (rule 20) shows how it got there: claimed by which
attempt and fence, completed (result size, duration), replayed (a count and the last time), refused
(the code), released (why), its lease ran out, interrupted (its holder gave it up as unknown),
reconciled, settled (by whom, why), purged. The audit stream is the same events across records in
arrival order, each naming its record and tool, for an operator or a SIEM (`--json`: one object a
line). Neither holds an argument, a result or a raw key.

`audit verify` checks every record's hash chain and names the first event that breaks one, so an
edited, dropped or reordered event is found. Records an earlier release wrote have no history: they
read as having none, never as an error.

Both open the store as `keys` does (`--store`, `$MCP_ONCE_STORE`); `keys.py` lends its runner.
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import anyio

from idempotency import (
    AuditedStore,
    AuditEntry,
    HistoryEvent,
    KeyStore,
    export_audit_logs,
    parse_history,
    rfc3339,
    verify_history,
)

from . import _durations
from ._common import EXIT_PROBLEM, EXIT_USAGE, add_store_option, fail, print_table
from ._proxies import add_proxy_option

#: The event kinds, as issue 37 names them (a contract: scripts filter on them).
EVENTS = (
    "claimed",
    "completed",
    "replayed",
    "refused",
    "released",
    "lease ran out",
    "interrupted",
    "reconciled",
    "settled",
    "purged",
)
#: Everything the audit stream holds is read in one go for a listing (it is capped at this).
_READ_ALL = 100_000
#: Seconds between two looks at the stream under --follow.
_FOLLOW_EVERY = 1.0
#: Seconds before the newest entry seen that the next look starts from (besides the last look's
#: own duration): what a cluster's shards' clocks may differ by (`_audit`).
_LATE = 1.0

Action = Callable[[KeyStore, argparse.Namespace], Awaitable[int]]
Runner = Callable[..., Callable[[argparse.Namespace], int]]


def operator() -> str:
    """Who settles, when `--by` is not given: the OS user at this host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def add_settle_arguments(settle: argparse.ArgumentParser) -> None:
    """`keys settle --by --reason`: what the settled event records (rule 20)."""
    settle.add_argument(
        "--by",
        default=None,
        metavar="WHO",
        help="who settles, for the record's history (default: the OS user @ this host)",
    )
    settle.add_argument(
        "--reason", metavar="TEXT", help="why, for the record's history (a ticket, a finding)"
    )


def settled_by(args: argparse.Namespace) -> dict[str, str | None]:
    return {"by": args.by or operator(), "reason": args.reason}


def add_history_parser(
    actions: Any, key_arguments: Callable[[argparse.ArgumentParser], None], run: Runner
) -> argparse.ArgumentParser:
    """`keys history`, registered by `keys` (whose record addressing it shares)."""
    history: argparse.ArgumentParser = actions.add_parser(
        "history",
        help="show a record's history: every decision on it, oldest first",
        description="Show the events of one record: claimed, completed, replayed (a count and"
        " the last time), refused (the code), released (why), lease ran out, interrupted,"
        " reconciled,"
        " settled (by, reason), purged; with fence, attempt and the digest chaining each to"
        " the one before. A record written before histories were kept has none.",
    )
    key_arguments(history)
    history.add_argument("--json", action="store_true", help="machine-readable output")
    history.set_defaults(run=run(_history))
    return history


def add_parser(commands: Any, run: Runner) -> None:
    audit = commands.add_parser(
        "audit",
        help="read the audit stream (every record's events, in arrival order); verify chains",
        description="Print the audit stream: every event of every record in arrival order,"
        " each naming its record (store key) and tool. Nothing in it is an argument, a result"
        " or a raw key.",
    )
    audit.add_argument(
        "--since",
        type=_since,
        metavar="WHEN",
        help="only events this long ago or later (90, 10m, 2h, 3d) or since an RFC 3339 time",
    )
    audit.add_argument("--tool", metavar="NAME", help="only events of this tool")
    audit.add_argument("--event", choices=EVENTS, metavar="KIND", help=", ".join(EVENTS))
    audit.add_argument(
        "--follow", action="store_true", help="keep printing new events as they arrive"
    )
    audit.add_argument("--json", action="store_true", help="one JSON object a line")
    audit.add_argument(
        "--otel",
        action="store_true",
        help="also emit each event as an OpenTelemetry log record, to the logs pipeline the"
        " environment configures (e.g. under opentelemetry-instrument)",
    )
    add_store_option(audit)
    add_proxy_option(audit)
    audit.set_defaults(run=_stopped_quietly(run(_audit)))
    actions = audit.add_subparsers(dest="audit_action", metavar="ACTION")
    verify = actions.add_parser(
        "verify",
        help="check every record's hash chain; name the first broken event",
        description="Check every record's history: each event must carry the digest of the"
        " one before and match its own. Exits 1 naming the first broken event of each broken"
        " chain.",
    )
    add_store_option(verify)
    add_proxy_option(verify)
    verify.set_defaults(run=run(_verify))


#: What a shell shows for a command ended by Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130


def _stopped_quietly(
    command: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """`--follow` runs until Ctrl-C: the normal way to end it, so no traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED

    return run


def _since(text: str) -> float:
    try:
        return time.time() - _durations.duration(text)
    except (argparse.ArgumentTypeError, ValueError):
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration (90, 10m, 2h, 3d) nor an RFC 3339 time"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _audited(store: KeyStore) -> AuditedStore:
    if not isinstance(store, AuditedStore):
        fail(f"{type(store).__name__} keeps no history or audit stream", EXIT_USAGE)
    return store


def _details(details: dict[str, str]) -> str:
    return " ".join(f"{name}={value}" for name, value in details.items()) or "-"


def _at(seconds: float) -> str:
    return rfc3339(seconds)


async def _history(store: KeyStore, args: argparse.Namespace) -> int:
    text = await _audited(store).history(args.key)
    events = parse_history(text)
    if args.json:
        json.dump([event.as_json() for event in events], sys.stdout, indent=2)
        print()
    elif events:
        print_table(
            ("AT", "EVENT", "FENCE", "ATTEMPT", "DETAILS", "DIGEST"),
            [_history_row(event) for event in events],
        )
    if not events:
        print(
            f"mcp-once: record {args.key} has no history (written before histories were kept,"
            " or gone longer than its grace)",
            file=sys.stderr,
        )
    return 0


def _history_row(event: HistoryEvent) -> list[str]:
    return [
        _at(event.at),
        event.kind,
        str(event.fence),
        str(event.attempt),
        _details(event.details),
        event.digest,
    ]


def _wanted(found: AuditEntry, args: argparse.Namespace) -> bool:
    if args.tool is not None and found.tool != args.tool:
        return False
    return args.event is None or found.event.kind == args.event


async def _audit(store: KeyStore, args: argparse.Namespace) -> int:
    """List the stream, or under `--follow` keep looking at it: each look reads from a little
    before the newest entry seen (`_LATE`, plus how long the look took) and prints the entries
    whose ids it has not printed yet. Entries are placed by when they were written
    (`HistoryEvent.written`: a replay's update arrives when it happens, not at its first time).
    Why the margin: on a Redis Cluster the stream is every history merged, read one history
    after another, so an event written during a look may be missed by it and still be older
    than the newest it read."""
    audited = _audited(store)
    since: float | None = args.since
    seen: set[str] = set()
    first = True
    while True:
        started = time.monotonic()
        found = await audited.audit(since=since, limit=_READ_ALL)
        took = time.monotonic() - started
        shown = [entry for entry in found if entry.id not in seen and _wanted(entry, args)]
        _print_entries(shown, args, header=first)
        if args.otel:
            export_audit_logs(shown)
        first = False
        if not args.follow:
            return 0
        if found:
            newest = max(entry.event.written for entry in found)
            start = newest - (took + _LATE)
            since = start if since is None else max(since, start)
            seen = {entry.id for entry in found if entry.event.written >= since}
        sys.stdout.flush()
        await anyio.sleep(_FOLLOW_EVERY)


def _print_entries(entries: list[AuditEntry], args: argparse.Namespace, *, header: bool) -> None:
    if args.json:
        for found in entries:
            print(json.dumps(found.as_json()))
        return
    rows = [
        [
            _at(found.event.at),
            found.key,
            found.tool or "-",
            found.event.kind,
            str(found.event.fence),
            str(found.event.attempt),
            _details(found.event.details),
        ]
        for found in entries
    ]
    if header and not rows and not args.follow:
        print("mcp-once: no events", file=sys.stderr)
        return
    if header or rows:
        columns = ("AT", "RECORD", "TOOL", "EVENT", "FENCE", "ATTEMPT", "DETAILS")
        if header:
            print_table(columns, rows)
        else:
            _print_rows(rows)


def _print_rows(rows: list[list[str]]) -> None:
    for row in rows:
        print("  ".join(row))


async def _verify(store: KeyStore, args: argparse.Namespace) -> int:
    del args
    histories = await _audited(store).histories()
    broken = 0
    events = 0
    for key, text in histories:
        problem = verify_history(text)
        if problem is not None:
            broken += 1
            print(f"mcp-once: record {key}: {problem}", file=sys.stderr)
        else:
            events += len(parse_history(text))
    if broken:
        print(f"{broken} of {len(histories)} histories are broken", file=sys.stderr)
        return EXIT_PROBLEM
    print(f"verified {len(histories)} histories ({events} events): every chain holds")
    return 0
