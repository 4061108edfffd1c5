"""`mcp-once keys history RECORD` and `mcp-once audit [verify]`: the story of a key, and of all.

A record shows where a key stands; its history (rule 20) shows how it got there: claimed by which
attempt and fence, completed (result size, duration), replayed (a count and the last time), refused
(the code), released (why), its lease ran out, interrupted (its holder gave it up as unknown),
reconciled (the answer; by whom and why, from `keys reconcile`), settled (by whom, why), purged. The
audit stream is the same events across records in arrival order, each naming its record, tool and
server (as the record's history names it: `--server` keeps one server's), for an operator or a
SIEM (`--json`: one object a line). Neither holds an argument, a result or a raw key.

`audit verify` checks every record's chain and names the first event that breaks one; with the
audit key (the store's `audit_key=`, `$MCP_ONCE_AUDIT_KEY`) it checks the MACs and seals too, and
with the audit stream it names histories gone while their record is stored or that lack the
stream's newest event
(`idempotency.check_history`, `compare_audit_stream` say what each proves). `keys history` warns
when the history it prints does not verify. Records an earlier release wrote have no history: they
read as having none, never as an error; a key with neither a record nor a history is one (exit 1).
Each of these only reads, so none takes an empty answer from a store that holds nothing of
mcp-once's for an all-clear (`_common.reading`).

Both open the store as `keys` does (`--store`, `$MCP_ONCE_STORE`); `keys.py` lends its runner.
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import anyio

from idempotency import (
    AuditedStore,
    AuditEntry,
    AuditKey,
    CorruptRecord,
    HistoryEvent,
    KeyStore,
    check_history,
    compare_audit_stream,
    parse_history,
    record_servers,
    rfc3339,
)

from . import _addressing, _durations
from ._common import (
    EXIT_PROBLEM,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    add_store_option,
    fail,
    nothing_here,
    print_table,
    reading,
    redacted,
    server_cell,
)
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

Runner = Callable[..., Callable[[argparse.Namespace], int]]


def operator() -> str:
    """Who settles, when `--by` is not given: the OS user at this host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def add_operator_arguments(parser: argparse.ArgumentParser, does: str) -> None:
    """`--by --reason` of the commands that decide on a record (`keys settle`, `keys
    reconcile`): who `does` it and why, for the settled or reconciled event (rule 20)."""
    parser.add_argument(
        "--by",
        default=None,
        metavar="WHO",
        help=f"who {does}, for the record's history (default: the OS user @ this host)",
    )
    parser.add_argument(
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
        " the one before (with the audit key, a MAC). A history that does not verify is shown"
        " with a warning on stderr (--json: `verified` on each event). A record written before"
        " histories were kept has none.",
    )
    key_arguments(history)
    history.add_argument("--json", action="store_true", help="machine-readable output")
    history.set_defaults(run=run(reading(_history)))
    return history


def add_parser(commands: Any, run: Runner) -> None:
    audit = commands.add_parser(
        "audit",
        help="read the audit stream (every record's events, in arrival order); verify chains",
        description="Print the audit stream: every event of every record in arrival order,"
        " each naming its record (store key), tool and server (as the record's history names"
        " it). Nothing in it is an argument, a result or a raw key.",
    )
    audit.add_argument(
        "--since",
        type=_since,
        metavar="WHEN",
        help="only events this long ago or later (90, 10m, 2h, 3d) or since an RFC 3339 time",
    )
    audit.add_argument("--tool", metavar="NAME", help="only events of this tool")
    audit.add_argument(
        "--server",
        metavar="NAME",
        help="only events of this server's records, as their history names it",
    )
    audit.add_argument(
        "--event",
        type=_event_kind,
        choices=EVENTS,
        metavar="KIND",
        help=", ".join(EVENTS) + " (or in snake_case: lease_ran_out)",
    )
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
        help="check every record's history chain (and seal, with the audit key); name each break",
        description="Check every record's history: each event must carry the digest of the"
        " one before and match its own; with the audit key (audit_key= in the store URL,"
        " $MCP_ONCE_AUDIT_KEY) each link is a MAC and the seal must name the history's count"
        " and newest event. With the audit stream, a history gone while its record is stored,"
        " or missing the newest event the stream holds for it, is named too. Exits 1 naming"
        " each problem;"
        " 2 when histories are sealed with an audit key and none was given.",
    )
    verify.add_argument(
        "--allow-unsealed",
        action="store_true",
        help="with the audit key, list histories written without it (before it was configured)"
        " without failing: for the days after the key is first configured",
    )
    add_store_option(verify)
    add_proxy_option(verify)
    verify.set_defaults(run=run(reading(_verify)))


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


def _event_kind(text: str) -> str:
    """An event kind as `EVENTS` spells it, from that spelling or snake_case (`lease_ran_out`,
    what a script or a shell without quotes writes)."""
    return text.replace("_", " ")


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


def _audit_key(store: KeyStore) -> AuditKey | None:
    """The audit key the store was opened with (a store of one's own may have none)."""
    key = getattr(store, "audit_key", None)
    return key if isinstance(key, AuditKey) else None


async def _history(store: KeyStore, args: argparse.Namespace) -> int:
    """Exit 1 when there is neither a record nor a history for the key: a wrong key, or a
    wrong --client-key/--tool/--server, is not a record "written before histories were kept"."""
    problem = await _addressing.addressed(store, args)
    if problem is not None:
        return problem
    text = await _audited(store).history(args.key)
    found = check_history(text, record=args.key, key=_audit_key(store))
    if not found.verified and found.problem is not None:  # not even readable
        fail(f"record {args.key}'s history {found.problem}", EXIT_PROBLEM)
    events = parse_history(text)
    if not events and await store.get(args.key) is None:
        if args.client_key is not None:
            return await _addressing.absent(store, args)  # and which servers hold one
        print(
            f"mcp-once: no record {args.key} in the key store at {redacted(args.store)!r}, and"
            " no history of one: check the key (or --client-key, --tool and --server); a record"
            " gone takes its history with it",
            file=sys.stderr,
        )
        return EXIT_PROBLEM
    if found.problem is not None:
        warning = "WARNING: " if found.status != "unchecked" else ""
        print(
            f"mcp-once: {warning}record {args.key}'s history does not verify: {found.problem}",
            file=sys.stderr,
        )
    if args.json:
        rows = [
            {**event.as_json(), "verified": verified}
            for event, verified in zip(events, found.verified, strict=True)
        ]
        json.dump(rows, sys.stdout, indent=2)
        print()
    elif events:
        print_table(
            ("AT", "EVENT", "FENCE", "ATTEMPT", "DETAILS", "DIGEST"),
            [_history_row(event) for event in events],
        )
    if not events:
        print(
            f"mcp-once: record {args.key} has no history (written before histories were kept)",
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


def _wanted(found: AuditEntry, server: str | None, args: argparse.Namespace) -> bool:
    if args.tool is not None and found.tool != args.tool:
        return False
    if args.server is not None and args.server not in (server or "").split(", "):
        return False
    return args.event is None or found.event.kind == args.event


class _Servers:
    """The server of each record an audit entry names, read from its history once per record
    (a claimed event of its own names it too, should the history be gone)."""

    def __init__(self, store: KeyStore) -> None:
        self._store = store
        self._known: dict[str, str | None] = {}

    async def of(self, found: AuditEntry) -> str | None:
        if found.key not in self._known:
            named = await record_servers(self._store, found.key)
            self._known[found.key] = ", ".join(named) or found.event.details.get("server")
        return self._known[found.key]


async def _audit(store: KeyStore, args: argparse.Namespace) -> int:
    """List the stream, or under `--follow` keep looking at it: each look reads from a little
    before the newest entry seen (`_LATE`, plus how long the look took) and prints the entries
    whose ids it has not printed yet. Entries are placed by when they were written
    (`HistoryEvent.written`: a replay's update arrives when it happens, not at its first time).
    Why the margin: on a Redis Cluster the stream is every history merged, read one history
    after another, so an event written during a look may be missed by it and still be older
    than the newest it read.

    On a store that holds nothing of mcp-once's, a listing exits 3 (`reading`); a follower says
    so and follows all the same: it may have been started beside a server yet to write."""
    audited = _audited(store)
    problem = await nothing_here(store, args.store)
    if problem is not None:
        print(f"mcp-once: {problem}", file=sys.stderr)
        if not args.follow:
            return EXIT_UNREACHABLE
    servers = _Servers(store)
    since: float | None = args.since
    seen: set[str] = set()
    first = True
    while True:
        started = time.monotonic()
        found = await audited.audit(since=since, limit=_READ_ALL)
        took = time.monotonic() - started
        fresh = [(entry, await servers.of(entry)) for entry in found if entry.id not in seen]
        shown = [(entry, server) for entry, server in fresh if _wanted(entry, server, args)]
        _print_entries(shown, args, header=first)
        if args.otel:
            from idempotency import export_audit_logs  # OpenTelemetry: loaded only for --otel

            export_audit_logs(
                [entry for entry, _ in shown], servers={e.key: server for e, server in shown}
            )
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


def _print_entries(
    entries: list[tuple[AuditEntry, str | None]], args: argparse.Namespace, *, header: bool
) -> None:
    if args.json:
        for found, server in entries:
            print(json.dumps({**found.as_json(), "server": server}))
        return
    rows = [
        [
            _at(found.event.at),
            found.key,
            found.tool or "-",
            found.event.kind,
            str(found.event.fence),
            str(found.event.attempt),
            server_cell(server),
            _details(found.event.details),
        ]
        for found, server in entries
    ]
    if header and not rows and not args.follow:
        print("mcp-once: no events", file=sys.stderr)
        return
    if header or rows:
        columns = ("AT", "RECORD", "TOOL", "EVENT", "FENCE", "ATTEMPT", "SERVER", "DETAILS")
        if header:
            print_table(columns, rows)
        else:
            _print_rows(rows)


def _print_rows(rows: list[list[str]]) -> None:
    for row in rows:
        print("  ".join(row))


async def _stored(store: KeyStore, key: str) -> bool:
    """Whether a record is stored under `key` (an unreadable one is)."""
    try:
        return await store.get(key) is not None
    except CorruptRecord:
        return True


async def _verify(store: KeyStore, args: argparse.Namespace) -> int:
    """Check every history, then compare the audit stream with them. The stream is read first
    (`compare_audit_stream`): an event written between the two reads is then in a history and
    not yet in the stream, never the other way round.

    The histories are read as the store streams them (`iter_histories`), a batch at a time, and
    only counts are kept, besides the histories of the records the stream names (it is capped,
    `AUDIT_MAX_ENTRIES`) and the broken ones' keys: memory stays flat however many the store
    keeps."""
    audited = _audited(store)
    key = _audit_key(store)
    stream = await audited.audit(limit=_READ_ALL)
    named = {entry.key for entry in stream}
    streamed: dict[str, str] = {}  # the histories of the records the stream names
    statuses: Counter[str] = Counter()
    broken_records: set[str] = set()
    histories = events = 0
    async for record, text in audited.iter_histories():
        checked = check_history(text, record=record, key=key)
        histories += 1
        events += len(checked.verified)
        statuses[checked.status] += 1
        if checked.status == "broken":
            broken_records.add(record)
        if checked.problem is not None:
            print(f"mcp-once: record {record}: {checked.problem}", file=sys.stderr)
        if record in named:
            streamed[record] = text
    # A history gone with its record is as it should be (rule 24); one gone while its record
    # is stored was deleted. Only the records the stream names without a history are read.
    stored = {k for k in named - streamed.keys() if await _stored(store, k)}
    # A broken history is named once, by its check.
    stream_problems = [
        (record, problem)
        for record, problem in compare_audit_stream(stream, streamed, stored=stored)
        if record not in broken_records
    ]
    for record, problem in stream_problems:
        print(f"mcp-once: record {record}: {problem}", file=sys.stderr)
    broken = statuses["broken"] + len(stream_problems)
    unsealed, unchecked = statuses["unsealed"], statuses["unchecked"]
    clean = not (broken or unsealed or unchecked)
    how = (
        f"links and seals MACed with audit key {key.id}"
        if key is not None
        else "no audit key: an edit is caught, a recomputed chain or a cut is not"
    )
    print(
        f"{'verified' if clean else 'checked'} {histories} histories ({events} events)"
        f"{': every chain holds' if clean else ''}\n{how}; compared with the audit stream"
    )
    if broken:
        print(f"{broken} histories are broken or disagree with the audit stream", file=sys.stderr)
    if unsealed:
        print(
            f"{unsealed} histories hold events not sealed with the audit key: only an edit is"
            " caught in those"
            + ("" if args.allow_unsealed else " (--allow-unsealed accepts them)"),
            file=sys.stderr,
        )
    if unchecked:
        print(
            f"{unchecked} histories are sealed with an audit key and were not checked: give it"
            " (audit_key= in the store URL, $MCP_ONCE_AUDIT_KEY)",
            file=sys.stderr,
        )
    if broken or (unsealed and not args.allow_unsealed):
        return EXIT_PROBLEM
    return EXIT_USAGE if unchecked else 0
