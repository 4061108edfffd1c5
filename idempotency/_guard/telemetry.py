"""Logs, spans and counters of the guard. Never tool arguments, results or raw keys: they are the
caller's data. Records are named by a short prefix of their hashed store key instead."""

from __future__ import annotations

import enum
import logging
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import metrics, trace

logger = logging.getLogger("idempotency")

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


class Outcome(enum.StrEnum):
    EXECUTED = "executed"
    REPLAYED = "replayed"
    RELEASED = "released"
    CONFLICT = "conflict"
    UNKNOWN = "unknown"
    IN_PROGRESS = "in_progress"
    STORE_UNAVAILABLE = "store_unavailable"
    CORRUPT = "corrupt"
    UNPROTECTED = "unprotected"
    ABORTED = "aborted"
    STALE = "stale"
    INVALID = "invalid"


def crash_report(exc: BaseException) -> str:
    """Where an exception came from, without its message (which may quote the arguments)."""
    frames = "".join(traceback.format_tb(exc.__traceback__)).rstrip()
    return f"{type(exc).__module__}.{type(exc).__qualname__}\n{frames}"


def record_name(store_key: str) -> str:
    """A log-safe name for a record: enough to find it, nothing about the key or the tenant."""
    return store_key[:12]


class Trace:
    """One guarded call's span and its outcome counter."""

    def __init__(self, span: trace.Span, tool: str) -> None:
        self._span = span
        self._tool = tool
        self._done = False

    def set(self, **attributes: Any) -> None:
        for name, value in attributes.items():
            if value is not None:
                self._span.set_attribute(f"mcp_once.{name}", value)

    def outcome(self, outcome: Outcome) -> None:
        if self._done:
            return
        self._done = True
        self._span.set_attribute("mcp_once.outcome", outcome.value)
        count_outcome(self._tool, outcome)

    def waited(self) -> None:
        self._span.set_attribute("mcp_once.waited", True)
        _waits.add(1, {"mcp_once.tool": self._tool})

    def store_error(self, operation: str, exc: BaseException) -> None:
        _store_errors.add(1, {"mcp_once.operation": operation, "error.type": type(exc).__name__})
        self._span.add_event("store_error", {"operation": operation, "type": type(exc).__name__})


class _Untraced(Trace):
    """The trace of a call made while no tracer provider is set: the counters as always, and
    none of the no-op span calls (the API would hand out `INVALID_SPAN` anyway)."""

    def set(self, **attributes: Any) -> None:
        pass


def _tracing_on() -> bool:
    """Whether a tracer provider is set. The guard's tracer is the API's proxy, which asks
    exactly this (the API's global provider) on every span and answers `INVALID_SPAN` while it is
    unset; should the API ever drop that global, the answer is "on" and spans go the long way."""
    return getattr(trace, "_TRACER_PROVIDER", True) is not None


#: The trace of a ticket not yet protected: records nothing (replaced once the span opens).
NO_TRACE = Trace(trace.INVALID_SPAN, "")


def count_outcome(tool: str, outcome: Outcome) -> None:
    """Count one guarded call's outcome. A call the guard passed through is counted this way
    alone (`Outcome.UNPROTECTED`): no span, no log line."""
    _outcomes.add(1, {"mcp_once.tool": tool, "mcp_once.outcome": outcome.value})


@contextmanager
def traced(tool: str) -> Iterator[Trace]:
    """The guard's span for one protected call: a child of the framework's request span that is
    never made current. The framework's own spans (FastMCP enriches its request span only while
    that span is current) and the tool's spans keep the parent they have without the guard, so
    a guarded call has exactly one SERVER span, the framework's, with this one under it."""
    if not _tracing_on():
        yield _Untraced(trace.INVALID_SPAN, tool)
        return
    span = _tracer.start_span("mcp-once guard", attributes={"mcp_once.tool": tool})
    try:
        yield Trace(span, tool)
    except BaseException as exc:
        # As `start_as_current_span` would, without the exception's message (the arguments).
        span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
        raise
    finally:
        span.end()
