"""What happened during one logical call, for the caller to inspect or log.

A report names errors by type and code only: messages and data can quote tool arguments or
results, which must never leak into logs through a report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: How one attempt failed, from the client's point of view (see the contract's decision table).
FailureKind = Literal[
    "never_sent",  # provably did not reach the server: safe to resend for any tool
    "maybe_executed",  # sent, no answer: the tool may have run
    "in_progress",  # the server says another attempt with this key is running (-32010)
    "store_unavailable",  # the server's key store is down; the tool did not run (-32013)
    "permanent",  # an answer that no retry can change
]

#: How the whole call ended.
CallOutcome = Literal[
    "result",  # a CallToolResult with isError false
    "is_error",  # a CallToolResult with isError true (returned, never retried)
    "input_required",  # an InputRequiredResult: the server's question (returned, never retried)
    "outcome_unknown",  # OutcomeUnknown was raised
    "not_executed",  # NotExecuted was raised
    "error",  # a permanent error was raised
    "cancelled",  # the caller was cancelled
]

#: Why retrying stopped before a result arrived.
GiveUpReason = Literal[
    "not_idempotent",  # the gate is closed for this tool
    "attempts",  # max_attempts reached
    "deadline",  # no time left for another attempt (or for the server's retry hint)
    "budget",  # the shared retry budget is spent
    "no_connect",  # the session is gone and there is no connect factory to replace it
    "server",  # the server itself reported the outcome unknown (-32012)
    "resumed_intent",  # a resumed run's journal holds the call unanswered; not safe to resend
    "resumed_done",  # a resumed run's journal holds the call answered; not safe to resend
]


@dataclass(frozen=True, slots=True)
class AttemptReport:
    """One attempt: which session generation it used and how it ended."""

    number: int
    #: Seconds waited (backoff or server hint) before this attempt was sent.
    wait_before: float
    #: Which session the attempt used: 0 is the first, each reconnection adds one.
    generation: int
    #: None when the attempt returned a result.
    failure: FailureKind | None = None
    error_type: str | None = None
    #: JSON-RPC error code, when there was one.
    code: int | None = None
    #: HTTP status behind the error, when the retry-aware HTTP transport saw one.
    http_status: int | None = None
    #: The server's retry hint in seconds, as received (before clamping).
    retry_after: float | None = None


@dataclass(frozen=True, slots=True)
class CallReport:
    """One logical call: its key, its attempts and how it ended."""

    tool: str
    key: str
    outcome: CallOutcome
    attempts: tuple[AttemptReport, ...]
    #: Seconds spent waiting between attempts (the planned waits; zero sleeps under testing()).
    total_wait: float
    #: Seconds from the call to its end, on the anyio clock.
    elapsed: float
    #: True when the server answered from its idempotency record instead of running the tool.
    replayed: bool = False
    #: Sessions opened through `connect` during this call.
    connects: int = 0
    give_up: GiveUpReason | None = None

    @property
    def retries(self) -> int:
        return max(0, len(self.attempts) - 1)
