"""Temporal: keys from the activity, refusals a retry cannot fix made final, retention checked.

Temporal runs an activity *at least once*: a worker killed after the MCP server ran the tool but
before Temporal recorded the answer gets the activity again (attempt 2, same `activity_id`). With
a key from `uuid4()` that second attempt is a new logical call and the tool runs twice. Here the
key comes from the activity itself:

- `activity_key`: a `KeySource` (`RetryingSession(client, key_source=activity_key)`) built from
  `activity.info()`: namespace, workflow id, workflow **run id** (Temporal restarts `activity_id`
  at "1" after Continue-As-New, so without it a new run would collide with the old one's keys)
  and `activity_id`, plus the call's ordinal among the keyed calls of this activity attempt (two
  MCP calls in one activity get two keys, the same two on every attempt). Hashed
  (`step_key_from`): run ids never reach the wire. Outside an activity it raises `RuntimeError`:
  a fresh key there would look keyed and protect nothing.
- `KeyedMCPClient`: an `mcp.Client` (same arguments, plus `policy=`) for `temporalio-mcp`'s
  `MCPPlugin({"shop": lambda: KeyedMCPClient(url)})`. Its `call_tool` goes through
  `RetryingSession` with `activity_key`, checks retention, and raises the `ApplicationError`s below.
  A key already in the call's `_meta` (a workflow-side resolver's) is kept, unless the model put
  one in the tool's key argument (the listing's `keyArgument`): the model's key is the call's
  (its own retry of an action is a new tool call, so only its key says "the same action"); the
  activity's or the resolver's key goes in that argument when the model left it out.
- `McpOnceInterceptor`: a worker interceptor mapping mcp-once's exceptions raised by any activity
  to those same `ApplicationError`s (for `RetryingSession` users; `KeyedMCPClient` maps its own).
- `activity_session(session)`: the session as `RetryingSession` should drive it inside an
  activity, with the retention check.

Errors (`ApplicationError.type`, see `ERROR_TYPES`): a refusal that a retry cannot fix must not
be retried by Temporal, whose default retry policy retries forever (`temporalio-mcp` makes every
unknown `MCPError` retryable: a `-32011` looped):

- `McpOnceKeyReused` (-32011, the key was used with other arguments: the activity is not
  deterministic in its arguments), `McpOnceOutcomeUnknown` (-32012, or the client's
  `OutcomeUnknown`: the tool may have run and resending is not known to be safe; reconcile by
  the key in the message), `McpOnceCorruptRecord` (-32014), `McpOnceRetentionPassed` (below):
  non-retryable.
- `McpOnceInProgress` (-32010) and `McpOnceStoreUnavailable` (-32013), as the last error of a
  call that gave up: retryable, with the server's `retryAfterMs` as `next_retry_delay`.
- Anything else keeps Temporal's default (a `NotExecuted` without those codes is retryable:
  nothing ran).

Retention: a guarded server keeps a completed record `retentionSeconds` (advertised in the
tool's listing, `_meta["io.github.mcp-once/idempotency"]`). An attempt > 1 whose activity was
first scheduled (`info().scheduled_time`, the first attempt's, from Temporal's clock) longer ago
than that, less a margin for clock skew (`retention_margin`), may find the record gone and would
silently run the tool again: it fails `McpOnceRetentionPassed` (non-retryable) before sending.
The first attempt is never checked (no earlier attempt can have used its keys). A tool listing
no retention (an unguarded server) is not checked: nothing would replay anyway.

Residual windows, by Temporal's design: a reset, Continue-As-New, or a new run of a closed
workflow id is a new run id and so new keys: those re-execute.

Needs the `temporal` extra (`pip install "mcp-once[temporal]"`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Final, NoReturn

from mcp import Client, MCPError
from mcp.shared.dispatcher import ProgressFnT
from mcp_types import CallToolResult, ListToolsResult, RequestParamsMeta
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from idempotency import wire

from ._catalog import advertised_retention, list_all_tools
from ._integration import PerConnection, attempt_timeout
from ._key import KeyRequest, Ordinals, adapter_key, step_key_from
from ._outcome import NotExecuted, OutcomeUnknown
from ._policy import RetryPolicy
from ._sessions import _SDK, SessionLike, ToolSession, tool_session

__all__ = [
    "ERROR_TYPES",
    "RETENTION_PASSED",
    "KeyedMCPClient",
    "McpOnceInterceptor",
    "activity_key",
    "activity_session",
    "application_error",
    "retention_margin",
]

#: `ApplicationError.type` per wire code (and for the two client-side verdicts).
ERROR_TYPES: Final = {
    wire.IN_PROGRESS: "McpOnceInProgress",
    wire.KEY_REUSED: "McpOnceKeyReused",
    wire.OUTCOME_UNKNOWN: "McpOnceOutcomeUnknown",
    wire.STORE_UNAVAILABLE: "McpOnceStoreUnavailable",
    wire.CORRUPT_RECORD: "McpOnceCorruptRecord",
}
_RETRYABLE: Final = frozenset({wire.IN_PROGRESS, wire.STORE_UNAVAILABLE})
_OUTCOME_UNKNOWN_TYPE: Final = ERROR_TYPES[wire.OUTCOME_UNKNOWN]
RETENTION_PASSED: Final = "McpOnceRetentionPassed"


# -- keys ------------------------------------------------------------------------------------


def _identity(info: activity.Info) -> tuple[str, ...]:
    """What names this activity the same way on every attempt, in every worker."""
    if info.workflow_id is not None and info.workflow_run_id is not None:
        return (
            "temporal",
            info.namespace,
            info.workflow_id,
            info.workflow_run_id,
            info.activity_id,
        )
    # A standalone activity (started by a client, not a workflow): its own run id.
    return ("temporal-activity", info.namespace, info.activity_id, info.activity_run_id or "")


#: One count per running activity attempt, keyed by the attempt's `activity.Info`: the SDK hands
#: every task of one attempt the same object and a new one to the next attempt, so ordinals
#: restart with each attempt and are shared by its sub-tasks. Why not `key_step`: a step must be
#: entered around the activity body, which a key source cannot do, and a counter set in a task's
#: context would not be seen by its sibling tasks.
_attempts = Ordinals()


def _current_info(what: str) -> activity.Info:
    if not activity.in_activity():
        raise RuntimeError(
            f"{what} is only usable inside a Temporal activity: outside one there is no durable"
            " identity to key the call by (a random key would protect nothing)"
        )
    return activity.info()


def activity_key(request: KeyRequest) -> str:
    """The key of this call: the activity's identity and the call's ordinal in this attempt.

    A `KeySource`: `RetryingSession(client, key_source=activity_key)`. The N-th keyed call of an
    activity attempt gets the same key on every attempt and in every worker; ordinals restart with
    each attempt (concurrent calls take them in the order they ask: start them in a fixed order).
    `key_step`'s ordinal is not used: this source counts per attempt itself.

    Raises:
        RuntimeError: not inside a Temporal activity.
    """
    info = _current_info("activity_key")
    return step_key_from(*_identity(info), ordinal=_attempts.take(info))


# -- errors ----------------------------------------------------------------------------------


def _retry_hint(data: Any) -> timedelta | None:
    if not isinstance(data, dict):
        return None
    raw = data.get("retryAfterMs")
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        return None
    return timedelta(milliseconds=max(0.0, float(raw)))


def _from_code(error: MCPError, message: str) -> ApplicationError | None:
    kind = ERROR_TYPES.get(error.code)
    if kind is None:
        return None
    retryable = error.code in _RETRYABLE
    return ApplicationError(
        message,
        error.code,
        type=kind,
        non_retryable=not retryable,
        next_retry_delay=_retry_hint(error.data) if retryable else None,
    )


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            yield from _leaves(error)
        else:
            yield error


def application_error(error: BaseException) -> ApplicationError | None:
    """What Temporal should see for an mcp-once exception, or None to leave `error` as it is.

    See the module doc for the types. The message is mcp-once's (tool, key, reason; never
    arguments or results). An exception group (anyio task groups wrap what their body raised:
    an error raised inside `async with mcp.Client(...)` leaves it as a group, which Temporal
    would treat as a plain, retryable failure) gives its first leaf that is an
    `ApplicationError` or maps to one.
    """
    if isinstance(error, BaseExceptionGroup):
        for leaf in _leaves(error):
            if isinstance(leaf, ApplicationError):
                return leaf
            mapped = application_error(leaf)
            if mapped is not None:
                return mapped
        return None
    if isinstance(error, ApplicationError):
        return None
    if isinstance(error, OutcomeUnknown | NotExecuted):
        last = error.last_error
        if isinstance(last, MCPError) and last.code in _RETRYABLE:
            return _from_code(last, str(error))
        if isinstance(error, OutcomeUnknown):
            return ApplicationError(str(error), type=_OUTCOME_UNKNOWN_TYPE, non_retryable=True)
        return None
    if isinstance(error, MCPError):
        return _from_code(error, str(error))
    return None


def _raise_for_temporal(error: Exception) -> NoReturn:
    """Raise what `application_error` makes of `error` (or `error` itself)."""
    mapped = application_error(error)
    if mapped is None:
        raise error
    if mapped.__traceback__ is not None:  # raised already, inside a group: unwrapped
        raise mapped
    raise mapped from error


class McpOnceInterceptor(Interceptor):
    """`Worker(..., interceptors=[McpOnceInterceptor()])`: every activity's mcp-once exceptions
    become the `ApplicationError`s of `application_error`, so Temporal stops retrying what a
    retry cannot fix (without it, `KeyReused` or `OutcomeUnknown` is retried by the activity's
    retry policy, forever by default)."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _MapErrors(next)


class _MapErrors(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except Exception as exc:
            _raise_for_temporal(exc)


# -- retention -------------------------------------------------------------------------------


def retention_margin(retention: float) -> float:
    """Seconds taken off the advertised retention for clock skew between Temporal and the
    worker: a tenth of it, at most a minute."""
    return min(60.0, retention / 10.0)


class _RetentionGuard:
    """A `ToolSession` that refuses a re-run's call once the first attempt is older than the
    tool's advertised retention (see the module doc)."""

    def __init__(self, inner: ToolSession, now: Callable[[], datetime]) -> None:
        self._inner = inner
        self._now = now
        self._retention: dict[str, float] | None = None

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        read_timeout_seconds: float | None,
        progress_callback: ProgressFnT | None,
        *,
        meta: RequestParamsMeta | None,
    ) -> CallToolResult:
        if activity.in_activity() and activity.info().attempt > 1:
            await self._check(name, activity.info())
        return await self._inner.call_tool(
            name, arguments, read_timeout_seconds, progress_callback, meta=meta
        )

    async def _check(self, name: str, info: activity.Info) -> None:
        if self._retention is None or name not in self._retention:
            self._retention = {
                tool.name: seconds
                for tool in await list_all_tools(self._inner)
                if (seconds := advertised_retention(tool)) is not None
            }
        retention = self._retention.get(name)
        if retention is None:
            return
        age = (self._now() - info.scheduled_time).total_seconds()
        if age >= retention - retention_margin(retention):
            raise ApplicationError(
                f"attempt {info.attempt} of activity {info.activity_id!r} calls tool {name!r}"
                f" {age:.0f}s after the activity was first scheduled; the server keeps"
                f" idempotency records {retention:.0f}s: the first attempt's record may be gone,"
                " and sending again could run the tool twice. Reconcile, then start anew.",
                type=RETENTION_PASSED,
                non_retryable=True,
            )

    async def list_tools_page(self, cursor: str | None) -> ListToolsResult:
        return await self._inner.list_tools_page(cursor)

    def closed(self) -> bool:
        return self._inner.closed()

    def watch_list_changed(self, on_change: Callable[[], None]) -> bool:
        return self._inner.watch_list_changed(on_change)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def activity_session(session: SessionLike) -> ToolSession:
    """`session` as `RetryingSession` should drive it inside an activity: a re-run's call
    (attempt > 1) past the tool's advertised retention fails `McpOnceRetentionPassed` instead of
    being sent. `RetryingSession(activity_session(client), key_source=activity_key)`."""
    return _RetentionGuard(tool_session(session), _utcnow)


# -- the client for temporalio-mcp -----------------------------------------------------------


class _Unkeyed(_SDK):
    """The client's own `tools/call` (the SDK's, not `KeyedMCPClient.call_tool`): one attempt."""

    def __init__(self, client: Client) -> None:
        super().__init__(client)
        self._client = client

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        read_timeout_seconds: float | None,
        progress_callback: ProgressFnT | None,
        *,
        meta: RequestParamsMeta | None,
    ) -> CallToolResult:
        return await Client.call_tool(
            self._client, name, arguments, read_timeout_seconds, progress_callback, meta=meta
        )


@dataclasses.dataclass(eq=False)
class KeyedMCPClient(Client):
    """`mcp.Client` whose tool calls are keyed by the Temporal activity they run in.

    Same arguments as `mcp.Client`, plus `policy=` (a `RetryPolicy`; its retries happen inside
    one activity attempt, Temporal's between attempts). Built for `temporalio-mcp`:
    `MCPPlugin({"shop": lambda: KeyedMCPClient(url)})`, whose `call-tool` activity calls
    `call_tool` here. Each call: key from `meta` if one is there, else `activity_key`; retention
    checked on attempt > 1; mcp-once's refusals raised as `ApplicationError`s (module doc).
    Everything else (listing, resources, prompts) is the SDK's.

    Outside an activity `call_tool` raises `RuntimeError` (from `activity_key`).
    """

    policy: RetryPolicy | None = dataclasses.field(default=None, kw_only=True)
    _mcp_once: PerConnection = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._mcp_once = PerConnection(self.policy, activity_key)

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        progress_callback: ProgressFnT | None = None,
        *,
        input_responses: Any = None,
        request_state: str | None = None,
        meta: RequestParamsMeta | None = None,
    ) -> CallToolResult:
        """Call a tool under the activity's key (see the class doc)."""
        if input_responses is not None or request_state is not None:
            # Resuming an input round the caller drives: that is the SDK's protocol, not a new
            # logical call, and it is sent as the caller built it.
            return await super().call_tool(
                name,
                arguments,
                read_timeout_seconds,
                progress_callback,
                input_responses=input_responses,
                request_state=request_state,
                meta=meta,
            )
        connection = self.session  # the SDK's RuntimeError when not entered
        retrying = self._mcp_once.session_for(connection, activity_session(_Unkeyed(self)))
        read_timeout = attempt_timeout(
            read_timeout_seconds, retrying.policy, self.read_timeout_seconds
        )
        try:
            # A workflow-side resolver's key gives way to one the model put in the key argument.
            with adapter_key((meta or {}).get(wire.KEY_META)):
                return await retrying.call_tool(
                    name, arguments, read_timeout, progress_callback, meta=meta
                )
        except Exception as exc:
            _raise_for_temporal(exc)
