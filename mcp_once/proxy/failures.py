"""The upstream's failures as the guard judges them, and as the caller finally sees them.

Rule 18 of the contract, in the guard's own terms (no second judge):

- never sent (`NotExecuted` from the link) → `UpstreamNotSent`, declared effect-free, so the guard
  releases the claim; the caller gets STORE_UNAVAILABLE-coded "not run, retry after backoff"
  (-32013 is the contract's one code for "nothing ran, try again later"; its message says it was
  the upstream, not the store);
- maybe executed (`OutcomeUnknown`) → the guard's `OutcomeLost` (`UpstreamLost`, saying what
  happened in words: "the upstream process exited while the call ran; its effect may have
  happened"): OUTCOME_UNKNOWN (-32012) with those words, nothing stored, the record UNKNOWN at
  once (left to its lease where `upstream_idempotent` allows a takeover). Only a stdio child whose
  pipes closed is known to be gone (`ended`): its record may be settled as failed at once; an
  HTTP upstream whose stream broke may still be running the call;
- the upstream's own JSON-RPC error (`ToolCallError`) → `UpstreamRefused`, effect-free, released,
  and re-raised to the caller exactly as the upstream sent it (code, message, data);
- an `isError` result is a result: stored and replayed (rule 8).

An upstream that cannot be reached at all (down while the proxy starts, or while a listing is
due) is answered the same way: `UpstreamUnreachable`, -32013 with `data.upstream` "unreachable",
for `tools/list` as for a call. A listing error, not an empty listing: an empty list is a valid
answer that a client keeps (and acts on: "this server has no tools"), where an error says "ask
again"; it is what FastMCP's own proxy answers under its `provider_error_strategy="raise"`, the
setting it offers for a proxy that should surface upstream failures (its default, "warn", lists
nothing and answers a call "Unknown tool" as an `isError` result, which a client takes as the
tool's answer).

FastMCP wraps what a tool raises in a `ToolError`; `caller_error` finds ours again below it.

Each of these is a documented outcome, logged once as one line (`OnceProxyTool`, the guard), so
they are FastMCP's own `ToolError`s logged at DEBUG: FastMCP logs any other exception a tool
raises as an ERROR with a traceback (some hundred lines, boxed), and its own at their
`log_level`, without one.
"""

from __future__ import annotations

import logging

from fastmcp.exceptions import ToolError
from mcp import MCPError
from mcp_types import CONNECTION_CLOSED
from pydantic import ValidationError

from idempotency import OutcomeLost, wire
from orchestrator import OutcomeUnknown, TransportFailed

#: How long a caller should wait before re-sending a call the upstream never got (ms).
RETRY_AFTER_MS = 1000


class UpstreamUnreachable(MCPError):
    """The upstream cannot be reached now; nothing was sent to it. Retryable: -32013 with
    `data.upstream` "unreachable" and `retryAfterMs`, as the caller of a never-sent call gets."""

    def __init__(
        self, message: str = "The upstream server could not be reached. Retry later."
    ) -> None:
        super().__init__(
            wire.STORE_UNAVAILABLE,
            message,
            {"retryAfterMs": RETRY_AFTER_MS, "upstream": "unreachable"},
        )


class _Documented(ToolError):
    """A documented outcome: FastMCP logs it at DEBUG, without a traceback (see the module doc)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, log_level=logging.DEBUG)


class UpstreamNotSent(_Documented):
    """The call never reached the upstream, and re-sending within the deadline did not help."""


class UpstreamRefused(_Documented):
    """The upstream answered the call with a JSON-RPC error (`error`, kept as sent)."""

    def __init__(self, error: MCPError) -> None:
        super().__init__(f"the upstream refused the call with code {error.code}")
        self.error = error


class UpstreamLost(OutcomeLost, ToolError):
    """The call may have run upstream and will never say: the guard's `OutcomeLost`, whose `why`
    (words, no internal token) is the caller's message and the record's `interrupted` event."""

    def __init__(self, why: str, *, ended: bool) -> None:
        super().__init__(why, ended=ended)
        self.log_level = logging.DEBUG


#: Said of every maybe-executed call: what the caller and the operator must weigh.
_MAYBE = "its effect may have happened"


def upstream_lost(exc: OutcomeUnknown, *, stdio: bool) -> UpstreamLost:
    """The `OutcomeLost` of a call the link gave up on as maybe executed, in words: what broke,
    as far as the proxy saw it. `ended` only where the upstream is known to be gone (a stdio
    child whose pipes closed: it exited, or is killed as its session is replaced), so that
    nothing more can come of the call; an HTTP upstream may still be running it."""
    last = exc.last_error
    if exc.reason == "server":
        return UpstreamLost(
            f"the upstream itself reports the outcome of this call as unknown; {_MAYBE}",
            ended=False,
        )
    if isinstance(last, ValidationError):  # it answered, unreadably: nothing more will come
        return UpstreamLost(
            f"the upstream answered with a result that is not MCP's; {_MAYBE}", ended=True
        )
    closed = isinstance(last, MCPError) and last.code == CONNECTION_CLOSED
    if closed and stdio:
        return UpstreamLost(f"the upstream process exited while the call ran; {_MAYBE}", ended=True)
    if closed or isinstance(last, TransportFailed):
        what = "the connection to the upstream broke while the call ran"
    elif isinstance(last, TimeoutError):
        what = "the upstream did not answer in time"
    else:  # what it was is in the proxy's DEBUG log, with its traceback
        what = "the call to the upstream broke off while it ran"
    return UpstreamLost(f"{what}; {_MAYBE}", ended=False)


#: The exceptions the guard releases the claim for (its `effect_free` option).
EFFECT_FREE: tuple[type[Exception], ...] = (UpstreamNotSent, UpstreamRefused)


def _chain(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = [exc]
    while (cause := found[-1].__cause__) is not None and cause not in found:
        found.append(cause)
    return found


def caller_error(exc: BaseException) -> MCPError | None:
    """The JSON-RPC error the caller gets for an upstream failure below `exc`; None when `exc`
    is not one (it then propagates as FastMCP raised it)."""
    for raised in _chain(exc):
        if isinstance(raised, UpstreamRefused):
            error = raised.error
            return MCPError(error.code, error.message, error.data)
        if isinstance(raised, UpstreamNotSent):
            return UpstreamUnreachable(
                "The upstream server could not be reached; the tool was not run. Retry later."
            )
    return None
