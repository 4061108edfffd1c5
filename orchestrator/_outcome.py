"""What a caller gets when a call does not end with a result.

Two different truths need two different exceptions: `OutcomeUnknown` (the tool may have run; do
not guess, reconcile using the key) and `NotExecuted` (it provably did not run; resending with the
same key later is safe). Permanent server errors stay `MCPError`s, so existing handlers keep
working, but gain the key, the attempts and the report.
"""

from __future__ import annotations

from typing import Any

from mcp import MCPError

from idempotency import wire

from ._http import TransportFailed
from ._reconnect import ReconnectFailed
from ._report import CallReport, GiveUpReason

_REASONS: dict[str, str] = {
    "not_idempotent": (
        "the tool is not marked idempotentHint or readOnlyHint (or an override says never)"
    ),
    "attempts": "all attempts are used",
    "deadline": "the deadline leaves no time for another attempt",
    "budget": "the retry budget for this server is spent",
    "no_connect": "the session is closed and no connect factory was given",
    "server": "the server reports the outcome of an earlier attempt as unknown",
    "resumed_intent": (
        "the run's journal shows an earlier process sent this call without learning its outcome,"
        " and the tool is not safe to send again (not guarded, not annotated idempotentHint or"
        " readOnlyHint)"
    ),
    "resumed_done": (
        "the run's journal shows an earlier process sent this call and got its answer (results"
        " are not journalled), and the tool is not safe to send again (not guarded, not"
        " annotated idempotentHint or readOnlyHint)"
    ),
}


def _describe(error: BaseException | None) -> str:
    """The last error as the message shows it: a failure to reach the server in full (what went
    wrong and the URL), a server's error by its type and code."""
    if error is None:
        return "none"
    if isinstance(error, TransportFailed | ReconnectFailed):
        return f"{type(error).__name__}: {error}"
    code = getattr(error, "code", None)
    return f"{type(error).__name__}" + (f" (code {code})" if isinstance(code, int) else "")


class _GaveUp(Exception):
    """What every "the wrapper stopped" exception carries, so a caller can reconcile by key."""

    #: How the message words the verdict: `{tool}` stands for the tool's quoted name.
    _verdict = ""

    def __init__(
        self,
        *,
        tool: str,
        key: str,
        attempts: int,
        last_error: BaseException | None,
        reason: GiveUpReason,
        report: CallReport | None = None,
    ) -> None:
        self.tool = tool
        self.key = key
        self.attempts = attempts
        self.last_error = last_error
        self.reason: GiveUpReason = reason
        self.report = report
        super().__init__(
            f"{self._verdict.format(tool=repr(tool))} after {attempts} attempt(s) with idempotency"
            f" key {key!r}: {_REASONS[reason]}; last error: {_describe(last_error)}"
        )


class OutcomeUnknown(_GaveUp):
    """The tool may or may not have run, and retrying is not allowed or not possible.

    Never a silent duplicate: reconcile with the server using `key` (a later call with the same key
    replays the stored result on a server that keeps idempotency records).
    """

    _verdict = "outcome of tool {tool} unknown"


class ServerOutcomeUnknown(OutcomeUnknown):
    """The server said OUTCOME_UNKNOWN (-32012): an earlier attempt's lease expired mid-run.

    Never retried blindly; keeps the server's `code`, `message` and `data`.
    """

    def __init__(
        self,
        *,
        tool: str,
        key: str,
        attempts: int,
        last_error: MCPError,
        report: CallReport | None = None,
    ) -> None:
        self.code: int = last_error.code
        self.message: str = last_error.message
        self.data: Any = last_error.data
        super().__init__(
            tool=tool,
            key=key,
            attempts=attempts,
            last_error=last_error,
            reason="server",
            report=report,
        )


class NotExecuted(_GaveUp):
    """The tool provably did not run: nothing reached the server, or the server refused to run it.

    Safe to try again later with the same key.
    """

    _verdict = "tool {tool} was not executed"


class ToolCallError(MCPError):
    """A permanent JSON-RPC error for a tool call: never retried; the server's code and data kept.

    An `MCPError` subclass, so `except MCPError` still catches it.
    """

    def __init__(
        self,
        code: int,
        message: str,
        data: Any = None,
        *,
        tool: str,
        key: str,
        attempts: int,
        http_status: int | None = None,
        report: CallReport | None = None,
    ) -> None:
        super().__init__(code, message, data)
        self.tool = tool
        self.key = key
        self.attempts = attempts
        self.http_status = http_status
        self.report = report


class KeyReused(ToolCallError):
    """KEY_REUSED (-32011): this key was already used with other arguments. A caller bug."""


class InvalidParams(ToolCallError):
    """Invalid params (-32602): a malformed or missing key, or bad arguments."""


def tool_call_error(
    error: MCPError,
    *,
    tool: str,
    key: str,
    attempts: int,
    http_status: int | None = None,
    report: CallReport | None = None,
) -> ToolCallError:
    """The most specific `ToolCallError` for a permanent error from the server."""
    cls: type[ToolCallError] = ToolCallError
    if error.code == wire.KEY_REUSED:
        cls = KeyReused
    elif error.code == wire.INVALID_PARAMS:
        cls = InvalidParams
    return cls(
        error.code,
        error.message,
        error.data,
        tool=tool,
        key=key,
        attempts=attempts,
        http_status=http_status,
        report=report,
    )
