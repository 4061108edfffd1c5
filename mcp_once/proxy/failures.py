"""The upstream's failures as the guard judges them, and as the caller finally sees them.

Rule 18 of the contract, in the guard's own terms (no second judge):

- never sent (`NotExecuted` from the link) → `UpstreamNotSent`, declared effect-free, so the guard
  releases the claim; the caller gets STORE_UNAVAILABLE-coded "not run, retry after backoff"
  (-32013 is the contract's one code for "nothing ran, try again later"; its message says it was
  the upstream, not the store);
- maybe executed (`OutcomeUnknown`) → the guard's `OutcomeLost`: OUTCOME_UNKNOWN (-32012), nothing
  stored, the record UNKNOWN at once (left to its lease where `upstream_idempotent` allows a
  takeover);
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
"""

from __future__ import annotations

from mcp import MCPError

from idempotency import wire

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


class UpstreamNotSent(Exception):
    """The call never reached the upstream, and re-sending within the deadline did not help."""


class UpstreamRefused(Exception):
    """The upstream answered the call with a JSON-RPC error (`error`, kept as sent)."""

    def __init__(self, error: MCPError) -> None:
        super().__init__(f"the upstream refused the call with code {error.code}")
        self.error = error


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
