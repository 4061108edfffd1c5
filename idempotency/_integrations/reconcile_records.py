"""`reconcile_unknown(app, store)`: every in-doubt record of a server, put to its tool's reconciler
without waiting for a client's retry (what `mcp-once keys reconcile --app MODULE:ATTR` runs).

The app is the server object the guard was installed on, as uvicorn names an app: an `MCPServer`
(tools under `@idempotent` or `install()`), a FastMCP server with `IdempotencyMiddleware`, or the
`GuardedCallTool` that `idempotent_call_tool` returned. Its guards hold the `reconcile=` option
and know how each tool's return value is converted; nothing else is needed. No call brings the
arguments, and records keep keys hashed only: a reconciler asked from here gets `key=None` and
`arguments=None`, and looks the effect up by `InDoubt.record` (the key the tool handed its system
of record).

Only the app's own records are asked about (rule 25). Servers sharing one store may each have a
tool named `charge`; a reconciler asked about another server's record looks in the wrong system
of record, answers "not happened", and the release lets that server's retry charge again. A
record's store key is a hash, so its server is read from its history: every claimed event names
the server that claimed (`server`, the name the guard sees: `MCPServer(name)`, `FastMCP(name)`,
`idempotent_call_tool(server_name=)`). A record whose history names another server is left
alone (`other_server`); one whose server cannot be read (a store keeping no history, a record
claimed before histories named servers, its claimed events dropped from a long history) is not
asked either (`server_unknown`): an operator settles it after checking the system of record.

What each verdict does here: happened completes the record (the client's retry replays it);
not happened releases it, so the client's retry runs the tool (nothing runs it from here);
unknown leaves it UNKNOWN. Each is the same fenced transition as on a retry (rule 19), and its
`reconciled` event names the operator who asked (`by`, `reason`), as a settle's does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .._guard.defaults import DEFAULT_LEASE
from .._guard.guard import Guard
from .._guard.reconcile import (
    Convert,
    Verdict,
    as_call_result,
    ask,
    encoded,
    in_doubt,
    reconciler_for,
    resolve,
    tool_names,
)
from .._stores.history import saying, servers_of
from .._stores.in_doubt import in_doubt_records
from .._stores.store import ClaimStatus, KeyStore, ReconcilingStore, Record, RecordState
from .lowlevel import GuardedCallTool

#: The answer of a record whose tool has no reconciler (or is not a tool of this app).
NO_RECONCILER = "no_reconciler"
#: The answer of a record whose history names another server than the app's: not asked.
OTHER_SERVER = "other_server"
#: The answer of a record whose server cannot be read from its history (none kept, or no claimed
#: event naming one), or that names several: not asked, left for an operator.
SERVER_UNKNOWN = "server_unknown"


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """What became of one in-doubt record (`reconcile_unknown`)."""

    #: The record's store key (as `mcp-once keys list` prints it).
    record: str
    #: The tool the record names (None: written by a release that did not store it).
    tool: str | None
    #: `happened`, `not_happened`, `unknown`, `lost` (resolved elsewhere meanwhile),
    #: `no_reconciler`, or, not asked: `other_server`, `server_unknown`. Under `dry_run`, what
    #: the reconciler said; nothing was written.
    answer: str
    #: Whether the store was changed (never under `dry_run`).
    applied: bool
    #: The server the record's history names (None: it cannot be read; several are joined
    #: with ", ").
    server: str | None = None


@dataclass(frozen=True, slots=True)
class GuardedTool:
    """A guarded tool as reconciliation needs it: its guard, and its return conversion."""

    guard: Guard
    convert: Convert


@dataclass(frozen=True, slots=True)
class GuardedServer:
    """A server as reconciliation needs it: its name as its guards see it (`CallScope.server`,
    what its records' histories name), and its guarded tools by name."""

    name: str
    tools: dict[str, GuardedTool]


#: Finds the guarded tools of a server of a framework the core does not name (rule 2: the
#: adapters plug into the core): None when `app` is not one of its servers. FastMCP's middleware
#: module adds its own when imported, as every app using it has done.
Finder = Callable[[object], Awaitable[GuardedServer | None]]
_finders: list[Finder] = []


def add_finder(finder: Finder) -> None:
    """Let `reconcile_unknown` find the guarded tools of another framework's servers."""
    if finder not in _finders:
        _finders.append(finder)


Lookup = Callable[[str], GuardedTool | None]


async def _guards_of(app: object) -> tuple[str, Lookup]:
    """The server name of `app` (as its guard sees it), and the guard (and conversion) of each
    of its tools, by the tool name records keep."""
    if isinstance(app, GuardedCallTool):
        guarded = GuardedTool(app.guard, as_call_result)
        return app.server_name, lambda name: guarded if app.guards(name) else None
    found: GuardedServer | None = None
    from mcp.server.mcpserver import MCPServer

    if isinstance(app, MCPServer):
        from .mcpserver.sdk import converter, tool_manager
        from .mcpserver.stamp import stamp_of

        tools: dict[str, GuardedTool] = {}
        for tool in tool_manager(app).list_tools():
            stamp = stamp_of(tool.fn)
            if stamp is not None:
                tools[tool.name] = GuardedTool(stamp.guard, converter(tool))
        found = GuardedServer(app.name, tools)
    for finder in _finders:
        if found is not None:
            break
        found = await finder(app)
    if found is None:
        raise TypeError(
            f"{type(app).__name__} is not a server mcp-once guards: give an MCPServer, a FastMCP"
            " server with IdempotencyMiddleware, or what idempotent_call_tool returned"
        )
    by_name = found.tools
    return found.name, lambda name: next(
        (by_name[known] for known in tool_names(name) if known in by_name), None
    )


def _kind(named: list[str], server: str) -> str | None:
    """Whether a record whose history names `named` is asked about by `server`'s reconcilers:
    None when it is, else why not (`OTHER_SERVER`, `SERVER_UNKNOWN`)."""
    if named == [server]:
        return None
    return OTHER_SERVER if named and server not in named else SERVER_UNKNOWN


async def _candidates(
    store: KeyStore, server: str, tool: str | None, limit: int
) -> list[tuple[Record, list[str]]]:
    """In-doubt records, oldest first, each with the servers its history names: the first
    `limit` that are not another server's, and the other servers' ones read on the way. The
    store cannot filter by server, so the window read grows until `limit` are found or it holds
    every in-doubt record: another server's many records never starve this one's."""
    window = limit
    while True:
        found = await in_doubt_records(store, tool=tool, limit=window)
        named = [(record, await servers_of(store, record.key)) for record in found]
        chosen: list[tuple[Record, list[str]]] = []
        counted = 0
        for record, names in named:
            if counted == limit:
                break
            chosen.append((record, names))
            counted += _kind(names, server) != OTHER_SERVER
        if counted == limit or len(found) < window:
            return chosen
        window *= 4


async def turn_unknown(store: KeyStore, record: Record) -> None:
    """Turn a record whose lease ran out UNKNOWN exactly as a client's retry would have: the
    store's claim, without takeover, which decides on the store's own clock (and writes the
    transition as every claim does). Should the record have been released in between, that
    claim makes a fresh one, given up again at once with its own token. What `keys settle` and
    `keys reconcile` do first for a record IN_PROGRESS under a lease that ran out."""
    outcome = await store.claim(
        record.key, record.fingerprint, lease=DEFAULT_LEASE, takeover=False, tool=record.tool
    )
    if outcome.status is ClaimStatus.CLAIMED and outcome.token is not None:
        await store.release(record.key, outcome.token)


async def _now_unknown(store: KeyStore, record: Record) -> Record | None:
    """The record, turned UNKNOWN first if its lease ran out; None if it is not in doubt."""
    if record.state is RecordState.IN_PROGRESS:
        await turn_unknown(store, record)
    now = await store.get(record.key)
    return now if now is not None and now.state is RecordState.UNKNOWN else None


async def reconcile_unknown(
    app: object,
    store: KeyStore,
    *,
    tool: str | None = None,
    server: str | None = None,
    dry_run: bool = False,
    limit: int = 1000,
    by: str | None = None,
    reason: str | None = None,
) -> list[Reconciliation]:
    """Ask each in-doubt record's reconciler (only `tool`'s records, if given) and apply its
    verdict; `dry_run`: ask, and write nothing. Only records whose history names the app's
    server are asked about (see the module doc); `server`, if given, must be that name (a
    `ValueError` otherwise). `by` and `reason` go into each verdict's `reconciled` event. `store`
    is the store the app's guards use (as `mcp-once keys --store` names it); `limit` bounds the
    records reported that are not another server's."""
    name, lookup = await _guards_of(app)
    if server is not None and server != name:
        raise ValueError(
            f"the app is server {name!r}, not {server!r}: its reconcilers are asked only about"
            f" records of {name!r}"
        )
    done: list[Reconciliation] = []
    for record, named in await _candidates(store, name, tool, limit):
        said = ", ".join(named) or None
        found = Reconciliation(record.key, record.tool, "", False, said)
        skipped = _kind(named, name)
        if skipped is not None:
            done.append(dataclasses.replace(found, answer=skipped))
            continue
        tool_name = record.tool or ""
        guarded = lookup(tool_name) if tool_name else None
        policy = guarded.guard.policy if guarded is not None else None
        reconciler = reconciler_for(policy.reconcile, tool_name) if policy is not None else None
        if guarded is None or policy is None or reconciler is None:
            done.append(dataclasses.replace(found, answer=NO_RECONCILER))
            continue
        if dry_run:
            doubt = in_doubt(record, tool=tool_name, key=None, arguments=None)
            answer = await ask(reconciler, doubt, timeout=policy.reconcile_timeout)
            verdict = answer.verdict
            if verdict is Verdict.HAPPENED and encoded(answer, guarded.convert, tool_name) is None:
                verdict = Verdict.UNKNOWN
            done.append(dataclasses.replace(found, answer=verdict.value))
            continue
        if not isinstance(store, ReconcilingStore):
            raise TypeError(f"{type(store).__name__} cannot take a reconciler's verdict")
        # Its events name the server (a claim's), and the operator (the verdict's).
        with saying(server=name, by=by, reason=reason):
            doubtful = await _now_unknown(store, record)
            if doubtful is None:
                done.append(dataclasses.replace(found, answer="lost"))
                continue
            resolution = await resolve(
                store,
                doubtful,
                reconciler,
                tool=tool_name,
                key=None,
                arguments=None,
                convert=guarded.convert,
                timeout=policy.reconcile_timeout,
                lease=policy.lease,
                retention=policy.retention,
            )
            if resolution.claim is not None and resolution.claim.token is not None:
                # Not happened: nothing runs the tool from here. Released, the retry runs it.
                with saying(reconciled=resolution.answer):
                    await store.release(record.key, resolution.claim.token)
        applied = resolution.answer in (Verdict.HAPPENED.value, Verdict.NOT_HAPPENED.value)
        done.append(dataclasses.replace(found, answer=resolution.answer, applied=applied))
    return done
