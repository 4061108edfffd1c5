"""`reconcile=`: ask the system of record what became of an in-doubt execution (rule 19).

A record turns UNKNOWN when a worker died in the middle of a tool that is not safe to run twice:
nobody *here* can tell whether the effect happened. The system the tool wrote to often can (a
payment provider looked up by the idempotency key the tool gave it, a row carrying the key). The
author's reconciler is asked, with an `InDoubt`, and answers with a `Reconciled`:

- `Reconciled.happened(value)`: the record is completed with `value`, converted exactly as the
  tool's own return value is, and the caller gets it as a replay marked `reconciled`;
- `Reconciled.not_happened()`: the record is taken over (fence one higher) and the tool runs, once;
- `Reconciled.unknown()` or None: the record stays UNKNOWN, and the caller gets -32012 as before.

This module holds the vocabulary and the asking (bounded by a timeout; a failure or a timeout is
an `unknown`, logged by exception class only, never with the arguments). The verdict is applied by
the store with fenced transitions: the record is claimed for its reconciliation
(`ReconcilingStore.reconcile`, fenced on the fence it was found UNKNOWN under) before the
reconciler is asked, and the verdict lands under that claim. Of concurrent resolvers (replicas,
an operator's `settle`) exactly one acts, and a stale one changes nothing.
"""

from __future__ import annotations

import enum
import functools
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
from mcp_types import CallToolResult

from .._stores.history import saying
from .._stores.store import ClaimOutcome, ClaimStatus, ReconcilingStore, Record
from .current_claim import downstream_key_of
from .replay import encode_result
from .telemetry import count_reconciliation, logger, record_name

#: Seconds a reconciler may take before its answer counts as unknown. A lookup by key at a
#: payment provider takes well under a second; ten leave room for one slow retry of its own and
#: stay inside the wait a duplicate is given (`Policy.wait`) and common client timeouts.
DEFAULT_RECONCILE_TIMEOUT = 10.0


class Verdict(enum.StrEnum):
    """What the system of record said; the values are the telemetry's `answer` attribute."""

    HAPPENED = "happened"
    NOT_HAPPENED = "not_happened"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class InDoubt:
    """An execution whose outcome is unknown, as a reconciler is asked about it."""

    #: The tool's name (FastMCP: as the guard names it, with its version where it has one).
    tool: str
    #: The idempotency key as the client sent it (or as the server derived it); None when no
    #: call brought it (`mcp-once keys reconcile`: records keep keys hashed only).
    key: str | None
    #: The record's store key (`current_claim().record`).
    record: str
    #: The fence of the execution that was lost (the record's fence while it is UNKNOWN).
    fence: int
    #: How many executions the record has seen, the lost one included.
    attempts: int
    #: The retry's arguments (their fingerprint matched the record's), or None where no call
    #: brought them (`mcp-once keys reconcile`).
    arguments: Mapping[str, Any] | None
    #: When the record was first claimed (seconds since the epoch, store clock).
    claimed_at: float
    #: When the lost execution's lease ran out (seconds since the epoch, store clock); None if
    #: the store does not know.
    lease_ended_at: float | None

    @property
    def downstream_key(self) -> str:
        """The lost execution's `current_claim().downstream_key`: what the tool handed its system
        of record as that system's own idempotency key, so the key to look the effect up by. A
        `not_happened` runs the tool under the same one (the same intent, rule 18)."""
        return downstream_key_of(self.record, self.fence, self.attempts)


@dataclass(frozen=True, slots=True)
class Reconciled:
    """A reconciler's answer. Build it with `happened`, `not_happened` or `unknown`."""

    verdict: Verdict
    #: `happened`: what the tool would have returned, converted as its own return value is.
    value: Any = None

    @classmethod
    def happened(cls, value: Any) -> Reconciled:
        """The effect happened; `value` is what the tool would have returned for it."""
        return cls(Verdict.HAPPENED, value)

    @classmethod
    def not_happened(cls) -> Reconciled:
        """The effect did not happen: the tool may run (once, under a higher fence)."""
        return cls(Verdict.NOT_HAPPENED)

    @classmethod
    def unknown(cls) -> Reconciled:
        """The system of record cannot tell: the record stays UNKNOWN for an operator."""
        return cls(Verdict.UNKNOWN)


#: A reconciler: async, or sync (run in a worker thread). None means `unknown()`.
Reconciler = Callable[[InDoubt], Awaitable[Reconciled | None] | Reconciled | None]
#: `reconcile=`: one reconciler for every guarded tool, or a mapping from tool name.
ReconcileOption = Reconciler | Mapping[str, Reconciler]


def check_option(option: object) -> None:
    """Refuse a `reconcile=` that could never be called, when the guard is built (loudly)."""
    if isinstance(option, Mapping):
        for name, fn in option.items():
            if not isinstance(name, str) or not callable(fn):
                raise TypeError("reconcile= maps tool names (str) to reconcilers (callables)")
    elif not callable(option):
        raise TypeError("reconcile= takes a reconciler or a mapping from tool name to one")


def check_timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"reconcile_timeout must be a number of seconds, not {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"reconcile_timeout must be positive and finite, not {value!r}")
    return float(value)


def tool_names(tool: str) -> tuple[str, ...]:
    """The names the tool of a record named `tool` goes by, most specific first: a versioned
    FastMCP tool is `name@version` in its records, a task's body `name#task-body`
    (`task_body.py`); a mapping by tool name may name either by the tool's name ('@' and '#'
    are never part of a conforming MCP tool name)."""
    base = tool.partition("#")[0]
    return (tool, base, base.partition("@")[0])


def reconciler_for(option: ReconcileOption | None, tool: str) -> Reconciler | None:
    """The reconciler of `tool` under `reconcile=` (None: the tool has none)."""
    if option is None:
        return None
    if isinstance(option, Mapping):
        return next((option[name] for name in tool_names(tool) if name in option), None)
    return option


async def ask(reconciler: Reconciler, doubt: InDoubt, *, timeout: float) -> Reconciled:
    """The reconciler's answer, within `timeout`; anything but a `Reconciled` (an exception, a
    timeout, a wrong type, None) is `unknown()`. Logged by class only: the exception's message
    and the arguments are the caller's data."""
    answer: object = None
    with anyio.move_on_after(timeout) as scope:
        try:
            if _is_async(reconciler):
                answer = await reconciler(doubt)  # type: ignore[misc]
            else:
                call = functools.partial(reconciler, doubt)
                answer = await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
                if inspect.isawaitable(answer):  # a callable object returning a coroutine
                    answer = await answer
        except Exception as exc:
            logger.warning(
                "the reconciler of tool %r raised %s; the record stays UNKNOWN",
                doubt.tool,
                type(exc).__name__,
            )
            return Reconciled.unknown()
    if scope.cancelled_caught:
        logger.warning(
            "the reconciler of tool %r gave no answer within %g s; the record stays UNKNOWN",
            doubt.tool,
            timeout,
        )
        return Reconciled.unknown()
    if answer is None:
        return Reconciled.unknown()
    if not isinstance(answer, Reconciled):
        logger.warning(
            "the reconciler of tool %r returned %s, not a Reconciled; the record stays UNKNOWN",
            doubt.tool,
            type(answer).__name__,
        )
        return Reconciled.unknown()
    return answer


def _is_async(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - a callable object's own method
    return call is not None and inspect.iscoroutinefunction(call)


#: Converts a `happened` value as the tool's own return value is converted (per entry point).
Convert = Callable[[Any], object]


def as_call_result(value: object) -> CallToolResult:
    """The default `Convert` (the low-level handler's): what `on_call_tool` may return, a
    `CallToolResult` or a mapping of one."""
    if isinstance(value, Mapping):
        return CallToolResult.model_validate(value)
    if isinstance(value, CallToolResult):
        return value
    raise TypeError(f"a happened value must be a CallToolResult here, not {type(value).__name__}")


def in_doubt(
    record: Record, *, tool: str, key: str | None, arguments: Mapping[str, Any] | None
) -> InDoubt:
    """What a reconciler is told about the UNKNOWN `record`."""
    return InDoubt(
        tool=tool,
        key=key,
        record=record.key,
        fence=record.fence,
        attempts=record.attempts,
        arguments=arguments,
        claimed_at=record.created_at,
        lease_ended_at=record.lease_deadline,
    )


def encoded(answer: Reconciled, convert: Convert, tool: str) -> bytes | None:
    """The stored form of a `happened` answer's value, converted as the tool's own return value
    is; None if it cannot be (logged by class: then the answer counts as unknown)."""
    try:
        result = convert(answer.value)
        if not isinstance(result, CallToolResult):
            raise TypeError(f"it converts to {type(result).__name__}, not a CallToolResult")
    except Exception as exc:
        logger.warning(
            "the happened value of tool %r's reconciler cannot be stored (%s); the record stays"
            " UNKNOWN",
            tool,
            type(exc).__name__,
        )
        return None
    return encode_result(result, time.time())


@dataclass(frozen=True, slots=True)
class Resolution:
    """What became of one reconciliation of an UNKNOWN record."""

    #: `happened`, `not_happened`, `unknown`, or `lost`: another resolver held or resolved the
    #: record first, and this one changed nothing (the telemetry's answer values).
    answer: str
    #: not_happened: the claim the reconciliation holds, fence one higher: its holder runs the
    #: tool under it (the guard) or releases it so the next retry runs it (`keys reconcile`).
    claim: ClaimOutcome | None = None
    #: happened: the stored answer, shaped as a claim's REPLAY.
    replay: ClaimOutcome | None = None


LOST = Resolution("lost")


async def resolve(
    store: ReconcilingStore,
    record: Record,
    reconciler: Reconciler,
    *,
    tool: str,
    key: str | None,
    arguments: Mapping[str, Any] | None,
    convert: Convert,
    timeout: float,
    lease: float,
    retention: float,
) -> Resolution:
    """Reconcile the UNKNOWN `record` (rule 19): claim it (`ReconcilingStore.reconcile`, fenced
    on its fence, so of concurrent resolvers one goes on and the others wait for its answer),
    ask the reconciler while holding it, and write the verdict: `complete` (happened),
    `leave_unknown` (unknown), or hand the claim back to the caller (not happened). Counted.

    Store failures propagate (the caller answers them); a cancellation while the record is held
    gives it back UNKNOWN first."""
    # Held for at least as long as the reconciler may take, so no one else takes it meanwhile.
    held_for = max(lease, timeout + lease / 3)
    with anyio.CancelScope(shield=True):  # a claim won but not heard would be an orphan
        taken = await store.reconcile(record.key, record.fingerprint, record.fence, lease=held_for)
    if taken is None:
        count_reconciliation(tool, LOST.answer)
        return LOST
    token = taken.token
    assert token is not None
    try:
        doubt = in_doubt(record, tool=tool, key=key, arguments=arguments)
        answer = await ask(reconciler, doubt, timeout=timeout)
    except BaseException:
        with anyio.CancelScope(shield=True), saying(reconciled=Verdict.UNKNOWN.value):
            await store.leave_unknown(record.key, token)
        raise
    verdict = answer.verdict
    result: bytes | None = None
    if verdict is Verdict.HAPPENED:
        result = encoded(answer, convert, tool)
        if result is None:
            verdict = Verdict.UNKNOWN
    if verdict is Verdict.NOT_HAPPENED:
        count_reconciliation(tool, verdict.value)
        return Resolution(verdict.value, claim=taken)
    # The verdict's transition writes it in the record's history (rule 20).
    with anyio.CancelScope(shield=True), saying(reconciled=verdict.value):
        if result is None:
            held = await store.leave_unknown(record.key, token)
        else:
            held = await store.complete(record.key, token, result, retention=retention)
    if not held:  # paused past its hold and taken from it: this verdict changed nothing
        count_reconciliation(tool, LOST.answer)
        logger.warning(
            "the reconciliation of record %s outlived its hold; its verdict changed nothing",
            record_name(record.key),
        )
        return LOST
    count_reconciliation(tool, verdict.value)
    if result is None:
        return Resolution(verdict.value)
    replay = ClaimOutcome(
        ClaimStatus.REPLAY,
        fence=taken.fence,
        result=result,
        completed_at=time.time(),
        attempts=taken.attempts,
    )
    return Resolution(verdict.value, replay=replay)
