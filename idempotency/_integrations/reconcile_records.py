"""`reconcile_unknown(app, store)`: every in-doubt record of a server, put to its tool's reconciler
without waiting for a client's retry (what `mcp-once keys reconcile --app MODULE:ATTR` runs).

The app is the server object the guard was installed on, as uvicorn names an app: an `MCPServer`
(tools under `@idempotent` or `install()`), a FastMCP server with `IdempotencyMiddleware`, or the
`GuardedCallTool` that `idempotent_call_tool` returned. Its guards hold the `reconcile=` option
and know how each tool's return value is converted; nothing else is needed. No call brings the
arguments, and records keep keys hashed only: a reconciler asked from here gets `key=None` and
`arguments=None`, and looks the effect up by `InDoubt.record` (the key the tool handed its system
of record).

What each verdict does here: happened completes the record (the client's retry replays it);
not happened releases it, so the client's retry runs the tool (nothing runs it from here);
unknown leaves it UNKNOWN. Each is the same fenced transition as on a retry (rule 19).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .._guard.guard import Guard
from .._guard.policy import DEFAULT_LEASE
from .._guard.reconcile import (
    Convert,
    Verdict,
    as_call_result,
    ask,
    encoded,
    in_doubt,
    reconciler_for,
    resolve,
)
from .._stores.history import saying
from .._stores.in_doubt import in_doubt_records
from .._stores.store import ClaimStatus, KeyStore, ReconcilingStore, Record, RecordState
from .lowlevel import GuardedCallTool

#: The answer of a record whose tool has no reconciler (or is not a tool of this app).
NO_RECONCILER = "no_reconciler"


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """What became of one in-doubt record (`reconcile_unknown`)."""

    #: The record's store key (as `mcp-once keys list` prints it).
    record: str
    #: The tool the record names (None: written by a release that did not store it).
    tool: str | None
    #: `happened`, `not_happened`, `unknown`, `lost` (resolved elsewhere meanwhile), or
    #: `no_reconciler`. Under `dry_run`, what the reconciler said; nothing was written.
    answer: str
    #: Whether the store was changed (never under `dry_run`).
    applied: bool


@dataclass(frozen=True, slots=True)
class GuardedTool:
    """A guarded tool as reconciliation needs it: its guard, and its return conversion."""

    guard: Guard
    convert: Convert


#: Finds the guarded tools of a server of a framework the core does not name (rule 2: the
#: adapters plug into the core): None when `app` is not one of its servers. FastMCP's middleware
#: module adds its own when imported, as every app using it has done.
Finder = Callable[[object], Awaitable[dict[str, GuardedTool] | None]]
_finders: list[Finder] = []


def add_finder(finder: Finder) -> None:
    """Let `reconcile_unknown` find the guarded tools of another framework's servers."""
    if finder not in _finders:
        _finders.append(finder)


async def _guards_of(app: object) -> Callable[[str], GuardedTool | None]:
    """The guard (and conversion) of each tool of `app`, by the tool name records keep."""
    if isinstance(app, GuardedCallTool):
        guarded = GuardedTool(app.guard, as_call_result)
        return lambda name: guarded if app.guards(name) else None
    found: dict[str, GuardedTool] | None = None
    from mcp.server.mcpserver import MCPServer

    if isinstance(app, MCPServer):
        from .mcpserver.sdk import converter, tool_manager
        from .mcpserver.stamp import stamp_of

        found = {}
        for tool in tool_manager(app).list_tools():
            stamp = stamp_of(tool.fn)
            if stamp is not None:
                found[tool.name] = GuardedTool(stamp.guard, converter(tool))
    for finder in _finders:
        if found is not None:
            break
        found = await finder(app)
    if found is None:
        raise TypeError(
            f"{type(app).__name__} is not a server mcp-once guards: give an MCPServer, a FastMCP"
            " server with IdempotencyMiddleware, or what idempotent_call_tool returned"
        )
    tools = found
    return lambda name: tools.get(name) or tools.get(name.partition("@")[0])


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
    dry_run: bool = False,
    limit: int = 1000,
) -> list[Reconciliation]:
    """Ask each in-doubt record's reconciler (only `tool`'s records, if given) and apply its
    verdict; `dry_run`: ask, and write nothing. `store` is the store the app's guards use (as
    `mcp-once keys --store` names it)."""
    lookup = await _guards_of(app)
    done: list[Reconciliation] = []
    for record in await in_doubt_records(store, tool=tool, limit=limit):
        name = record.tool or ""
        guarded = lookup(name) if name else None
        policy = guarded.guard.policy if guarded is not None else None
        reconciler = reconciler_for(policy.reconcile, name) if policy is not None else None
        if guarded is None or policy is None or reconciler is None:
            done.append(Reconciliation(record.key, record.tool, NO_RECONCILER, False))
            continue
        if dry_run:
            doubt = in_doubt(record, tool=name, key=None, arguments=None)
            answer = await ask(reconciler, doubt, timeout=policy.reconcile_timeout)
            said = answer.verdict
            if said is Verdict.HAPPENED and encoded(answer, guarded.convert, name) is None:
                said = Verdict.UNKNOWN
            done.append(Reconciliation(record.key, record.tool, said.value, False))
            continue
        if not isinstance(store, ReconcilingStore):
            raise TypeError(f"{type(store).__name__} cannot take a reconciler's verdict")
        doubtful = await _now_unknown(store, record)
        if doubtful is None:
            done.append(Reconciliation(record.key, record.tool, "lost", False))
            continue
        resolution = await resolve(
            store,
            doubtful,
            reconciler,
            tool=name,
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
        done.append(Reconciliation(record.key, record.tool, resolution.answer, applied))
    return done
