"""The guard: claim → run → complete or release, and wait-then-replay for duplicates.

The one implementation behind every entry point (decorator, `install`, low-level handler, FastMCP
middleware). An entry point describes the call (`ToolCall`), hands over how to run the tool
(`execute`), how its framework renders an exception as an `isError` result, and the framework's
own call (`passthrough`); the guard does the rest. A framework that runs more than the tool's body
inside `execute` (argument validation, its own per-tool timeout) says what happened by raising
`NothingDone` or `Interrupted`.

Protect or pass through is decided here and only here (`Guard.call`): a call with no key and none
to derive, or one that `fail_open` lets run while the store is down, is the framework's own call —
`passthrough`, never `execute` — so its result, its exceptions, its spans and its logs are exactly
what they are without the guard. Nothing of the guard's own (no span, no log line) is added to it;
only the `unprotected` outcome is counted.

Cancellation (rule 10): once a claim is won, the run and the record write happen inside a shielded
scope. A client that gives up (its timeout's `notifications/cancelled`, a dropped connection) does
not abort a keyed execution: the tool runs to completion, bounded by `max_run_time` and by its
lease, the result is stored, and the retry replays it. The same holds for a graceful server
shutdown, which therefore drains running keyed executions (up to `max_run_time`); only a process
that dies leaves a record IN_PROGRESS, for lease expiry to settle.

Where each step lives: the key is claimed here (`Guard._claim`, one store call); the lease is
renewed from the claim until the result is stored (`lease.py`, rule 11); the result is stored by
`complete.py` (retried until it lands or the claim is gone, within two leases); replays are
decoded and stamped by `replay.py`. The tool reads its claim with `current_claim()`
(`current_claim.py`, rule 13). Keys are minted or derived in `mint.py`.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
from mcp import MCPError
from mcp.server.context import ServerRequestContext
from mcp_types import CallToolResult, InputRequiredResult

from .. import wire
from .._stores.history import AuditedStore, interruption, saying, scope_digest
from .._stores.store import (
    ClaimOutcome,
    ClaimStatus,
    CorruptRecord,
    KeyStore,
    ReconcilingStore,
    Record,
    RecordState,
    StoreError,
    suspends,
)
from .._system_task import cancelled_beyond, loop_time
from . import answers, errors, in_doubt_gauge
from .caller import caller_of, cancel_requested, disconnected, principal_of
from .complete import gave_up, store_result
from .current_claim import Claim, publish, withdraw
from .envelope import UnreadableResult
from .fingerprint import UnfingerprintableArguments, covered, fingerprints
from .hooks import Replay, replayed
from .keyplaces import found_keys, header_place
from .lease import LeaseKeeper, keep_lease
from .mint import KeySource, attempt_of, derive_key, input_round, resolve_key
from .policy import Policy
from .reconcile import (
    LOST,
    Convert,
    Resolution,
    Verdict,
    as_call_result,
    reconciler_for,
    resolve,
)
from .replay import decode_result, origin, stamped
from .scope import CallScope, default_scope, store_key
from .tasks import retention as task_retention
from .telemetry import (
    NO_TRACE,
    Outcome,
    Trace,
    count_outcome,
    log_about,
    log_answer,
    logger,
    record_name,
    traced,
)

ToolResult = CallToolResult | InputRequiredResult
#: Runs the tool once and returns its domain result (or raises what the tool raised).
Execute = Callable[[], Awaitable[ToolResult]]
#: Renders an exception the tool raised as the `isError` result its SDK would have produced.
ErrorResult = Callable[[Exception], CallToolResult]
#: The framework's answer type: what `passthrough` returns and what `render` makes of the guard's.
N = TypeVar("N")

#: The longest `OutcomeLost.why` a record's history keeps (its words, not an essay).
MAX_WHY_CHARS = 200

#: A duplicate told IN_PROGRESS is asked back within this time: the server long-polls for it
#: (`wait`) on the next attempt, so coming back soon costs little and answers sooner.
RETRY_HINT_CAP = 1.0


def as_is(answer: ToolResult) -> ToolResult:
    """The `render` of an entry point whose framework takes the guard's answer as it is (the
    SDK's `MCPServer` and low-level server)."""
    return answer


class NothingDone(Exception):
    """Raised by `execute` when nothing a retry must not repeat has happened: the framework
    refused the call before the tool's body ran (arguments invalid, tool unknown or disabled), or
    the body failed with an exception its author declared effect-free. The claim is released and
    `raised` — what the framework would have raised without the guard — propagates in its place.
    """

    def __init__(self, raised: Exception) -> None:
        super().__init__(type(raised).__name__)
        self.raised = raised


class Interrupted(Exception):
    """Raised by `execute` when the framework cancelled the tool part-way (its own per-tool
    timeout), or by a tool whose own downstream call broke after it may have been received (the
    proxy's upstream link; public as `idempotency.Interrupted`). The effect may have happened, so
    the framework's error is not stored as the key's answer: the call gets the guard's own answer
    for a run cut short (OUTCOME_UNKNOWN), exactly as when `max_run_time` is exceeded, and the
    record is left to its lease."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class OutcomeLost(Interrupted):
    """Raised by a tool whose own downstream call may have had its effect and will never say
    (public as `idempotency.OutcomeLost`): the proxy's upstream child died mid-call, its stream
    broke. Unlike a plain `Interrupted` (a run cut short by a timeout, whose body may still be
    finishing in a worker thread), nothing more can come of this execution, so waiting out its
    lease would only tell re-sends "in progress" (-32010) for an outcome already known to be
    unknown. The record turns UNKNOWN at once, fenced on the claim's token
    (`ReconcilingStore.leave_unknown`; an ``interrupted`` event in its history), and the call
    and every re-send get OUTCOME_UNKNOWN (-32012) until a reconciler or an operator settles it.
    A tool whose policy allows a takeover (`takeover`) is left to its lease as before: the next
    claim after it runs the tool again, which such a tool permits.

    `why` says what happened, in words an operator and a caller can act on ("the upstream
    process exited while the call ran; its effect may have happened"): it is the caller's
    message, every re-send's, and the record's `interrupted` event (so: words, never an argument).
    `ended`: the holder knows the execution is over, nothing of it can still be running (the
    process that ran it exited); `mcp-once keys settle --failed` then needs no grace period,
    which exists for a holder that may only be paused."""

    def __init__(self, why: str, *, ended: bool = False) -> None:
        super().__init__(why)
        self.ended = ended


@dataclass(slots=True)
class ToolCall:
    """One tools/call as the guard needs it: names, the arguments as sent, the request `_meta`.

    `tool` is the tool's identity as records know it (FastMCP: name and version). `derivable`
    says whether a keyless call may be merged under a derived key at all: not for a read-only
    tool (merging only makes a read stale) nor for one whose author opted out (every call meant
    to be new); such a keyless call passes through. A client key is honoured either way.

    Not frozen: built once per call and never changed by the guard, so the frozen init's
    `object.__setattr__` per field would be pure cost.
    """

    server: str
    tool: str
    arguments: Mapping[str, Any] | None
    meta: Mapping[str, Any] | None
    request: ServerRequestContext[Any, Any] | None = None
    derivable: bool = True


@dataclass(slots=True)
class _Ticket:
    """Everything known about a keyed call once its key is settled (its span is opened only
    once the call is protected, so that a call passed through has none: `trace` is set then)."""

    tool: str
    key: str
    source: KeySource
    store_key: str
    fingerprint: str
    retention: float
    #: The key was derived (rule 15): the record answers only re-sends, so whether the caller
    #: gave up on its answer is recorded (`Guard._caller_gone`, `Guard._answered`).
    derived: bool = False
    #: The request, for a derived key: where a give-up shows (`caller.cancel_requested`).
    request: ServerRequestContext[Any, Any] | None = None
    #: Its last claim asked for a re-send only (`KeyStore.claim(resend_only=True)`): a replay
    #: it got hands the caller an answer it had not kept (`answers.handed_first`).
    as_resend: bool = False
    trace: Trace = NO_TRACE
    #: The call's arguments and its entry point's conversion of a return value: what a
    #: reconciler is told, and how its `happened` value is stored (`reconcile.py`).
    arguments: Mapping[str, Any] | None = None
    convert: Convert = as_call_result
    #: A digest of the scope, for the record's claimed events (rule 20): never the scope itself.
    scope_digest: str | None = None
    #: The server's name (`CallScope.server`): for the record's claimed events, what tells an
    #: operator's tools which server's record it is (rule 25), and for the log lines about it.
    server: str = ""

    def log(self, level: int, event: str, what: str, *args: object) -> None:
        """A log line about the ticket's record (`telemetry.log_about`)."""
        log_about(level, event, self.store_key, self.tool, self.server, what, *args)

    #: A digest of the authenticated principal (None without one), for the same events: who
    #: claimed, the same digest on every server (`principal_digest`), never the principal.
    principal_digest: str | None = None
    #: The call's fingerprint with its integral floats as written, where it differs from
    #: `fingerprint` (numbers by value): what a record written before that holds
    #: (`fingerprint.fingerprints`), tried once when the claim finds another fingerprint.
    legacy_fingerprint: str | None = None


#: The default scope of one (server, principal): `default_scope` is a pure function of the two,
#: so it is computed once per pair rather than encoded per call (bounded: cleared when full).
_default_scopes: dict[tuple[str, str | None], str] = {}
_DEFAULT_SCOPES_KEPT = 1024


def _underived() -> str | None:
    """The `derive` of a call that carries a key or is not under "derived": never asked."""
    return None


def _hint(retry_after: float | None) -> float:
    if retry_after is None:
        return RETRY_HINT_CAP
    return max(0.001, min(retry_after, RETRY_HINT_CAP))


def _takes(method: object, name: str) -> bool:
    """Whether `method` takes a keyword `name` (or any keyword)."""
    try:
        parameters = inspect.signature(method).parameters.values()  # type: ignore[arg-type]
    except (TypeError, ValueError):  # no signature to read: assume this release's protocol
        return True
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in parameters)


def _knows_resends(store: KeyStore) -> bool:
    """Whether the store keeps rule 15's delivery mark (`resend_only`, `delivered`, `abandon`:
    every store of this release does). A `KeyStore` of one's own written before it cannot tell
    a re-send from a repeat, so the guard derives no keys on it: keyless calls run as written,
    never merged into an answer their caller already had. Asked once per guard."""
    return (
        _takes(store.claim, "resend_only")
        and _takes(store.complete, "delivered")
        and callable(getattr(store, "abandon", None))
    )


def _claim_names_the_tool(store: KeyStore) -> bool:
    """Whether `store.claim` takes `tool=` (every store of this release does). A `KeyStore` of
    one's own, written before records named their tool, keeps working, its records naming no
    tool (`keys list` shows `-`), instead of every call failing with -32013. Asked once per
    guard, never per call."""
    try:
        parameters = inspect.signature(store.claim).parameters.values()
    except (TypeError, ValueError):  # no signature to read: assume this release's protocol
        return True
    return any(p.name == "tool" or p.kind is p.VAR_KEYWORD for p in parameters)


def _takes_verdicts(store: KeyStore) -> bool:
    """Whether the store takes a reconciler's verdict (`ReconcilingStore`: every store of this
    release). Asked once per guard that has `reconcile=`; without one, a `KeyStore` of one's
    own written before rule 19 keeps working."""
    return all(callable(getattr(store, name, None)) for name in ("reconcile", "leave_unknown"))


class Guard:
    """Runs tool calls at most once per (scope, tool, key) against one key store."""

    def __init__(self, store: KeyStore, policy: Policy) -> None:
        self.store = store
        self.policy = policy
        self._places_of: tuple[Policy, tuple[str, ...]] | None = None
        self._names_tools = _claim_names_the_tool(store)
        #: Whether a claim can be cut short by a cancellation (then it is shielded).
        self._claim_suspends = suspends(store.claim)
        self._derives = _knows_resends(store)
        if policy.reconcile is not None and not _takes_verdicts(store):
            raise TypeError(
                f"reconcile= needs a store that takes a reconciler's verdict (rule 19);"
                f" {type(store).__name__} has no reconcile()"
            )
        if not self._derives and policy.keys == "derived":
            logger.warning(
                "%s keeps no delivery mark (rule 15: no resend_only claim, delivered complete"
                " or abandon): keyless calls are not merged on it and run as written",
                type(store).__name__,
            )

    async def call(
        self,
        call: ToolCall,
        execute: Execute,
        *,
        error_result: ErrorResult,
        takeover: bool,
        passthrough: Callable[[], Awaitable[N]],
        render: Callable[[ToolResult], N],
        admit: Callable[[], Awaitable[None]] | None = None,
        convert: Convert | None = None,
    ) -> N:
        """The tool's result, first-hand or replayed (`render`ed), one of the contract's
        `MCPError`s, or — where the guard protects nothing — exactly what `passthrough` (the
        framework's own call) returns or raises.

        `admit` is the framework's authorization, asked before the guard answers anything of
        its own (a refused key, a claim, a replay): what it raises is the caller's answer.
        `convert` turns a reconciler's `happened` value into the result, as the framework turns
        the tool's own return value (default: a `CallToolResult`, or a mapping of one)."""
        try:
            ticket = self._ticket(call)
        except MCPError:
            if admit is not None:
                await admit()
            with traced(call.tool) as trace:
                trace.outcome(Outcome.INVALID)
                raise
        if ticket is None:
            # No key and none to derive: the framework's own call, untouched.
            count_outcome(call.tool, Outcome.UNPROTECTED)
            return await passthrough()
        if admit is not None:
            await admit()
        with traced(call.tool) as trace:
            if trace.recording:
                trace.set(
                    record=record_name(ticket.store_key),
                    key_source=ticket.source.value,
                    attempt=attempt_of(call.meta),
                )
            ticket.trace = trace
            ticket.arguments = call.arguments
            ticket.server = call.server
            in_doubt_gauge.watch(self.store)
            if convert is not None:
                ticket.convert = convert
            try:
                answer = await self._claim_loop(ticket, execute, error_result, takeover)
            except MCPError as exc:
                # The guard's refusals and OUTCOME_UNKNOWN, logged as answered (telemetry.py).
                log_answer(
                    trace.outcome_seen, exc.code, ticket.store_key, ticket.tool, ticket.server
                )
                raise
        if answer is None:  # the store is down and the author chose fail-open
            return await passthrough()
        if trace.outcome_seen is Outcome.REPLAYED:
            ticket.log(logging.DEBUG, "replayed", "replayed its stored answer")
        return render(answer)

    def _ticket(self, call: ToolCall) -> _Ticket | None:
        """Settle the call's key, fingerprint and record name; None for an unkeyed call."""
        policy = self.policy
        try:
            # What the fingerprint covers: never the key argument (the key names the call, it is
            # not what the call asks for), and what `fingerprint=` chose.
            arguments = covered(
                call.arguments, key_argument=policy.key_argument, option=policy.fingerprint
            )
            fp, legacy = fingerprints(call.tool, arguments)
            fp_problem = ""
        except UnfingerprintableArguments as exc:
            fp, legacy, fp_problem = None, None, str(exc)
        found = found_keys(
            call.meta,
            call.arguments,
            call.request,
            key_argument=policy.key_argument,
            key_header=policy.key_header,
        )
        principal = principal_of(call.request)
        scopes: list[str] = []
        if found or policy.keys != "derived":
            resolved = resolve_key(found, policy.keys, _underived, elsewhere=self._elsewhere())
        else:

            def derive() -> str | None:
                if not call.derivable or not self._derives:
                    # Read-only, opted out, or a store that cannot tell a re-send from a
                    # repeat: every keyless call runs as written.
                    return None
                caller = caller_of(call.request)
                if caller is None:
                    return None  # nobody to bind a derived key to: not merged, run as written
                if fp is None:
                    raise errors.unfingerprintable(None, fp_problem)
                params = call.request.params if call.request is not None else None
                scopes.append(self._scope(call, principal))
                # The fingerprint of the bytes as sent (`legacy` when it differs): a re-send
                # repeats them, and a record derived before numbers compared by value is found.
                return derive_key(
                    scopes[0],
                    call.tool,
                    fp if legacy is None else legacy,
                    caller=caller,
                    round_fields=input_round(params),
                    meta=call.meta,
                )

            resolved = resolve_key(found, policy.keys, derive, elsewhere=self._elsewhere())
        if resolved is not None and fp is None:
            raise errors.unfingerprintable(resolved[0], fp_problem)
        if resolved is None:
            return None
        assert fp is not None
        key, source = resolved
        # Computed only for keyed calls: a keyless "optional" call stays exactly unwrapped.
        scope = scopes[0] if scopes else self._scope(call, principal)
        derived = source is KeySource.DERIVED
        return _Ticket(
            call.tool,
            key,
            source,
            store_key(scope, call.tool, key),
            fp,
            policy.retention_for(derived),
            derived,
            call.request if derived else None,
            scope_digest=scope_digest(scope),
            server=call.server,
            principal_digest=None if principal is None else scope_digest(principal),
            legacy_fingerprint=legacy,
        )

    def scope_of(self, call: ToolCall) -> str:
        """The partition a call's key lives in, for a call without a request (a task's body,
        `task_body.py`): the same one its claim uses."""
        return self._scope(call, principal_of(call.request))

    def _scope(self, call: ToolCall, principal: str | None) -> str:
        """The partition the call's key lives in (`Policy.scope`); `principal`: the call's
        authenticated principal (`principal_of`)."""
        scope_fn = self.policy.scope
        if scope_fn is default_scope:
            pair = (call.server, principal)
            found = _default_scopes.get(pair)
            if found is None:
                if len(_default_scopes) >= _DEFAULT_SCOPES_KEPT:
                    _default_scopes.clear()
                found = _default_scopes[pair] = default_scope(
                    CallScope(call.server, call.tool, principal, call.meta, call.request)
                )
            return found
        found = scope_fn(CallScope(call.server, call.tool, principal, call.meta, call.request))
        if not isinstance(found, str):
            raise TypeError(f"the scope function returned {type(found).__name__}, not str")
        return found

    def _elsewhere(self) -> tuple[str, ...]:
        """The places besides `_meta` this guard takes a key from, as errors name them
        (computed once per policy)."""
        policy = self.policy
        if self._places_of is not None and self._places_of[0] is policy:
            return self._places_of[1]
        places: list[str] = []
        if policy.key_argument is not None:
            places.append(wire.argument_place(policy.key_argument))
        if policy.key_header is not None:
            places.append(header_place(policy.key_header))
        self._places_of = (policy, tuple(places))
        return self._places_of[1]

    async def _claim_loop(
        self, t: _Ticket, execute: Execute, error_result: ErrorResult, takeover: bool
    ) -> ToolResult | None:
        """The key's answer; None when the store is down and `fail_open` lets the call pass."""
        started = loop_time()
        deadline = started + self.policy.wait
        held_elsewhere = False  # another attempt was found holding the claim
        reconciled = False  # a call asks its reconciler at most once
        if t.derived and answers.marking:
            await answers.settled(t.store_key)  # a late cancel of this record's last answer
        while True:
            try:
                # Shielded: a claim won in the store but lost to a cancellation on the way back
                # would leave an orphan IN_PROGRESS record that later reads as OUTCOME_UNKNOWN.
                # (A claim that never suspends cannot be cut short: it needs no scope.)
                # For the claimed event (rule 20): whose scope, which server, who claimed.
                with saying(
                    scope=t.scope_digest, server=t.server or None, principal=t.principal_digest
                ):
                    if self._claim_suspends:
                        with anyio.CancelScope(shield=True):
                            outcome = await self._claim(t, takeover)
                    else:
                        outcome = await self._claim(t, takeover)
            except CorruptRecord:
                raise self._corrupt(t, "the stored record is unreadable") from None
            except Exception as exc:
                self._claim_failed(t, exc, held_elsewhere=held_elsewhere)
                return None  # store down and the author chose fail-open
            status = outcome.status
            if status is ClaimStatus.CLAIMED:
                return await self._run(t, outcome, execute, error_result, takeover, started)
            if status is ClaimStatus.REPLAY:
                if outcome.result is None:
                    raise self._corrupt(t, "a completed record holds no result")
                replay = self._replayed(t, outcome.result, outcome.completed_at, outcome.attempts)
                if t.derived and outcome.fence is not None:
                    # Handed to this re-send by the claim: marked delivered unless it goes too.
                    await self._answered(t, outcome.fence, delivered=True, first=t.as_resend)
                return replay
            if status is ClaimStatus.MISMATCH:
                if t.legacy_fingerprint is not None:
                    # Maybe a record written before numbers compared by value: it holds the
                    # float as written. Claimed once more with that; another mismatch refuses.
                    t.fingerprint, t.legacy_fingerprint = t.legacy_fingerprint, None
                    continue
                t.trace.outcome(Outcome.KEY_REUSED)
                raise errors.key_reused(t.key)
            if status is ClaimStatus.UNKNOWN:
                if outcome.turned_unknown:
                    self._turned_unknown(
                        t, "its last lease ran out mid-call (the worker died or hung)"
                    )
                if not reconciled and reconciler_for(self.policy.reconcile, t.tool) is not None:
                    reconciled = True
                    claimed_at = loop_time()
                    resolution = await self._reconcile(t)
                    if resolution is None or resolution.answer == LOST.answer:
                        continue  # resolved (or being resolved) elsewhere: claim again
                    if resolution.claim is not None:  # not happened: run it, once
                        # Its completion (or release) writes the answer in the history.
                        with saying(reconciled=resolution.answer):
                            return await self._run(
                                t, resolution.claim, execute, error_result, takeover, claimed_at
                            )
                    done = resolution.replay
                    if done is not None and done.result is not None:
                        return self._replayed(
                            t, done.result, done.completed_at, done.attempts, reconciled=True
                        )
                t.trace.outcome(Outcome.UNKNOWN)
                raise errors.outcome_unknown(t.key, await self._unknown_because(t))
            # BUSY: another attempt holds the claim. Wait for it (bounded), then look again.
            held_elsewhere = True
            remaining = deadline - loop_time()
            if remaining <= 0:
                t.trace.outcome(Outcome.IN_PROGRESS)
                raise errors.in_progress(t.key, _hint(outcome.retry_after))
            t.trace.waited()
            # Look again no later than the running lease's end: a dead worker is noticed then.
            lease_left = outcome.retry_after if outcome.retry_after is not None else remaining
            found = await self._wait(t, min(remaining, lease_left + 0.01))
            if (
                t.derived
                and found is not None
                and found.delivered
                and found.state is RecordState.COMPLETED
                and found.result is not None
                and found.fingerprint == t.fingerprint
            ):
                # A keyless call that arrived while its twin ran is a re-send (a client that
                # dispatches twice): it gets the twin's answer, where a claim now would take a
                # delivered one for a repeat. One its caller gave up on is claimed again: the
                # claim replays it and hands it over (delivered from then on).
                replay = self._replayed(t, found.result, found.completed_at, found.attempts)
                await self._answered(t, found.fence, delivered=True, first=False)
                return replay
            started = loop_time()

    async def _reconcile(self, t: _Ticket) -> Resolution | None:
        """Reconcile the ticket's UNKNOWN record with the tool's reconciler (rule 19); None when
        the record is no longer UNKNOWN by the time it is read. A store failure leaves the
        record as it is: the answer is then -32012, as without a reconciler."""
        reconciler = reconciler_for(self.policy.reconcile, t.tool)
        store = self.store
        assert reconciler is not None and isinstance(store, ReconcilingStore)
        record = await self._peek(t)
        if (
            record is None
            or record.state is not RecordState.UNKNOWN
            or record.fingerprint != t.fingerprint
        ):
            return None
        try:
            # Its claimed event, as above.
            with saying(scope=t.scope_digest, server=t.server or None):
                resolution = await resolve(
                    store,
                    record,
                    reconciler,
                    tool=t.tool,
                    key=t.key,
                    arguments=t.arguments,
                    convert=t.convert,
                    timeout=self.policy.reconcile_timeout,
                    lease=self.policy.lease,
                    retention=t.retention,
                )
        except CorruptRecord:
            raise self._corrupt(t, "the stored record is unreadable") from None
        except Exception as exc:
            t.trace.store_error("reconcile", exc)
            t.log(
                logging.WARNING,
                "reconcile_unknown",
                "could not reconcile (%s); the record stays UNKNOWN",
                type(exc).__name__,
            )
            return Resolution(Verdict.UNKNOWN.value)
        if resolution.answer == Verdict.UNKNOWN.value:
            t.log(
                logging.WARNING,
                "reconcile_unknown",
                "the reconciler could not decide; the record stays UNKNOWN",
            )
        else:
            t.log(
                logging.INFO,
                "reconciled",
                "the reconciler answered %s",
                resolution.answer,
            )
        if t.trace.recording:
            t.trace.set(reconciled=resolution.answer)
        return resolution

    def _claim(self, t: _Ticket, takeover: bool) -> Awaitable[ClaimOutcome]:
        """The store's claim of the ticket's record (naming the tool where the store can)."""
        if t.derived:  # only where the store keeps the delivery mark (`_knows_resends`)
            # The same request delivered twice, or one received before the record's answer
            # first reached its caller, replays whatever the delivery (answers.py).
            t.as_resend = not (
                answers.answered(t.request, t.store_key)
                or answers.received_before(t.request, t.store_key)
            )
            return self.store.claim(
                t.store_key,
                t.fingerprint,
                lease=self.policy.lease,
                takeover=takeover,
                tool=t.tool,
                resend_only=t.as_resend,
            )
        if self._names_tools:
            return self.store.claim(
                t.store_key, t.fingerprint, lease=self.policy.lease, takeover=takeover, tool=t.tool
            )
        lease = self.policy.lease
        return self.store.claim(t.store_key, t.fingerprint, lease=lease, takeover=takeover)

    def _claim_failed(self, t: _Ticket, exc: Exception, *, held_elsewhere: bool) -> None:
        """The claim could not be made: returns only to run unprotected (`fail_open`, the store
        down); otherwise raises the caller's answer.

        Once another attempt was seen holding the claim (`held_elsewhere`), a store failure is
        answered IN_PROGRESS, never STORE_UNAVAILABLE ("the tool was not run" would be untrue:
        the other attempt may be running it) and never by running the tool unprotected.
        """
        t.trace.store_error("claim", exc)
        if held_elsewhere:
            raise self._held_elsewhere(t, "claiming", exc) from None
        if isinstance(exc, StoreError) and self.policy.fail_open:
            logger.warning(
                "key store unavailable (%r); running tool %r UNPROTECTED (fail_open=True)",
                exc,
                t.tool,
            )
            t.trace.outcome(Outcome.UNPROTECTED)
            return
        if not isinstance(exc, StoreError):
            logger.exception("the key store failed unexpectedly while claiming")
        else:
            logger.warning("key store unavailable while claiming: %r", exc)
        t.trace.outcome(Outcome.STORE_UNAVAILABLE)
        raise errors.store_unavailable(t.key) from None

    async def _wait(self, t: _Ticket, timeout: float) -> Record | None:
        """Wait for the attempt that holds the claim; a store failure meanwhile is IN_PROGRESS."""
        try:
            return await self.store.wait(t.store_key, timeout=timeout)
        except CorruptRecord:
            raise self._corrupt(t, "the stored record is unreadable") from None
        except Exception as exc:
            t.trace.store_error("wait", exc)
            raise self._held_elsewhere(t, "waiting", exc) from None

    def _held_elsewhere(self, t: _Ticket, doing: str, exc: Exception) -> MCPError:
        """The store failed while another attempt holds the claim: that attempt may be running
        the tool, so the answer is IN_PROGRESS (the client retries, and the retry replays or
        waits again), never STORE_UNAVAILABLE, which would tell the client the tool did not run."""
        logger.warning(
            "key store unavailable while %s for the attempt that holds record %s: %r",
            doing,
            record_name(t.store_key),
            exc,
        )
        t.trace.outcome(Outcome.IN_PROGRESS)
        return errors.in_progress(t.key, RETRY_HINT_CAP)

    async def _run(
        self,
        t: _Ticket,
        outcome: ClaimOutcome,
        execute: Execute,
        error_result: ErrorResult,
        takeover: bool,
        claimed_at: float,
    ) -> ToolResult:
        token = outcome.token
        assert token is not None
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
        except anyio.get_cancelled_exc_class():
            # Cancelled before its tool started: the fresh claim is given back, nothing ran.
            await self._release(t, token, "cancelled before the tool started", "cancelled")
            raise
        policy = self.policy
        if outcome.took_over:
            t.trace.set(took_over=True)
            t.log(
                logging.WARNING,
                "taken_over",
                "took over its expired lease (execution %d)",
                outcome.attempts,
            )
        fence = outcome.fence
        assert fence is not None
        trace = t.trace
        if trace.recording:
            trace.set(fence=fence)
        claim = Claim(t.key, fence, outcome.attempts, t.store_key, t.tool)
        # The run's one scope: shielded from the request's cancellation (rule 10), cancelled by
        # the renewal service if the lease is lost or the tool outruns `max_run_time`, and, once
        # the tool has returned, if its result's first write outlasts the give-up time. Every
        # other await after it (retrying the write, releasing, looking the record up) has a
        # shield of its own.
        run_scope = anyio.CancelScope(shield=True)
        # Renewed by the event loop's shared renewal service (no task per call), from the claim
        # until the result is stored or given up (rule 11).
        keeper = keep_lease(
            self.store,
            t.store_key,
            token,
            lease=policy.lease,
            held_until=claimed_at + policy.lease,
            max_run_time=policy.max_run_time,
            run_scope=run_scope,
            trace=trace,
            tool=t.tool,
            server=t.server,
        )
        try:
            result: ToolResult | None = None
            raised: Exception | None = None
            stored: bool | None = None
            storing = False  # the result's write began inside the run's scope
            with run_scope:
                published = publish(claim)
                try:
                    result = await execute()
                except Exception as exc:  # what the tool raised, judged below
                    raised = exc
                finally:
                    withdraw(published)
                    keeper.tool_returned()
                if isinstance(result, CallToolResult) and not run_scope.cancel_called:
                    # The common case, stored where it ran: nothing cancels this scope now but
                    # the give-up time, so the first write needs no scope of its own.
                    storing = True
                    executed_at, upstream = origin(result)
                    delivered = t.derived and not await self._caller_gone(t, run_scope)
                    stored = await self._store(
                        t, token, result, executed_at, keeper, True, delivered, upstream
                    )
            if storing:
                # Only the renewal service, at the give-up time, cancels the scope once the
                # write began: a cancellation caught here is the first write cut off.
                if run_scope.cancelled_caught:
                    gave_up(t.store_key, 1, keeper.storing_since, keeper, trace)
            elif result is None and (raised is None or isinstance(raised, Interrupted)):
                keeper.end()
                cut = raised.why if isinstance(raised, Interrupted) else None
                return await self._after_abort(
                    t,
                    token,
                    takeover,
                    lease_lost=keeper.lost,
                    interrupted=cut,
                    lost=raised if isinstance(raised, OutcomeLost) else None,
                )
            elif isinstance(result, InputRequiredResult):
                # An input_required round is a question, not an outcome: never stored (rule 8).
                keeper.end()
                await self._release(t, token, "the tool asked for client input", "input_required")
                trace.outcome(Outcome.RELEASED)
                return result
            else:
                # What the tool raised, judged; or a result that came back despite the run's
                # cancellation (stored all the same, under a shield of its own).
                if raised is not None:
                    result = await self._judge(t, token, raised, error_result, keeper)
                assert isinstance(result, CallToolResult)
                executed_at, upstream = origin(result)
                delivered = t.derived and not await self._caller_gone(t, run_scope)
                stored = await self._store(
                    t, token, result, executed_at, keeper, False, delivered, upstream
                )
        finally:
            keeper.end()  # stored, given up, gone or released: nothing left to renew
        assert isinstance(result, CallToolResult)
        if stored is False:
            return await self._after_stale(t)
        trace.outcome(Outcome.EXECUTED)
        if stored and t.derived:
            await self._answered(t, fence, delivered=delivered, first=True)
        return stamped(
            result,
            key=t.key,
            key_source=t.source.value,
            # The upstream's replay is not an execution of the effect (rule 18).
            status="replayed" if upstream else "executed",
            executed_at=executed_at,
            attempts=outcome.attempts,
            stored=stored is True,
            upstream=upstream,
        )

    def _store(
        self,
        t: _Ticket,
        token: str,
        result: CallToolResult,
        executed_at: float,
        keeper: LeaseKeeper,
        in_run_scope: bool,
        delivered: bool,
        upstream: bool,
    ) -> Awaitable[bool | None]:
        """`complete.store_result` of the ticket's result (awaited by the caller: no frame)."""
        policy = self.policy
        return store_result(
            self.store,
            t.store_key,
            token,
            result,
            executed_at=executed_at,
            # A created task's record outlives the task (rule 23): its id stays findable.
            retention=task_retention(result, t.retention),
            max_bytes=policy.max_result_bytes,
            lease=policy.lease,
            keeper=keeper,
            trace=t.trace,
            in_run_scope=in_run_scope,
            delivered=delivered if t.derived else None,
            upstream_replayed=upstream,
        )

    @staticmethod
    async def _caller_gone(t: _Ticket, run_scope: anyio.CancelScope) -> bool:
        """Whether the caller gave up on this call while its tool ran (rule 15): it sent
        `notifications/cancelled`, or the request's scope was cancelled behind the run's shield
        (its connection or response stream closed, the server shutting down), or its HTTP
        client left (the 2025-era transport cancels nothing then). Its answer is then stored as
        not delivered, so the re-send it makes replays it."""
        return (
            cancel_requested(t.request)
            or cancelled_beyond(run_scope)
            or answers.gave_up(t.request)
            or await disconnected(t.request)
        )

    async def _answered(self, t: _Ticket, fence: int, *, delivered: bool, first: bool) -> None:
        """The derived key's answer is on its way to the caller: if the caller gave up on it
        after it was stored as `delivered` (it cancelled, or the request's scope was cancelled
        before the answer could be written), the record is marked not delivered (`abandon`,
        fenced on `fence`) so that the re-send replays it. A cancellation goes on after that.
        `first`: the caller had no answer of the record it kept (an execution, or a replay to a
        re-send), so the requests it already sent are no repeats of this one."""
        if not delivered:
            return
        if cancel_requested(t.request):
            await self._abandon(t, fence)
            return
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
        except anyio.get_cancelled_exc_class():
            await self._abandon(t, fence)
            raise
        if answers.gave_up(t.request) or await disconnected(t.request):
            # Its cancel came before it was in flight, or its HTTP client left.
            await self._abandon(t, fence)
            return
        # Handed out: a cancel that comes after it still reaches the record (answers.py).
        if first:
            answers.handed_first(t.request, t.store_key)
        answers.sent(t.request, self.store, t.store_key, fence)

    async def _abandon(self, t: _Ticket, fence: int) -> None:
        if answers.received_elsewhere(t.request, t.store_key, fence):
            return  # a twin of this request on the same connection was handed the answer
        with anyio.CancelScope(shield=True):
            try:
                await self.store.abandon(t.store_key, fence)
            except Exception as exc:
                t.trace.store_error("abandon", exc)
                logger.warning(
                    "could not mark the answer of record %s undelivered: %r; the caller's"
                    " re-send of it runs again",
                    record_name(t.store_key),
                    exc,
                )

    async def _judge(
        self,
        t: _Ticket,
        token: str,
        exc: Exception,
        error_result: ErrorResult,
        keeper: LeaseKeeper,
    ) -> CallToolResult:
        """The `isError` result to store for what the tool raised; or, when nothing a retry
        must not repeat happened, the claim released and the exception raised in its place."""
        if isinstance(exc, NothingDone):
            keeper.end()
            await self._release(t, token, f"nothing was done ({exc})", "before_body")
            t.trace.outcome(Outcome.RELEASED)
            raise exc.raised
        # A JSON-RPC error from the tool is a refusal, and an effect-free exception was declared
        # to happen before any effect: either way a retry must be free to run the tool again.
        if isinstance(exc, (MCPError, *self.policy.effect_free)):
            keeper.end()
            code = "tool_error" if isinstance(exc, MCPError) else "effect_free"
            await self._release(t, token, f"the tool raised {type(exc).__name__}", code)
            t.trace.outcome(Outcome.RELEASED)
            raise exc
        return error_result(exc)

    async def _release(self, t: _Ticket, token: str, why: str, code: str) -> None:
        """Give the claim back; `code` is why, as the record's released event says it."""
        with anyio.CancelScope(shield=True), saying(why=code):
            try:
                await self.store.release(t.store_key, token)
            except Exception as exc:
                t.trace.store_error("release", exc)
                logger.warning(
                    "could not release record %s (%s): %r; it settles when its lease expires",
                    record_name(t.store_key),
                    why,
                    exc,
                )

    async def _leave_unknown(self, t: _Ticket, token: str, lost: OutcomeLost) -> bool:
        """Turn the claim `token` holds UNKNOWN now (`OutcomeLost`), its why and whether it
        ended in the `interrupted` event; False when the store cannot (a `KeyStore` of one's own
        without `leave_unknown`: the lease settles it), the token no longer holds the record, or
        the store failed (logged; the lease settles it)."""
        leave = getattr(self.store, "leave_unknown", None)
        if not callable(leave):
            return False
        ended = "yes" if lost.ended else None
        why = lost.why[:MAX_WHY_CHARS]
        with anyio.CancelScope(shield=True), saying(why=why, ended=ended):
            try:
                return bool(await leave(t.store_key, token))
            except Exception as exc:
                t.trace.store_error("leave_unknown", exc)
                logger.warning(
                    "could not turn record %s UNKNOWN: %r; it turns UNKNOWN when its lease"
                    " runs out",
                    record_name(t.store_key),
                    exc,
                )
        return False

    async def _unknown_because(self, t: _Ticket) -> str:
        """Why the ticket's record is UNKNOWN, for a re-send's -32012: what its holder said when
        it gave the execution up (`OutcomeLost`: its `interrupted` event), else that a lease ran
        out. Read from the record's history only on this answer (never on the hot path), and
        only from a store that keeps one; a failed read leaves the lease's words."""
        store = self.store
        if isinstance(store, AuditedStore):
            with anyio.CancelScope(shield=True):
                try:
                    event = interruption(await store.history(t.store_key))
                except Exception as exc:
                    t.trace.store_error("history", exc)
                    event = None
            said = None if event is None else event.details.get("why")
            if said:
                return said
        return (
            "an earlier attempt stopped renewing its lease in the middle of the tool, and this"
            " tool is not declared safe to run twice"
        )

    def _turned_unknown(self, t: _Ticket, why: str) -> None:
        """Rule 25's alert: one WARNING per record turned UNKNOWN (event `in_doubt`), from the
        call that turned it, besides the one per -32012 answer (`unknown`, `log_answer`). The
        record is kept, without expiry, until it is settled or reconciled;
        `mcp_once_records_in_doubt` counts it meanwhile."""
        t.log(
            logging.WARNING,
            "in_doubt",
            "turned UNKNOWN: %s; kept, without expiry, until settled or reconciled"
            " (mcp-once keys list --state unknown)",
            why,
        )

    async def _peek(self, t: _Ticket) -> Record | None:
        record: Record | None = None
        with anyio.CancelScope(shield=True):
            try:
                record = await self.store.get(t.store_key)
            except Exception as exc:
                t.trace.store_error("get", exc)
        return record

    async def _after_abort(
        self,
        t: _Ticket,
        token: str,
        takeover: bool,
        *,
        lease_lost: bool,
        interrupted: str | None = None,
        lost: OutcomeLost | None = None,
    ) -> ToolResult:
        """The run was cut short mid-tool (lost lease, max run time, or the framework's own
        timeout: `interrupted`): say what is known. `lost`: the tool raised it, so the record
        turns UNKNOWN now unless a takeover may run it again."""
        t.trace.outcome(Outcome.ABORTED)
        if lease_lost:
            why = "it lost its lease (another worker took the record over, or it was declared lost)"
        elif interrupted is not None:
            why = interrupted
        else:
            why = f"it ran longer than the maximum run time of {self.policy.max_run_time:g} s"
        if lost is not None and not lease_lost and not takeover:
            # The tool said what happened (`OutcomeLost`): its words are the caller's answer,
            # the record's `interrupted` event and its `in_doubt` line; the -32012 answer has
            # its own line (`log_answer`), so no `cut_short` line says it a third time.
            if await self._leave_unknown(t, token, lost):
                self._turned_unknown(t, f"its execution was cut short because {why}")
                raise errors.outcome_unknown(t.key, lost.why)
        elif not lease_lost:  # else the lost lease was logged as it was found (lease.py)
            t.log(logging.WARNING, "cut_short", "cancelled the running tool: %s", why)
        record = await self._peek(t)
        if record is not None and record.fingerprint == t.fingerprint:
            if record.state is RecordState.COMPLETED and record.result is not None:
                return self._replayed(t, record.result, record.completed_at, record.attempts)
            if record.state is RecordState.IN_PROGRESS and (record.token != token or takeover):
                raise errors.in_progress(t.key, _hint(None))
        if lost is None:
            why = f"the attempt was cancelled mid-execution because {why}"
        raise errors.outcome_unknown(t.key, lost.why if lost is not None else why)

    async def _after_stale(self, t: _Ticket) -> ToolResult:
        """The tool finished after its claim had passed to another attempt: that attempt's
        answer is the key's answer, so this one is discarded and the record's is served."""
        t.trace.outcome(Outcome.STALE)
        t.log(
            logging.WARNING,
            "stale",
            "taken over while this attempt ran; its result was discarded",
        )
        with anyio.CancelScope(shield=True):
            record = await self._wait(t, self.policy.wait)
        if record is not None and record.fingerprint == t.fingerprint:
            if record.state is RecordState.COMPLETED and record.result is not None:
                return self._replayed(t, record.result, record.completed_at, record.attempts)
            if record.state is RecordState.IN_PROGRESS:
                raise errors.in_progress(t.key, _hint(None))
        raise errors.outcome_unknown(
            t.key, "this attempt finished after its lease had passed to another attempt"
        )

    def _replayed(
        self,
        t: _Ticket,
        data: bytes,
        completed_at: float | None,
        attempts: int,
        *,
        reconciled: bool = False,
    ) -> CallToolResult:
        """The stored answer, stamped as a replay. `reconciled`: the answer a reconciler's
        `happened` just stored (rule 19), marked so; it is the system of record's answer, not a
        replay of the record's, so `on_replay` is not called for it."""
        try:
            stored = decode_result(data)
        except UnreadableResult as exc:
            raise self._corrupt(t, str(exc)) from None
        executed_at = stored.executed_at
        if executed_at is None:
            executed_at = completed_at if completed_at is not None else time.time()
        if reconciled:
            t.trace.outcome(Outcome.RECONCILED)
        else:
            t.trace.outcome(Outcome.REPLAYED)
            event = Replay(t.tool, max(0.0, time.time() - executed_at), attempts, t.source.value)
            replayed(self.policy.on_replay, event)
        return stamped(
            stored.result,
            key=t.key,
            key_source=t.source.value,
            status="replayed",
            executed_at=executed_at,
            attempts=attempts,
            reconciled=reconciled,
            upstream=stored.upstream_replayed,
        )

    def _corrupt(self, t: _Ticket, why: str) -> MCPError:
        t.trace.outcome(Outcome.CORRUPT)
        t.log(logging.ERROR, "corrupt", "cannot be read (%s); left untouched", why)
        return errors.corrupt_record(t.key)
