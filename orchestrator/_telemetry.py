"""Logs and OpenTelemetry counters for the retry loop.

Only names, numbers and classes are recorded: tool name, key, attempt number, failure kind, error
type and code. Never arguments, results or error messages (which can quote either).
"""

from __future__ import annotations

import logging

from opentelemetry import metrics

from ._report import FailureKind, GiveUpReason

logger = logging.getLogger("orchestrator")

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


def attempt_sent(tool: str, attempt: int) -> None:
    _attempts.add(1, {"mcp.tool.name": tool})
    if attempt > 1:
        _retries.add(1, {"mcp.tool.name": tool})


def attempt_failed(
    tool: str, key: str, attempt: int, kind: FailureKind, error: BaseException, code: int | None
) -> None:
    logger.debug(
        "tool %r attempt %d (key %r) failed: %s %s%s",
        tool,
        attempt,
        key,
        kind,
        type(error).__name__,
        f" code {code}" if code is not None else "",
    )


def retrying(tool: str, key: str, attempt: int, wait: float) -> None:
    logger.debug(
        "retrying tool %r (key %r) as attempt %d in %.3fs",
        tool,
        key,
        attempt,
        wait,
        extra={"mcp_once_tool": tool, "mcp_once_attempt": attempt, "mcp_once_wait": wait},
    )


def gave_up(tool: str, key: str, attempts: int, reason: GiveUpReason, unknown: bool) -> None:
    if reason == "budget":
        _budget_exhausted.add(1, {"mcp.tool.name": tool})
    if unknown:
        _outcome_unknown.add(1, {"mcp.tool.name": tool, "reason": reason})
        logger.warning(
            "outcome of tool %r unknown after %d attempt(s) (key %r): %s",
            tool,
            attempts,
            key,
            reason,
        )
    else:
        logger.info(
            "tool %r not executed after %d attempt(s) (key %r): %s", tool, attempts, key, reason
        )


def reconnected() -> None:
    _reconnects.add(1)
