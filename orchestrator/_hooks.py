"""The client's hooks: `RetryPolicy(on_retry=..., on_give_up=...)`, in the manner of tenacity's
`before_sleep` and stamina's instrumentation hooks, for a caller who wants to count, log or alert
in code of its own rather than through OpenTelemetry.

- `on_retry(RetryEvent)`: an attempt failed and another is coming; called before the wait.
- `on_give_up(error)`: retrying is over without a result; called with the `OutcomeUnknown` or
  `NotExecuted` about to be raised (it carries the key, for reconciling).

A hook never breaks a call: it runs inline, and an exception from it is logged (its type only,
at WARNING on the `orchestrator` logger) and swallowed; cancellation is never caught. Hooks are
plain functions, refused if they are coroutine functions: they are never awaited, so that a slow
hook cannot hold a retry. Keep them quick; hand slow work to a queue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from idempotency import wire

from ._outcome import NotExecuted, OutcomeUnknown
from ._report import FailureKind

logger = logging.getLogger("orchestrator")
E = TypeVar("E")


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """One retry about to happen, as `on_retry` sees it."""

    tool: str
    #: The number of the attempt that failed (1 = the first); the next one is `attempt + 1`.
    attempt: int
    #: How the attempt failed (see the contract's decision table).
    failure: FailureKind
    #: What the attempt raised. Its message may quote the call's arguments: the hook's code
    #: decides what to do with it (mcp-once's own logs record its type only).
    error: Exception
    #: Seconds the loop waits before the next attempt (backoff, or the server's hint).
    delay: float


RetryHook = Callable[[RetryEvent], object]
GiveUpHook = Callable[[OutcomeUnknown | NotExecuted], object]


def fire(name: str, hook: Callable[[E], object] | None, event: E) -> None:
    """Run `hook(event)` the way both sides run hooks (`wire.run_hook`)."""
    wire.run_hook(logger, name, hook, event)
