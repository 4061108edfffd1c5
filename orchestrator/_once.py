"""One attempt of a keyed `tools/call` that the caller sends by its own means, judged as
`RetryingSession` judges each of its attempts.

Why: a caller that forwards calls as they are (a proxy's fast path, which sends the request raw
and reads the answer once) still has to tell a request that never left, or that the server
refused before running it, from one that may have run. Over streamable HTTP only the retry-aware
transport (`RetryAwareTransport`) sees that, on the attempt's probe, and only the classifier reads
it; this is their one public door, so that no caller writes a second classifier. No retry, no
report, no span: a caller that wants them (or wants the call re-sent after "not executed") hands
the call to a `RetryingSession`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from mcp import MCPError

from idempotency import wire

from ._classify import classify
from ._http import AttemptProbe, current_probe
from ._outcome import NotExecuted, OutcomeUnknown, ServerOutcomeUnknown, tool_call_error

T = TypeVar("T")


async def attempt_once(
    send: Callable[[], Awaitable[T]],
    *,
    tool: str,
    key: str,
    attempt: int = 1,
    closed: Callable[[], bool] = lambda: False,
) -> T:
    """`send()`'s answer: one attempt of the `tools/call` of `tool` whose `_meta` carries `key`
    and `attempt` (`idempotency.wire.KEY_META`, `ATTEMPT_META`), sent by `send` in this task
    (over HTTP on a `RetryAwareTransport`, which then notes whether the request left).

    `closed()` says whether the session can send no more, read right after a failure.

    Raises, as `RetryingSession.call_tool` would after this one attempt with no retry:
        NotExecuted: the tool provably did not run: the request never left (connection
            refused, the server does not know the session: its 404), or the server's own store
            was unavailable (-32013). Safe to send again, on a fresh session if it was the 404.
        OutcomeUnknown: it may have run (the answer was lost or timed out, the server says the
            key is in flight); `ServerOutcomeUnknown` when the server says so itself (-32012).
        ToolCallError: the server's answer is a JSON-RPC error no retry changes.
        Anything else `send` raised (a result that is not MCP's: the session's
        `ValidationError`) as it came.
    """
    probe = AttemptProbe(key, attempt)
    token = current_probe.set(probe)
    try:
        return await send()
    except Exception as exc:
        failure = classify(exc, probe, session_closed=closed())
        error = failure.error
        if failure.kind in ("never_sent", "store_unavailable"):
            raise NotExecuted(
                tool=tool, key=key, attempts=1, last_error=error, reason="attempts"
            ) from exc
        if failure.kind != "permanent":
            raise OutcomeUnknown(
                tool=tool, key=key, attempts=1, last_error=error, reason="attempts"
            ) from exc
        if not isinstance(error, MCPError):
            raise
        if error.code == wire.OUTCOME_UNKNOWN:
            raise ServerOutcomeUnknown(tool=tool, key=key, attempts=1, last_error=error) from exc
        raise tool_call_error(
            error, tool=tool, key=key, attempts=1, http_status=failure.http_status
        ) from exc
    finally:
        current_probe.reset(token)
