"""Turn what the SDK raised for one attempt into the contract's decision classes.

The SDK reports failures in several shapes (its own error codes, synthetic errors standing in for
HTTP statuses, plain exceptions); the retry decision needs only: did the request provably not
reach the server, may the tool have run, did the server say "later", or is this final.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mcp import MCPError
from mcp_types import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    REQUEST_TIMEOUT,
)

from idempotency import wire

from ._http import AttemptProbe
from ._report import FailureKind

# The exact messages of errors the SDK makes up itself (mcp.client.streamable_http and
# mcp.shared.jsonrpc_dispatcher). A server sending the same code with another message is
# answering for itself, and is taken at its word.
_SDK_HTTP_ERROR = "Server returned an error response"
_SDK_CONNECTION_CLOSED = "Connection closed"
# HTTP 404 on a session id, as the SDK client synthesizes it, and as SDK servers (Python: -32600,
# TypeScript: -32001) put it in the body.
_SESSION_GONE = frozenset({"Session terminated", "Session not found"})


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt, classified."""

    kind: FailureKind
    error: Exception
    code: int | None = None
    http_status: int | None = None
    #: The server's retry hint in seconds, as received.
    retry_after: float | None = None
    #: The session can take no more requests and must be replaced before the next attempt.
    session_dead: bool = False


def _http_status_retryable(status: int) -> bool:
    return status in (408, 429) or 500 <= status <= 599


def _hint_from_data(data: Any) -> float | None:
    if not isinstance(data, dict):
        return None
    raw = data.get("retryAfterMs")
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        return None
    return max(0.0, float(raw) / 1000.0)


def _classify_mcp(error: MCPError, probe: AttemptProbe | None, closed: bool) -> Failure:
    code = error.code
    synthetic = error.data is None
    status = probe.status if probe is not None else None
    hint = probe.retry_after if probe is not None else None
    if (status == 404 and code != METHOD_NOT_FOUND) or (
        code in (INVALID_REQUEST, REQUEST_TIMEOUT) and error.message in _SESSION_GONE
    ):
        # The server does not know this session (it restarted, or expired it) and refused the
        # request at the HTTP layer, before dispatching it: never executed, session gone.
        return Failure("never_sent", error, code, status or 404, hint, session_dead=True)
    if code == REQUEST_TIMEOUT:
        # The request was written and its answer did not come in time; the SDK sent
        # notifications/cancelled, which a server may see only after the tool finished.
        return Failure("maybe_executed", error, code, session_dead=closed)
    if code == CONNECTION_CLOSED:
        # Our request was handed to the transport before the connection went (a session already
        # closed is caught before sending). The dispatcher's own "Connection closed" means the
        # session is finished; other -32000s (an HTTP response stream that broke) may leave it up.
        dead = closed or (synthetic and error.message == _SDK_CONNECTION_CLOSED)
        return Failure("maybe_executed", error, code, status, hint, session_dead=dead)
    if code == INTERNAL_ERROR and synthetic and error.message == _SDK_HTTP_ERROR:
        if probe is not None and probe.failure is not None:
            # No server answered: the SDK's error stands for our stand-in response. The caller
            # gets the transport failure itself (refused, DNS, TLS, timeout), with no code and
            # no status, since no server sent any.
            failed = probe.failure
            kind: FailureKind = "maybe_executed" if failed.sent else "never_sent"
            return Failure(kind, failed, session_dead=closed)
        # An HTTP error status without a JSON-RPC body. Without the retry-aware transport the
        # status is unknown: assume the worst that is still retryable, the tool may have run.
        if probe is not None and probe.sent is False:
            return Failure("never_sent", error, code, status, hint, session_dead=closed)
        if status is None or _http_status_retryable(status):
            return Failure("maybe_executed", error, code, status, hint, session_dead=closed)
        return Failure("permanent", error, code, status, hint)
    if code == wire.IN_PROGRESS:
        return Failure("in_progress", error, code, status, _hint_from_data(error.data))
    if code == wire.STORE_UNAVAILABLE:
        return Failure("store_unavailable", error, code, status, _hint_from_data(error.data))
    # Everything else is final, the contract's own KEY_REUSED, OUTCOME_UNKNOWN and CORRUPT_RECORD
    # included: the server would answer a retry the same way.
    return Failure("permanent", error, code, status)


def session_gone(error: BaseException) -> bool:
    """Whether `error` says the server no longer knows the session the request went on (it
    restarted, or expired it): refused before it was dispatched, so nothing ran, and the request
    may go again on a new session. For requests sent outside `RetryingSession.call_tool` (a
    proxy's raw forward), which classifies its own attempts."""
    if not isinstance(error, MCPError):
        return False
    failure = _classify_mcp(error, None, False)
    return failure.kind == "never_sent" and failure.session_dead


def classify(error: Exception, probe: AttemptProbe | None, *, session_closed: bool) -> Failure:
    """Classify the exception one attempt raised.

    `session_closed` is whether the session was seen closed right after the failure.
    """
    if isinstance(error, MCPError):
        return _classify_mcp(error, probe, session_closed)
    if isinstance(error, TimeoutError):
        # A transport's own bounded write gave up mid-send: the request may be out.
        return Failure("maybe_executed", error, session_dead=session_closed)
    return Failure("permanent", error)
