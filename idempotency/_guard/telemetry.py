"""Logs, spans and metrics of the guard. Never tool arguments, results or raw keys: they are the
caller's data. Records are named by a short prefix of their hashed store key instead.

Names follow OpenTelemetry's semantic conventions for MCP where they define one
(`gen_ai.tool.name`, `mcp.method.name`, `error.type`, `mcp.server.operation.duration`); what is
ours lives under `mcp_once.*`, the same names the client library uses (docs/observability.md
lists them all). An outcome a record's history also names is named as the history names it
(`key_reused`, `in_progress`, `unknown`: `history.REFUSED`), so a metric, a log line and
`mcp-once audit` can be put side by side.

Log lines an operator alerts on (`log_about`): each names the record (`record_name`), the tool
and the server, in its message and as fields of the log record (`mcp_once_event`,
`mcp_once_record`, `mcp_once_tool`, `mcp_once_server`), for a handler that ships fields; never
a key, an argument or a result. Nothing is formatted unless the level is enabled.
"""

from __future__ import annotations

import enum
import logging
import time
import traceback
from typing import Any

from mcp import MCPError
from opentelemetry import metrics, trace
from opentelemetry.metrics import _internal as _metrics_api

from .. import wire

logger = logging.getLogger("idempotency")

#: The semantic conventions' names this module writes.
TOOL = "gen_ai.tool.name"
METHOD = "mcp.method.name"
ERROR_TYPE = "error.type"
#: The conventions' bucket boundaries for `mcp.*.operation.duration`, in seconds.
DURATION_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)

_tracer = trace.get_tracer("mcp-once.idempotency")
_meter = metrics.get_meter("mcp-once.idempotency")
_outcomes = _meter.create_counter(
    "mcp_once.server.calls",
    unit="{call}",
    description="Guarded tools/call requests by outcome",
)
_waits = _meter.create_counter(
    "mcp_once.server.waits",
    unit="{call}",
    description="Duplicates that waited for a running attempt",
)
_store_errors = _meter.create_counter(
    "mcp_once.server.store_errors",
    unit="{error}",
    description="Key store operations that failed",
)
_reconciliations = _meter.create_counter(
    "mcp_once.server.reconciliations",
    unit="{reconciliation}",
    description="Reconcilers asked about in-doubt records, by answer (and lost races)",
)
_duration = _meter.create_histogram(
    "mcp.server.operation.duration",
    unit="s",
    description="Duration of the tools/call requests the guard protected, claim to answer",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
)


class Outcome(enum.StrEnum):
    EXECUTED = "executed"
    REPLAYED = "replayed"
    RELEASED = "released"
    #: Refused: the key came with other arguments (-32011); the history's refusal code.
    KEY_REUSED = "key_reused"
    UNKNOWN = "unknown"
    IN_PROGRESS = "in_progress"
    STORE_UNAVAILABLE = "store_unavailable"
    CORRUPT = "corrupt"
    UNPROTECTED = "unprotected"
    ABORTED = "aborted"
    STALE = "stale"
    INVALID = "invalid"
    #: Answered from a record the system of record said happened (`reconcile=`, rule 19).
    RECONCILED = "reconciled"


def crash_report(exc: BaseException) -> str:
    """Where an exception came from, without its message (which may quote the arguments)."""
    frames = "".join(traceback.format_tb(exc.__traceback__)).rstrip()
    return f"{type(exc).__module__}.{type(exc).__qualname__}\n{frames}"


def record_name(store_key: str) -> str:
    """A log-safe name for a record: enough to find it, nothing about the key or the tenant."""
    return store_key[:12]


def log_about(
    level: int, event: str, store_key: str, tool: str, server: str, what: str, *args: object
) -> None:
    """One log line about a record: `event` (a stable name, for alert rules) and `what`
    (a %-format, with `args`) said of the record of `store_key`, of `tool` on `server`. The
    line starts with the record's name, so that one grep finds every line about it."""
    if not logger.isEnabledFor(level):
        return
    record = record_name(store_key)
    logger.log(
        level,
        f"record %s (tool %r, server %r): {what}",
        record,
        tool,
        server,
        *args,
        extra={
            "mcp_once_event": event,
            "mcp_once_record": record,
            "mcp_once_tool": tool,
            "mcp_once_server": server,
        },
    )


#: Why the guard answered -32012 itself, by the outcome it counted: fixed sentences, nothing of
#: the call's own (an `Interrupted`'s why is the framework's or the tool's, and not repeated).
_UNKNOWN_BECAUSE = {
    "unknown": "an earlier execution stopped mid-tool (its holder died or its lease ran out) and"
    " this tool is not safe to run twice",
    "aborted": "this execution was cut short mid-tool",
    "stale": "this execution finished after its lease had passed to another attempt",
}
#: The outcomes under which an IN_PROGRESS answer is the guard's own.
_HELD = frozenset({"in_progress", "aborted", "stale"})


def log_answer(outcome: Outcome | None, code: int, store_key: str, tool: str, server: str) -> None:
    """Log the guard's own refusal or OUTCOME_UNKNOWN answer to a caller: WARNING for -32012
    (someone must reconcile), INFO for -32011 and -32010 (the caller's doing, or load). An
    error the tool raised (`released`: passed on as the framework's) is not the guard's answer
    and is not logged here, whatever its code."""
    value = None if outcome is None else outcome.value
    if code == wire.OUTCOME_UNKNOWN and value in _UNKNOWN_BECAUSE:
        log_about(
            logging.WARNING,
            "unknown",
            store_key,
            tool,
            server,
            "answered OUTCOME_UNKNOWN (-32012): %s; reconcile the record or settle it",
            _UNKNOWN_BECAUSE[value],
        )
    elif code == wire.KEY_REUSED and outcome is Outcome.KEY_REUSED:
        log_about(
            logging.INFO,
            "key_reused",
            store_key,
            tool,
            server,
            "refused KEY_REUSED (-32011): the key came again with other arguments",
        )
    elif code == wire.IN_PROGRESS and value in _HELD:
        log_about(
            logging.INFO,
            "in_progress",
            store_key,
            tool,
            server,
            "refused IN_PROGRESS (-32010): another attempt holds the record",
        )


def error_type(exc: BaseException) -> str:
    """`error.type` as the conventions spell it: a JSON-RPC error's code, else the class."""
    return str(exc.code) if isinstance(exc, MCPError) else type(exc).__qualname__


class Trace:
    """One guarded call's span and its outcome counter."""

    #: Whether the span records anything (else attributes need not even be computed).
    recording = True

    def __init__(self, span: trace.Span, tool: str) -> None:
        self._span = span
        self._tool = tool
        self._done = False
        self.outcome_seen: Outcome | None = None

    def set(self, **attributes: Any) -> None:
        for name, value in attributes.items():
            if value is not None:
                self._span.set_attribute(f"mcp_once.{name}", value)

    def outcome(self, outcome: Outcome) -> None:
        if self._done:
            return
        self._done = True
        self.outcome_seen = outcome
        if self.recording:
            self._span.set_attribute("mcp_once.outcome", outcome.value)
            self._span.set_attribute("mcp_once.replayed", outcome is Outcome.REPLAYED)
        count_outcome(self._tool, outcome)

    def waited(self) -> None:
        self._span.set_attribute("mcp_once.waited", True)
        if _metrics_on():
            _waits.add(1, {TOOL: self._tool})

    def store_error(self, operation: str, exc: BaseException) -> None:
        kind = type(exc).__qualname__
        if _metrics_on():
            _store_errors.add(1, {"mcp_once.store.operation": operation, ERROR_TYPE: kind})
        self._span.add_event(
            "mcp_once.store_error", {"mcp_once.store.operation": operation, ERROR_TYPE: kind}
        )


class _Untraced(Trace):
    """The trace of a call made while no tracer provider is set: the counters as always, and
    none of the no-op span calls (the API would hand out `INVALID_SPAN` anyway)."""

    recording = False

    def set(self, **attributes: Any) -> None:
        pass


def _tracing_on() -> bool:
    """Whether a tracer provider is set. The guard's tracer is the API's proxy, which asks
    exactly this (the API's global provider) on every span and answers `INVALID_SPAN` while it is
    unset; should the API ever drop that global, the answer is "on" and spans go the long way."""
    return getattr(trace, "_TRACER_PROVIDER", True) is not None


def _metrics_on() -> bool:
    """Whether a meter provider is set. Until one is, the API's proxy instruments drop every
    measurement (and start forwarding once one is set, which this then answers "on" to): so
    building the labels and calling them is skipped. Should the API ever drop that global, the
    answer is "on" and every measurement goes the long way."""
    return getattr(_metrics_api, "_METER_PROVIDER", True) is not None


#: The trace of a ticket not yet protected: records nothing (replaced once the span opens).
NO_TRACE = Trace(trace.INVALID_SPAN, "")


def count_outcome(tool: str, outcome: Outcome) -> None:
    """Count one guarded call's outcome. A call the guard passed through is counted this way
    alone (`Outcome.UNPROTECTED`): no span, no log line."""
    if _metrics_on():
        _outcomes.add(1, {TOOL: tool, "mcp_once.outcome": outcome.value})


def count_reconciliation(tool: str, answer: str) -> None:
    """Count one reconciler's answer (`happened`, `not_happened`, `unknown`), or `lost`: its
    verdict found the record already resolved by another resolver, and changed nothing."""
    if _metrics_on():
        _reconciliations.add(1, {TOOL: tool, "mcp_once.reconcile.answer": answer})


class traced:
    """The guard's span for one protected call: a child of the framework's request span that is
    never made current. The framework's own spans (FastMCP enriches its request span only while
    that span is current) and the tool's spans keep the parent they have without the guard, so
    a guarded call has exactly one SERVER span, the framework's, with this one under it.

    Also records the call's `mcp.server.operation.duration` (the guarded part: claim, run or
    replay, answer), with its outcome. While no tracer provider is set, no span calls are made
    (the API would hand out `INVALID_SPAN`); while no meter provider is set, no measurements
    (the API's proxy instruments would drop them)."""

    __slots__ = ("_one", "_span", "_started", "_tool")

    def __init__(self, tool: str) -> None:
        self._tool = tool

    def __enter__(self) -> Trace:
        # A class rather than a `@contextmanager` generator: no generator frame per call.
        self._started = time.perf_counter()
        tool = self._tool
        if _tracing_on():
            self._span = _tracer.start_span(
                f"mcp-once guard {tool}", attributes={TOOL: tool, METHOD: "tools/call"}
            )
            self._one = Trace(self._span, tool)
        else:
            self._span = trace.INVALID_SPAN
            self._one = _Untraced(self._span, tool)
        return self._one

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        span, one = self._span, self._one
        failed = None if exc is None else error_type(exc)
        if one.recording:  # else the no-op `INVALID_SPAN`: nothing to mark or end
            if failed is not None:
                # As `start_as_current_span` would, without the exception's message (the
                # arguments).
                span.set_attribute(ERROR_TYPE, failed)
                span.set_status(trace.Status(trace.StatusCode.ERROR, failed))
            span.end()
        if not _metrics_on():
            return
        labels = {TOOL: self._tool, METHOD: "tools/call"}
        if one.outcome_seen is not None:
            labels["mcp_once.outcome"] = one.outcome_seen.value
        if failed is not None:
            labels[ERROR_TYPE] = failed
        _duration.record(time.perf_counter() - self._started, labels)
