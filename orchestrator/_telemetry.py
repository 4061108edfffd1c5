"""Logs, spans and metrics of the retry loop.

Only names, numbers and classes are recorded: tool name, attempt number, failure kind, error type
and code, where the key came from. Never the key, the arguments, the results or error messages
(which can quote any of them). Names follow OpenTelemetry's semantic conventions for MCP where
they define one (`gen_ai.tool.name`, `mcp.method.name`, `error.type`,
`mcp.client.operation.duration`); ours live under `mcp_once.*`, the same names the server uses
(docs/observability.md lists them all).

Spans: one `mcp-once call {tool}` per logical call, current while it runs (so it sits under the
caller's span), and under it one `mcp-once attempt {tool}` per attempt, current while the
attempt runs: the MCP SDK's own CLIENT span for the request (`MCP send tools/call {tool}`), and
through the trace context it puts in `_meta` the server's spans, nest under the attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from mcp import MCPError
from opentelemetry import metrics, trace

from ._key import KeyKind
from ._report import CallReport, FailureKind, GiveUpReason

logger = logging.getLogger("orchestrator")

TOOL = "gen_ai.tool.name"
METHOD = "mcp.method.name"
ERROR_TYPE = "error.type"
#: The conventions' bucket boundaries for `mcp.client.operation.duration`, in seconds.
DURATION_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)

_tracer = trace.get_tracer("mcp-once.orchestrator")
_meter = metrics.get_meter("mcp-once.orchestrator")
_attempts = _meter.create_counter(
    "mcp_once.client.attempts", unit="{attempt}", description="tools/call attempts sent"
)
_retries = _meter.create_counter(
    "mcp_once.client.retries", unit="{retry}", description="attempts after the first"
)
_budget_exhausted = _meter.create_counter(
    "mcp_once.client.budget_exhausted",
    unit="{call}",
    description="calls that stopped retrying because the retry budget was spent",
)
_outcome_unknown = _meter.create_counter(
    "mcp_once.client.outcome_unknown",
    unit="{call}",
    description="calls that ended with OutcomeUnknown",
)
_reconnects = _meter.create_counter(
    "mcp_once.client.reconnects", unit="{session}", description="sessions opened by connect()"
)
_request_duration = _meter.create_histogram(
    "mcp.client.operation.duration",
    unit="s",
    description="Duration of one tools/call request (one attempt), sent to answered",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
)
_call_duration = _meter.create_histogram(
    "mcp_once.client.call.duration",
    unit="s",
    description="Duration of one logical tool call: every attempt, reconnection and wait",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
)


def error_type(error: BaseException) -> str:
    """`error.type` as the conventions spell it: a JSON-RPC error's code, else the class."""
    return str(error.code) if isinstance(error, MCPError) else type(error).__qualname__


def _failed(span: trace.Span, kind: str) -> None:
    span.set_attribute(ERROR_TYPE, kind)
    span.set_status(trace.Status(trace.StatusCode.ERROR, kind))


@contextmanager
def call_span(tool: str, key_source: KeyKind) -> Iterator[trace.Span]:
    """The logical call's span, current while the call runs. Its outcome is set by `ended`; an
    exception is recorded by class only (its message may quote the arguments)."""
    with _tracer.start_as_current_span(
        f"mcp-once call {tool}",
        attributes={TOOL: tool, METHOD: "tools/call", "mcp_once.key_source": key_source},
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except Exception as exc:
            _failed(span, error_type(exc))
            raise


def ended(span: trace.Span, report: CallReport, key_source: KeyKind) -> None:
    """What the call's span and `mcp_once.client.call.duration` say once the call is over."""
    span.set_attributes(
        {
            "mcp_once.outcome": report.outcome,
            "mcp_once.attempts": len(report.attempts),
            "mcp_once.replayed": report.replayed,
            "mcp_once.key_source": key_source,
        }
    )
    if report.give_up is not None:
        span.set_attribute("mcp_once.give_up_reason", report.give_up)
    if report.outcome == "is_error":
        _failed(span, "tool_error")
    _call_duration.record(report.elapsed, {TOOL: report.tool, "mcp_once.outcome": report.outcome})


@contextmanager
def attempt_span(tool: str, attempt: int, wait_before: float) -> Iterator[trace.Span]:
    """One attempt's span, current while it runs (reconnection, listing, the request)."""
    with _tracer.start_as_current_span(
        f"mcp-once attempt {tool}",
        attributes={
            TOOL: tool,
            METHOD: "tools/call",
            "mcp_once.attempt": attempt,
            "mcp_once.wait_before": wait_before,
        },
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def attempt_failed(
    span: trace.Span,
    tool: str,
    attempt: int,
    kind: FailureKind,
    error: BaseException,
    code: int | None,
) -> None:
    span.set_attribute("mcp_once.failure", kind)
    _failed(span, error_type(error))
    logger.debug(
        "tool %r attempt %d failed: %s %s%s",
        tool,
        attempt,
        kind,
        type(error).__name__,
        f" code {code}" if code is not None else "",
    )


def attempt_sent(tool: str, attempt: int) -> None:
    _attempts.add(1, {TOOL: tool})
    if attempt > 1:
        _retries.add(1, {TOOL: tool})


def request_done(tool: str, seconds: float, error: str | None) -> None:
    """One tools/call request answered (or failed): `mcp.client.operation.duration`."""
    labels = {METHOD: "tools/call", TOOL: tool}
    if error is not None:
        labels[ERROR_TYPE] = error
    _request_duration.record(seconds, labels)


def retrying(tool: str, attempt: int, wait: float) -> None:
    logger.debug(
        "retrying tool %r as attempt %d in %.3fs",
        tool,
        attempt,
        wait,
        extra={"mcp_once_tool": tool, "mcp_once_attempt": attempt, "mcp_once_wait": wait},
    )


def gave_up(tool: str, attempts: int, reason: GiveUpReason, unknown: bool) -> None:
    if reason == "budget":
        _budget_exhausted.add(1, {TOOL: tool})
    if unknown:
        _outcome_unknown.add(1, {TOOL: tool, "mcp_once.give_up_reason": reason})
        logger.warning("outcome of tool %r unknown after %d attempt(s): %s", tool, attempts, reason)
    else:
        logger.info("tool %r not executed after %d attempt(s): %s", tool, attempts, reason)


def reconnected() -> None:
    _reconnects.add(1)
