"""`mcp-once keys`: see and settle records, for the operator who must reconcile an unknown outcome.

`keys list` shows per record its tool, state, age, lease and fence, and the authenticated
principal that claimed it, by digest (`_principals`), and filters by state, tool and age.
Records are stored under a hash, so the tool's name is what tells an operator which record is
which; records written by a release that did not store it show "-" (and never match
`--tool`). Stored results are not printed unless asked (`--reveal-result`): they are user data,
and an operator listing records should not see them by accident. Records that cannot be read
are listed as `corrupt` (and the listing exits 1): the server refuses to serve them (-32014),
so an operator must be able to find them. A stored result counts as unreadable when its envelope
is not ours (`check_result_envelope`, no SDK needed); only `show --reveal-result` decodes it in
full with the SDK's model, which the listing does not load: `keys` starts in a fraction of a
second. A listing cut short by `--limit` on Redis shows the first records its scan met, not the
oldest ones (`KeyStore.list_records`); the table's last line says which it shows. Settling a
record as failed is refused for a grace period after its last lease ran out (see `_grace`).

A record IN_PROGRESS whose lease ran out (its worker was killed) is UNKNOWN in all but name: the
store turns it so at the next claim. `keys` does not wait for one: it lists it as `unknown`
(`storedState` says what the store holds, `leaseRanOutAt` since when), `--state unknown` finds
it, and `keys settle` first turns it UNKNOWN with the store's own claim (`takeover=False`, as a
client's claim would have), then settles it: one fenced transition after the other, never state
logic of its own.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from idempotency import (
    AuditedStore,
    CorruptRecord,
    HistoryEvent,
    KeyStore,
    LimitExceeded,
    Record,
    RecordState,
    StoreUnavailable,
    UnreadableResult,
    check_result_envelope,
    history_operator_settle,
    history_saying,
    in_doubt_records,
    record_servers,
    rfc3339,
    unreadable_records,
)

from . import _addressing, _audit, _durations, _grace, _principals, _reconcile
from ._common import (
    EXIT_PROBLEM,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    add_store_option,
    fail,
    open_or_fail,
    print_table,
    reading,
    server_cell,
    unreachable,
)
from ._proxies import add_proxy_option, apply_proxy, proxy_manifest

if TYPE_CHECKING:
    from pydantic import ValidationError

#: Settled results are kept as long as a completed record by default (24 h, like Stripe).
DEFAULT_SETTLE_RETENTION = 24 * 3600.0
#: What `keys list` calls a record the server cannot read, in place of its state.
CORRUPT = "corrupt"
_LISTED_STATES = [s.value for s in RecordState if s is not RecordState.RELEASED]

#: The names of the servers this project ships, as `--server` needs them (a record's scope holds
#: the server's name: `MCPServer(name)`, `FastMCP(name)`). Kept in step with the servers by a test.
EXAMPLE_SERVERS = {
    "mcp-once-example": "mcp-once serve-example, examples/server.py",
    "mcp-once-fastmcp-example": "examples/fastmcp_server.py",
}

_EPILOG = (
    "Records are stored under a SHA-256 hash of (scope, tool, key); `keys list` shows each"
    " one's tool (- for a record an earlier release wrote), state, age, lease and fence. To"
    " find the record of a call from what the client saw, give --client-key, --tool and"
    " --server (without --server, the servers holding a record for that key and tool are"
    " named), where --server is the MCP server's own name (MCPServer(name), FastMCP(name)): "
    + "; ".join(f"{name} for {where}" for name, where in EXAMPLE_SERVERS.items())
    + '; for an mcp-once proxy "mcp-once proxy: NAME@ID" (`mcp-once proxy --list`), or give'
    " --proxy NAME instead of --store and --server"
    + ". What to do about -32010, -32012, -32013, -32014 and UNKNOWN records: docs/runbook.md."
)


def add_parser(commands: Any) -> None:
    keys = commands.add_parser(
        "keys",
        help="list, show, settle, reconcile and purge idempotency records",
        description="See and settle the records of guarded tool calls.",
        epilog=_EPILOG,
    )
    actions = keys.add_subparsers(dest="action", required=True, metavar="ACTION")

    listing = actions.add_parser(
        "list",
        help="list records (tool, state, age, lease, fence), optionally filtered",
        description="List records, oldest first. Filters combine; --limit counts the records"
        " that pass them. A Redis store stops at the first --limit matches its scan meets,"
        " which are not the oldest when more match (the last line says so): finding the"
        " oldest would read every record.",
        epilog=_EPILOG,
    )
    listing.add_argument(
        "--state",
        choices=[*_LISTED_STATES, CORRUPT],
        help="only records in this state (corrupt: the ones the server cannot read)",
    )
    listing.add_argument(
        "--tool",
        metavar="NAME",
        help="only records of this tool (records written before tool names were stored have"
        " none and never match)",
    )
    listing.add_argument(
        "--server",
        metavar="NAME",
        help="only records of this server, as their history names it (records whose history"
        " names none never match)",
    )
    listing.add_argument(
        "--older-than",
        type=_durations.duration,
        metavar="DURATION",
        help="only records first claimed longer ago than this: seconds (90) or 10m, 2h, 3d",
    )
    listing.add_argument(
        "--limit", type=int, default=100, help="list at most N records (default: %(default)s)"
    )
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(run=_run(reading(_list), _check_list))

    show = actions.add_parser(
        "show",
        help="show one record (its result only if asked)",
        description="Show one record, by its store key or by what the client saw. Its stored"
        " result is printed only with --reveal-result: it is user data.",
        epilog=_EPILOG,
    )
    _add_key_arguments(show)
    show.add_argument("--reveal-result", action="store_true", help="print the stored result")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(run=_run(reading(_show)))

    settle = actions.add_parser(
        "settle",
        help="settle an UNKNOWN record as completed or failed",
        description="Settle a record whose outcome is unknown: UNKNOWN, or IN_PROGRESS under a"
        " lease that ran out (its worker died; it is turned UNKNOWN first, as a client's retry"
        " would). --failed releases it so that the next call runs the tool again, refused"
        " within --grace of its lease running out unless --force (or its holder said the"
        " execution ended); --result-text or --result-json completes it with the result the"
        " tool is known to have had. A record an operator settled before is settled again only"
        " with --force. On a proxy's record (--proxy NAME) the result must fit the tool's listed"
        " output schema.",
        epilog="What to check before settling: docs/runbook.md.",
    )
    _add_key_arguments(settle)
    verdict = settle.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--failed", action="store_true", help="release it: the next call runs")
    verdict.add_argument(
        "--result-text",
        help="completed, replaying this text as the result (also as structuredContent"
        ' {"result": TEXT}, the shape MCPServer gives a tool returning str; refused on a'
        " proxy's tool whose listed output schema wants another)",
    )
    verdict.add_argument(
        "--result-json",
        type=Path,
        help="completed, replaying this CallToolResult JSON file (its structuredContent must"
        " match the tool's output schema, or the SDK turns the replay into an error)",
    )
    settle.add_argument(
        "--retention",
        type=float,
        default=DEFAULT_SETTLE_RETENTION,
        metavar="SECONDS",
        help="how long a record settled as completed keeps replaying its result before it"
        " expires (default: %(default)s, 24 h, as a completed record); at least --grace",
    )
    _grace.add_arguments(settle)
    _audit.add_operator_arguments(settle, "settles")
    settle.set_defaults(run=_run(_settle, _prepare_settle))

    purge = actions.add_parser(
        "purge",
        help="physically remove expired records",
        description="Physically remove the records past their expiry (completed and released"
        " ones past their retention). The server already ignores them; this only frees the"
        " space. UNKNOWN and IN_PROGRESS records never expire and are never purged; a purged"
        " record's last fence is kept a day, so that its key's next execution gets a higher one.",
    )
    purge.set_defaults(run=_run(_purge))

    history = _audit.add_history_parser(actions, _add_key_arguments, _run)

    for parser in (listing, show, settle, purge, history):
        add_store_option(parser)
        add_proxy_option(parser)
    _reconcile.add_parser(actions, _run)


def _add_key_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "key",
        nargs="?",
        help="the store key as `keys list` prints it (a SHA-256 hex digest)",
    )
    derive = parser.add_argument_group(
        "or derive the store key from what the client saw (default scope, no principal)"
    )
    derive.add_argument("--client-key", help="the idempotency key the client sent")
    derive.add_argument("--tool", help="the tool name")
    derive.add_argument(
        "--server",
        help="the MCP server's own name, MCPServer(name) or FastMCP(name) (the example"
        f" servers: {', '.join(EXAMPLE_SERVERS)}; a proxy's: --proxy NAME gives it); without"
        " it, the servers holding a record for --client-key and --tool are named. With a store"
        " key: refused unless the record's history names this server",
    )


def _run(
    action: Callable[[KeyStore, argparse.Namespace], Awaitable[int]],
    prepare: Callable[[argparse.Namespace], None] | None = None,
) -> Callable[[argparse.Namespace], int]:
    """Check the arguments, open the store, run `action`, close the store, and turn store
    failures into exit codes. Every usage error is found before the store is touched."""

    def run(args: argparse.Namespace) -> int:
        apply_proxy(args)  # --proxy NAME: that proxy's store and server
        if hasattr(args, "client_key"):  # an action addressing one record
            args.key = _addressing.store_key_of(args)
        if prepare is not None:
            prepare(args)
        store = open_or_fail(args.store, existing=True)

        async def go() -> int:
            try:
                return await action(store, args)
            finally:
                with anyio.CancelScope(shield=True):
                    await store.aclose()

        try:
            return anyio.run(go)
        except StoreUnavailable as exc:
            unreachable(args.store, exc)
        except LimitExceeded as exc:
            fail(f"bad store key: {exc}", EXIT_USAGE)
        except CorruptRecord as exc:
            fail(str(exc), EXIT_PROBLEM)

    return run


def _when(timestamp: float | None) -> str | None:
    return None if timestamp is None else rfc3339(timestamp)


def _describe(record: Record, *, reveal: bool, servers: list[str]) -> dict[str, Any]:
    """One record for an operator. `tool` is None for a record an earlier release wrote;
    `ageSeconds` counts from its first claim (the store's clock) to now (this machine's);
    `fence` is the fence of its last lease, `leaseRanOutAt` when that lease ran out (on this
    machine's clock; None while it runs, or when it ended with a stored result): what to weigh
    before settling an UNKNOWN record as failed. `server` is what its history names (None:
    nothing; several are joined with ", ")."""
    now = _grace.clock()
    ran_out = record.lease_deadline is not None and record.lease_deadline <= now
    shown = RecordState.UNKNOWN if _grace.lease_ran_out(record, now) else record.state
    described: dict[str, Any] = {
        "key": record.key,
        "tool": record.tool,
        "server": ", ".join(servers) or None,
        "state": shown.value,
        "storedState": record.state.value,
        "ageSeconds": round(max(0.0, now - record.created_at), 3),
        "fence": record.fence,
        "attempts": record.attempts,
        "createdAt": _when(record.created_at),
        "updatedAt": _when(record.updated_at),
        "leaseDeadline": _when(record.lease_deadline),
        "leaseRanOutAt": _when(record.lease_deadline) if ran_out else None,
        "completedAt": _when(record.completed_at),
        "expiresAt": _when(record.expires_at),
        "resultBytes": None if record.result is None else len(record.result),
        "corrupt": None,
    }
    if record.result is not None:
        try:
            if reveal:
                # Only a result to print needs the SDK (its `CallToolResult`): loaded here.
                from idempotency import decode_result, domain_form

                # Domain form: what was stored, without a protocol era's envelope (`resultType`).
                described["result"] = domain_form(decode_result(record.result).result)
            else:
                check_result_envelope(record.result)
        except UnreadableResult as exc:
            # The server answers CORRUPT_RECORD for it, exactly as for a record it cannot read.
            described["state"] = CORRUPT
            described["corrupt"] = f"its stored result is unreadable: {exc}"
            if reveal:
                described["result"] = f"<unreadable: {exc}>"
    return described


def _describe_unreadable(found: CorruptRecord) -> dict[str, Any]:
    """A record the store could not read at all: its key and why, nothing else is known."""
    fields = (
        "tool",
        "server",
        "storedState",
        "ageSeconds",
        "fence",
        "attempts",
        "createdAt",
        "updatedAt",
    )
    more = ("leaseDeadline", "leaseRanOutAt", "completedAt", "expiresAt", "resultBytes")
    return {
        "key": found.key,
        "state": CORRUPT,
        **dict.fromkeys(fields + more),
        "corrupt": found.why,
    }


#: The table's columns: the JSON fields of the same names, but `age` (from `ageSeconds`).
_COLUMNS = (
    "key",
    "tool",
    "state",
    "age",
    "fence",
    "attempts",
    "leaseDeadline",
    "leaseRanOutAt",
    "expiresAt",
    "resultBytes",
    "server",
    "principal",
)


def _cell(row: dict[str, Any], column: str) -> str:
    if column == "age":
        seconds = row["ageSeconds"]
        return "-" if seconds is None else _durations.age(seconds)
    if column == "server":
        return server_cell(row["server"])
    value = row[column]
    return "-" if value is None else str(value)


def _print_table(rows: list[dict[str, Any]], order: str) -> None:
    """Aligned columns, one record a line, "-" for nothing: `awk '{print $1}'` gets the keys.
    The last line counts them and says which ones they are (`_order`)."""
    print_table(_COLUMNS, [[_cell(row, c) for c in _COLUMNS] for row in rows])
    print(f"({len(rows)} record{'s' if len(rows) != 1 else ''}, {order})")


def _order(store: KeyStore, state: RecordState | None, listed: int, limit: int) -> str:
    """Which records a listing shows: with fewer than `--limit`, every match, oldest first; at
    the limit, the oldest ones, or on a store whose listings of that state stop at the first
    matches they meet (Redis, but for its in-doubt index: `KeyStore.list_records`) the first
    ones its scan met."""
    oldest_first = getattr(store, "oldest_first", None)
    if listed < limit or oldest_first is None or oldest_first(state):
        return "oldest first"
    return f"the first {limit} the store's scan met, not the {limit} oldest; oldest first"


def _check_list(args: argparse.Namespace) -> None:
    if args.limit < 1:
        fail("--limit must be at least 1", EXIT_USAGE)
    if args.tool is not None and not args.tool.strip():
        fail("--tool needs a tool name", EXIT_USAGE)
    if args.server is not None and not args.server.strip():
        fail("--server needs a server name", EXIT_USAGE)


async def _listed(
    store: KeyStore, state: RecordState | None, tool: str | None, limit: int, before: float | None
) -> list[Record]:
    """The records `--state` asks for, as an operator sees states: a record under a lease that
    ran out is unknown (see the module doc), not in_progress. `before`: `--older-than`'s
    cutoff, asked of the store only when given (a store written before it knows no such
    filter); the in-doubt records are all read (`in_doubt_records`), and cut by `_list`."""
    older: dict[str, Any] = {} if before is None else {"created_before": before}
    if state is RecordState.UNKNOWN:
        return await in_doubt_records(store, tool=tool, limit=limit, now=_grace.clock())
    if state is not RecordState.IN_PROGRESS:
        return await store.list_records(state=state, tool=tool, limit=limit, **older)
    now = _grace.clock()
    running = await store.list_records(
        state=RecordState.IN_PROGRESS, tool=tool, limit=limit, **older
    )
    return [r for r in running if not _grace.lease_ran_out(r, now)]


async def _of_server(
    store: KeyStore,
    state: RecordState | None,
    tool: str | None,
    limit: int,
    server: str | None,
    before: float | None,
) -> list[tuple[Record, list[str]]]:
    """The records `_listed` gives, each with the servers its history names; with `server`,
    the first `limit` whose history names it. The store cannot filter by server, so the window
    read grows until `limit` are found or it holds every record that passes the other filters."""
    window = limit
    while True:
        found = await _listed(store, state, tool, window, before)
        # A record read with its history (Redis: in the listing's MGET) names its servers
        # without another read.
        named = [(record, await record_servers(store, record)) for record in found]
        kept = [pair for pair in named if server is None or server in pair[1]]
        if server is None or len(kept) >= limit or len(found) < window:
            return kept[:limit]
        window *= 4


async def _list(store: KeyStore, args: argparse.Namespace) -> int:
    """Exit 1 when a corrupt record was listed: something an operator must look at.

    The store applies every filter before counting `--limit` (`--older-than` as a time on this
    machine's clock), so that a store which stops at the first matches it meets (Redis) still
    shows only matches; the footer says which records these are (`_order`)."""
    state = RecordState(args.state) if args.state in _LISTED_STATES else None
    before = None if args.older_than is None else _grace.clock() - args.older_than
    with unreadable_records() as unreadable:
        records = await _of_server(store, state, args.tool, args.limit, args.server, before)
    if before is not None:  # the in-doubt records, read whole (the others are already cut)
        records = [(r, named) for r, named in records if r.created_at <= before]
    rows = [_describe(r, reveal=False, servers=named) for r, named in records]
    if state is None and args.tool is None and args.older_than is None and args.server is None:
        # An unreadable record has no state, tool or age to filter on: shown when nothing is
        # filtered on, else counted on stderr, so that a filtered view never hides it silently.
        rows += [_describe_unreadable(found) for found in unreadable]
    elif unreadable:
        print(
            f"mcp-once: {len(unreadable)} unreadable record(s) not shown: their state, tool,"
            " server and age cannot be read (`mcp-once keys list --state corrupt` lists them)",
            file=sys.stderr,
        )
    if args.state == CORRUPT:
        rows = [row for row in rows if row["state"] == CORRUPT]
    await _principals.add_principals(store, rows, [record for record, _ in records])
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
    else:
        _print_table(rows, _order(store, state, len(records), args.limit))
    corrupt = [row for row in rows if row["state"] == CORRUPT]
    for row in corrupt:
        print(
            f"mcp-once: record {row['key']} is corrupt ({row['corrupt']}); the server refuses"
            " it (-32014) and leaves it untouched: inspect it in the store",
            file=sys.stderr,
        )
    return EXIT_PROBLEM if corrupt else 0


async def _show(store: KeyStore, args: argparse.Namespace) -> int:
    problem = await _addressing.addressed(store, args)
    if problem is not None:
        return problem
    record = await store.get(args.key)
    if record is None:
        return await _addressing.absent(store, args)
    servers = await record_servers(store, record.key)
    described = _describe(record, reveal=args.reveal_result, servers=servers)
    await _principals.add_principals(store, [described])
    if args.json:
        json.dump(described, sys.stdout, indent=2)
        print()
    else:
        for name, value in described.items():
            shown = json.dumps(value) if isinstance(value, dict) else value
            print(f"{name}: {'-' if shown is None else shown}")
    return EXIT_PROBLEM if described["state"] == CORRUPT else 0


def _settled_result(args: argparse.Namespace) -> bytes | None:
    if args.failed:
        return None
    # A result to store needs the SDK's `CallToolResult` (and pydantic): loaded only here.
    from mcp_types import CallToolResult, TextContent
    from pydantic import ValidationError

    from idempotency import encode_result

    if args.result_text is not None:
        # MCPServer validates a returned result's structuredContent against the tool's output
        # schema, and a tool returning `str` has the schema {"result": string}: without it the
        # replay would reach the client as "Error executing tool".
        result = CallToolResult(
            content=[TextContent(type="text", text=args.result_text)],
            structured_content={"result": args.result_text},
        )
    else:
        try:
            result = CallToolResult.model_validate_json(args.result_json.read_bytes())
        except OSError as exc:
            fail(f"cannot read {args.result_json}: {exc.strerror}", EXIT_USAGE)
        except ValidationError as exc:
            fail(f"{args.result_json} is not a CallToolResult: {_problems(exc)}", EXIT_USAGE)
    return encode_result(result, time.time())


def _problems(error: ValidationError, shown: int = 3) -> str:
    """What is wrong with a file, as pydantic found it: where (`content.0.type`) and what, for
    the first few problems, so that the operator can fix the file without guessing."""
    found = error.errors()
    said = [
        f"{'.'.join(str(part) for part in problem['loc']) or 'the document'}: {problem['msg']}"
        for problem in found[:shown]
    ]
    more = len(found) - shown
    return "; ".join(said) + (f" (and {more} more)" if more > 0 else "")


def _prepare_settle(args: argparse.Namespace) -> None:
    if not (math.isfinite(args.retention) and args.retention > 0):
        fail("--retention must be a positive number of seconds", EXIT_USAGE)
    if not (math.isfinite(args.grace) and args.grace >= 0):
        fail("--grace must be a number of seconds >= 0", EXIT_USAGE)
    if args.retention < args.grace:
        # Rule 25: the settled record would be gone while the worker that held it may still be
        # merely paused, and a retry after that runs the tool again, unseen.
        fail(
            f"--retention {args.retention:g} s is shorter than the grace of {args.grace:g} s:"
            " the settled record would be forgotten while the worker that held it may still"
            " resume, and a client retrying after that runs the tool again (at a higher fence,"
            " but a second effect all the same). Keep it at least as long as --grace (the"
            " default keeps it 24 h). Nothing was changed.",
            EXIT_USAGE,
        )
    args.settled = _settled_result(args)


async def _settle(store: KeyStore, args: argparse.Namespace) -> int:
    result: bytes | None = args.settled
    problem = await _addressing.addressed(store, args)
    if problem is not None:
        return problem
    record = await store.get(args.key)
    if record is None and args.client_key is not None:
        return await _addressing.absent(store, args)
    unfit = _unfit_result(args, record)
    if unfit is not None:
        print(f"mcp-once: {unfit}", file=sys.stderr)
        return EXIT_PROBLEM
    replacing: int | None = None
    if record is not None and record.state is RecordState.COMPLETED:
        earlier = await _operator_settle(store, record)
        if earlier is None or not args.force:
            print(f"mcp-once: {_completed_refusal(args.key, earlier)}", file=sys.stderr)
            return EXIT_PROBLEM
        replacing = record.fence
    elif result is None and not args.force:
        refusal = _grace.too_soon_to_fail(record, args.grace)
        if refusal is not None and await _grace.ended_by_its_holder(store, record) is None:
            print(f"mcp-once: {refusal}", file=sys.stderr)
            return EXIT_PROBLEM
    if record is not None and _grace.lease_ran_out(record):
        from idempotency import turn_unknown  # the guard's claim rules: loads the SDK

        await turn_unknown(store, record)
    with history_saying(**_audit.settled_by(args)):
        settled = await store.settle(
            args.key, result=result, retention=args.retention, replacing=replacing
        )
    if settled:
        verdict = "released (the next call runs again)" if result is None else "completed"
        again = ", replacing the earlier settle (both are in its history)" if replacing else ""
        print(f"settled {args.key}: {verdict}{again}")
        return 0
    record = await store.get(args.key)
    state = "absent" if record is None else record.state.value
    if record is not None and record.state is RecordState.IN_PROGRESS:
        state += f", its lease held until {_when(record.lease_deadline)} (a worker is running it)"
    print(
        f"mcp-once: {args.key} was not settled: only an UNKNOWN record can be, and it is {state}",
        file=sys.stderr,
    )
    return EXIT_PROBLEM


async def _operator_settle(store: KeyStore, record: Record) -> HistoryEvent | None:
    """The settle that made the COMPLETED `record` what it is, if an operator's did (its
    history says so at its fence); None for an executed record, or one without a readable
    history (a store that keeps none: never replaced, then)."""
    if not isinstance(store, AuditedStore):
        return None
    try:
        return history_operator_settle(await store.history(record.key), record.fence)
    except ValueError:
        return None


def _completed_refusal(key: str, earlier: HistoryEvent | None) -> str:
    if earlier is None:
        return (
            f"{key} was not settled: only an UNKNOWN record can be, and it is completed by the"
            " tool's own execution (an executed record is never replaced; an operator's settle"
            " is, with --force). Nothing was changed."
        )
    by = earlier.details.get("by", "an operator")
    return (
        f"{key} was already settled as completed by {by} at {rfc3339(earlier.at)}: pass --force"
        " to replace that settle (it stays in the record's history, with this one). Nothing"
        " was changed."
    )


def _unfit_result(args: argparse.Namespace, record: Record | None) -> str | None:
    """Why the result to settle with would break every replay, where that can be known here:
    the tool's output schema is in the manifest of the proxy the record belongs to
    (`--proxy NAME`, or a `--server` that is a proxy's). None when it fits or nothing is known
    (another server's record: its schema is not on this machine; `docs/runbook.md`)."""
    result = args.settled
    tool = args.tool or (record.tool if record is not None else None)
    manifest = proxy_manifest(args)
    if result is None or tool is None or manifest is None:
        return None
    schema = manifest.output_schemas.get(tool)
    # The SDK's `CallToolResult` (as the settle's own) and jsonschema: loaded only here.
    from idempotency import decode_result
    from mcp_once._upstream.outputs import output_problem

    stored = decode_result(result).result
    found = output_problem(schema, stored.structured_content, is_error=stored.is_error)
    if found is None:
        return None
    given = "--result-text" if args.result_text is not None else f"--result-json {args.result_json}"
    return (
        f"refusing to settle {args.key} with {given}: {found}, so every replay of it would fail"
        f" in the caller's MCP SDK. Tool {tool!r} of proxy {manifest.key} lists an output schema"
        f" ({json.dumps(schema)}): give --result-json with a CallToolResult whose"
        " structuredContent matches it. Nothing was changed."
    )


async def _purge(store: KeyStore, args: argparse.Namespace) -> int:
    removed = await store.purge_expired()
    print(f"purged {removed} expired record{'s' if removed != 1 else ''}")
    return 0


#: `mcp-once audit` opens its store as `keys` does, with this.
run_on_store = _run

__all__ = ["EXIT_UNREACHABLE", "add_parser", "run_on_store"]
