"""What every agent-framework integration shares, so that they cannot drift apart.

A framework object (a FastMCP client, an Agents SDK server) reconnects on its own schedule, so the
integrations keep one `RetryingSession` per live connection of it (`PerConnection`), all spending
from one retry budget. Each framework has its own timeout setting, which becomes the per-attempt
timeout where the policy sets none (`attempt_timeout`). And when a call ends without a result, the
model must read the truth in words it cannot mistake for "try again" (`tell_model`).
"""

from __future__ import annotations

import dataclasses

from ._budget import RetryBudget
from ._key import KeySource
from ._outcome import NotExecuted, OutcomeUnknown
from ._policy import RetryPolicy
from ._run import Run
from ._session import RetryingSession, check_key_options
from ._sessions import SessionLike


def owned_policy(policy: RetryPolicy | None) -> RetryPolicy:
    """`policy` (default: `RetryPolicy()`) with a budget of its own pinned in place of
    "per-session": the sessions made for successive connections of one framework object then
    share one budget, as the calls to one server should."""
    if policy is None:
        policy = RetryPolicy()
    elif not isinstance(policy, RetryPolicy):
        raise TypeError(f"policy must be a RetryPolicy, not {type(policy).__name__}")
    if policy.budget == "per-session":
        return dataclasses.replace(policy, budget=RetryBudget())
    return policy


def attempt_timeout(
    explicit: float | None, policy: RetryPolicy, framework: float | None
) -> float | None:
    """The `read_timeout_seconds` to hand `RetryingSession.call_tool`.

    A timeout given for this call wins; then the policy's `attempt_timeout` (returned as None so
    the session applies it); then the framework's own read timeout setting (0 or None there means
    none, and the call may use the whole deadline).
    """
    if explicit is not None:
        return explicit
    if policy.attempt_timeout is not None or not framework:
        return None
    return framework


class PerConnection:
    """One `RetryingSession` per connection of a framework object, remade when it reconnects.

    A session's tool catalog and dead/alive state belong to one connection; the budget (pinned by
    `owned_policy`) belongs to the object and survives reconnection, and so do `key_source` and
    `run`.
    """

    def __init__(
        self,
        policy: RetryPolicy | None,
        key_source: KeySource | None = None,
        run: Run | None = None,
    ) -> None:
        check_key_options(key_source, run)
        self._policy = owned_policy(policy)
        self._key_source = key_source
        self._run = run
        self._connection: object = None
        self._session: RetryingSession | None = None

    @property
    def policy(self) -> RetryPolicy:
        return self._policy

    @property
    def key_source(self) -> KeySource | None:
        return self._key_source

    @property
    def run(self) -> Run | None:
        return self._run

    def session_for(self, connection: object, session: SessionLike) -> RetryingSession:
        """The `RetryingSession` over `session` for `connection` (the framework's live session)."""
        if self._session is None or self._connection is not connection:
            self._session = RetryingSession(
                session, policy=self._policy, key_source=self._key_source, run=self._run
            )
            self._connection = connection
        return self._session


def tell_model(error: OutcomeUnknown | NotExecuted) -> str:
    """What a model reads when a call ended without a result: never an invitation to repeat a
    call that may have run. The text names the tool, the key and the reason, never arguments."""
    if isinstance(error, OutcomeUnknown):
        return (
            f"OUTCOME UNKNOWN: {error}. The tool may have run and had its effect. Do not call it"
            " again to find out: that could repeat the effect. Report the outcome as unknown;"
            " it can be reconciled with the idempotency key above."
        )
    return f"NOT EXECUTED: {error}. The tool did not run; calling it again later is safe."
