"""`RetryingSession`: MCP tool calls retried only when that cannot duplicate an effect.

One logical call gets one idempotency key, sent on every attempt with the attempt number. After
each failed attempt the loop asks, in order: may this kind of failure be retried for this tool
(the gate), is the session replaceable, are attempts, budget and deadline left, and does the wait
fit in the deadline. The first "no" ends the call with `OutcomeUnknown` when any attempt may have
run the tool, or `NotExecuted` when none did. Cancellation of the caller is never caught: the loop
only ever handles `Exception`s, so a cancelled caller stops at once, mid-attempt or mid-wait.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, TypeVar, cast, overload

import anyio
from mcp import MCPError
from mcp.shared.dispatcher import ProgressFnT
from mcp_types import (
    CallToolRequest,
    CallToolRequestParams,
    CallToolResult,
    InputRequiredResult,
    InputResponses,
    Request,
    RequestParamsMeta,
    Tool,
)
from opentelemetry import trace
from pydantic import BaseModel, TypeAdapter

from idempotency import wire

from . import _telemetry as telemetry
from ._budget import RetryBudget
from ._catalog import ToolCatalog, advertised_key_argument, watch_list_changed
from ._classify import Failure, classify
from ._gate import GATED, retry_gate
from ._hooks import RetryEvent, fire
from ._http import AttemptProbe, current_probe
from ._journal import fingerprint_arguments
from ._key import (
    KeyKind,
    KeySource,
    argument_place,
    caller_key,
    model_key_refusal,
    sourced_or_minted,
    split_adapter_key,
    with_key_argument,
)
from ._outcome import (
    NotExecuted,
    OutcomeUnknown,
    ServerOutcomeUnknown,
    ToolCallError,
    tool_call_error,
)
from ._policy import Override, RetryPolicy, check_overrides
from ._reconnect import Connect, ReconnectFailed, SessionSlot, SessionUnavailable, transport_closed
from ._report import AttemptReport, CallOutcome, CallReport, GiveUpReason
from ._run import Claim, Run, placed_run
from ._sessions import (
    InputRoundSession,
    OverClientSession,
    SessionLike,
    TaskSession,
    ToolSession,
    round_session,
    task_session,
    tool_session,
)
from ._tasks import (
    TASK_ANSWER,
    TASK_STATE,
    TASK_UPDATED,
    CancelTask,
    GetTask,
    TaskCreated,
    TaskIdParams,
    TaskState,
    UpdateTask,
    UpdateTaskParams,
    until_done,
)
from ._telemetry import error_type
from ._testing import pause

#: What one call may be answered with: the tool's result, a question (an input-required round),
#: or, for a task-augmented call, the task the server created.
_Answer = CallToolResult | InputRequiredResult | TaskCreated

_T = TypeVar("_T", bound=BaseModel)


def _replayed(result: _Answer) -> bool:
    if isinstance(result, InputRequiredResult):
        return False  # a question is never a record's answer (rule 8)
    record = (result.meta or {}).get(wire.IDEMPOTENCY_META)
    return isinstance(record, Mapping) and record.get("status") == "replayed"


#: The server name a journal entry records when the session cannot tell who it talks to.
UNNAMED_SERVER = "mcp"


def server_name(session: SessionLike) -> str:
    """The name the server gave itself (`serverInfo.name`), which a run's journal records with
    each call: stable across processes, unlike anything about the connection."""
    adapted = tool_session(session)
    inner = adapted.inner() if isinstance(adapted, OverClientSession) else None
    info = getattr(inner, "server_info", None)
    name = getattr(info, "name", None)
    return name if isinstance(name, str) and name else UNNAMED_SERVER


def check_key_options(key_source: KeySource | None, run: Run | None) -> None:
    """Refuse a `key_source` or `run` that cannot work, where it is given (the session, or an
    adapter that makes sessions later), rather than at the first call."""
    if key_source is not None and not callable(key_source):
        raise TypeError("key_source must be a callable taking a KeyRequest, or None")
    if run is not None and not isinstance(run, Run):
        raise TypeError(f"run must be an orchestrator.Run or None, not {type(run).__name__}")


def _answered(result: _Answer) -> CallOutcome:
    """How a call that got an answer ended: a question is an answer too (never retried), and so
    is a created task (its result comes later, by polling)."""
    if isinstance(result, InputRequiredResult):
        return "input_required"
    return "is_error" if isinstance(result, CallToolResult) and result.is_error else "result"


@dataclass(frozen=True, slots=True)
class _Round:
    """What a call carries of an input-required round (SEP-2322): the continuation of one (the
    caller's answers and the server's echoed state), and whether a new question may come back
    as the answer (else it is refused as the SDK refuses it: `RuntimeError`)."""

    input_responses: InputResponses | None
    request_state: str | None
    allowed: bool

    @classmethod
    def of(
        cls, input_responses: InputResponses | None, request_state: str | None, allowed: object
    ) -> _Round | None:
        """The round of a call, or None for a plain call (none of the three given)."""
        if not isinstance(allowed, bool):
            raise TypeError(f"allow_input_required must be a bool, not {type(allowed).__name__}")
        if input_responses is not None and not isinstance(input_responses, Mapping):
            raise TypeError("input_responses must be a mapping of request ids to results, or None")
        if request_state is not None and not isinstance(request_state, str):
            kind = type(request_state).__name__
            raise TypeError(f"request_state must be a str or None, not {kind}")
        if input_responses is None and request_state is None and not allowed:
            return None
        return cls(input_responses, request_state, allowed)


class RetryingSession:
    """Wraps a `ClientSession`, an `mcp.Client` or a connected `fastmcp.Client` (or any
    `ToolSession`) so that `call_tool` retries safely.

    `session` is used as given and stays the caller's to close. `connect` (optional) makes
    replacement sessions when the current one dies: each call returns a fresh async context
    manager yielding a ready session, e.g. `lambda: Client(url)`; the wrapper enters it in a task
    of its own and closes it when it is replaced or when the wrapper exits. With `connect`, enter
    the wrapper (`async with RetryingSession(...) as rs:`); `session` may then be None, and the
    first call connects.

    `key_source` (optional, a `KeySource`) gives the key of a call the caller brings no key for,
    from where the call runs: a durable engine's step, so that a re-run of the step sends the keys
    of its first run (see `key_step`, `step_keys`). Precedence, first match wins: the caller's
    key (`idempotency_key=`, a key in `meta`, or a value in the argument the tool's listing names
    as `keyArgument`; those given must agree, else `ValueError`), a framework adapter's key
    (which gives way to one in the argument, as a model fills it: see `adapter_key`), `run`,
    `key_source`, a fresh random key. A tool listed with a `keyArgument` gets the key in that
    argument too, on every attempt, for servers (and gateways) that read it there.

    `run` (optional, an entered `orchestrator.Run`) journals each call that brings no key: the
    key comes from the run id and the call's position, the intent is recorded before the request
    leaves and marked done after the answer, and a restarted run resends what it had sent under
    the same keys (see `Run`). A call placed by a `Turn` or a framework hook of a run goes
    through that run even on a session without `run=`.
    """

    def __init__(
        self,
        session: SessionLike | None = None,
        *,
        policy: RetryPolicy | None = None,
        connect: Connect | None = None,
        overrides: Mapping[str, Override] | None = None,
        key_source: KeySource | None = None,
        run: Run | None = None,
    ) -> None:
        check_key_options(key_source, run)
        self._key_source = key_source
        self._run = run
        if session is not None:
            tool_session(session)  # refuses what the loop cannot drive, before anything is sent
        if session is None and connect is None:
            raise ValueError("RetryingSession needs a session, a connect factory, or both")
        if connect is not None and not callable(connect):
            raise TypeError("connect must be a callable returning an async context manager")
        if policy is None:
            policy = RetryPolicy()
        elif not isinstance(policy, RetryPolicy):
            raise TypeError(f"policy must be a RetryPolicy, not {type(policy).__name__}")
        self._policy = policy
        self._overrides: dict[str, Override] = {
            **policy.overrides,
            **check_overrides(overrides if overrides is not None else {}),
        }
        self._budget: RetryBudget | None = (
            RetryBudget() if policy.budget == "per-session" else policy.budget
        )
        self._catalog = ToolCatalog()
        self._warmed_generation: int | None = None
        self._slot = SessionSlot(
            session,
            connect,
            connect_timeout=policy.connect_timeout,
            on_new_session=self._adopt,
        )
        if session is not None:
            self._adopt(session)
        #: The report of the most recently finished call (use `call_tool_with_report` when
        #: several calls run at once).
        self.last_report: CallReport | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> RetryingSession:
        await self._slot.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._slot.__aexit__()

    def _adopt(self, session: SessionLike) -> None:
        watch_list_changed(session, self._catalog.invalidate)

    # -- introspection ---------------------------------------------------------------------

    @property
    def policy(self) -> RetryPolicy:
        return self._policy

    @property
    def key_source(self) -> KeySource | None:
        """Where keys come from when the caller brings none (None: minted)."""
        return self._key_source

    @property
    def run(self) -> Run | None:
        """The run whose journal keys this session's unkeyed calls (None: no journal)."""
        return self._run

    @property
    def session(self) -> SessionLike | None:
        """The session calls currently go to (None before the first connect)."""
        return self._slot.current()

    @property
    def budget(self) -> RetryBudget | None:
        """The retry budget this session spends from (None when disabled)."""
        return self._budget

    @property
    def connects(self) -> int:
        """Sessions opened through `connect` so far."""
        return self._slot.connects

    async def refresh_tools(self) -> list[Tool]:
        """List the server's tools now (the gate's source of annotations) and return them."""
        await self._catalog.refresh(await self.live_session())
        return self._catalog.tools()

    async def live_session(self) -> SessionLike:
        """The session calls go to now, replacing a dead (or discarded) one first: one
        reconnection shared by every caller waiting. Raises `ReconnectFailed` when none can be
        opened."""
        session, _ = await self._slot.acquire()
        return session

    def discard(self, session: SessionLike) -> None:
        """`session` failed a request sent on it directly, outside `call_tool` (say, with
        `session_gone`): if calls still go to it, the next one opens a new session first."""
        if self._slot.current() is session:
            self._slot.mark_dead(self._slot.generation)

    def invalidate_tools(self) -> None:
        """The server's tools changed: list them again before the gate next reads them."""
        self._catalog.invalidate()

    # -- calls -----------------------------------------------------------------------------

    @overload
    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        progress_callback: ProgressFnT | None = None,
        *,
        meta: RequestParamsMeta | Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        input_responses: InputResponses | None = None,
        request_state: str | None = None,
        allow_input_required: Literal[False] = False,
    ) -> CallToolResult: ...

    @overload
    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        progress_callback: ProgressFnT | None = None,
        *,
        meta: RequestParamsMeta | Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        input_responses: InputResponses | None = None,
        request_state: str | None = None,
        allow_input_required: bool,
    ) -> CallToolResult | InputRequiredResult: ...

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        progress_callback: ProgressFnT | None = None,
        *,
        meta: RequestParamsMeta | Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        input_responses: InputResponses | None = None,
        request_state: str | None = None,
        allow_input_required: bool = False,
    ) -> CallToolResult | InputRequiredResult:
        """Call a tool, retrying where that is safe; mirrors `ClientSession.call_tool`.

        `read_timeout_seconds` bounds each attempt (default: the policy's `attempt_timeout`),
        always clipped to the policy's deadline. `idempotency_key` (or `meta[KEY_META]`) reuses a
        key of the caller's; otherwise the session's `key_source` gives one, or (without one, or
        when it answers None) one is minted for this call.

        Input-required rounds (SEP-2322, 2026-07-28 sessions), as the SDK session's own
        `call_tool` has them: with `allow_input_required=True` the server's `InputRequiredResult`
        is returned as it came (an answer, never retried: report outcome `input_required`),
        rather than answered by the client's callbacks; `input_responses` and `request_state`
        send the continuation. Send the continuation under the same key (`idempotency_key=`, or
        the first call's `CallReport.key`): a guarded server released the key at the question
        and claims it again for the continuation, whose failures are classified as any call's.
        A round needs a session that carries one (`InputRoundSession`: the SDK's and FastMCP's
        clients), else `TypeError`, and cannot be journalled by a `run` (bring a key).

        Raises:
            OutcomeUnknown: the tool may have run and may not be retried (see `.reason`).
            NotExecuted: the tool provably did not run and retrying is over.
            ToolCallError: the server answered with a permanent JSON-RPC error.
            ValueError, TypeError: bad arguments, or a bad key from `key_source`, before
                anything is sent. Whatever `key_source` raises propagates, and nothing is sent.
            RuntimeError: the server asked for input without `allow_input_required` (as the
                SDK's session raises it), possible only on a continuation.
            RunDiverged, RunExpired, RunBusy, RunFinished: with a `run`, the journal refused
                the call (see `Run`); nothing was sent.
        """
        result, _ = await self.call_tool_with_report(
            name,
            arguments,
            read_timeout_seconds,
            progress_callback,
            meta=meta,
            idempotency_key=idempotency_key,
            input_responses=input_responses,
            request_state=request_state,
            allow_input_required=allow_input_required,
        )
        return result

    @overload
    async def call_tool_with_report(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        progress_callback: ProgressFnT | None = None,
        *,
        meta: RequestParamsMeta | Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        input_responses: InputResponses | None = None,
        request_state: str | None = None,
        allow_input_required: Literal[False] = False,
    ) -> tuple[CallToolResult, CallReport]: ...

    @overload
    async def call_tool_with_report(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        progress_callback: ProgressFnT | None = None,
        *,
        meta: RequestParamsMeta | Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        input_responses: InputResponses | None = None,
        request_state: str | None = None,
        allow_input_required: bool,
    ) -> tuple[CallToolResult | InputRequiredResult, CallReport]: ...

    async def call_tool_with_report(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        progress_callback: ProgressFnT | None = None,
        *,
        meta: RequestParamsMeta | Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        input_responses: InputResponses | None = None,
        request_state: str | None = None,
        allow_input_required: bool = False,
    ) -> tuple[CallToolResult | InputRequiredResult, CallReport]:
        """`call_tool`, also returning the call's `CallReport`."""
        round_ = _Round.of(input_responses, request_state, allow_input_required)
        answer, report = await self._started(
            name, arguments, read_timeout_seconds, progress_callback, meta, idempotency_key, round_
        )
        assert not isinstance(answer, TaskCreated)  # no task was asked for
        return answer, report

    @overload
    async def create_task(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        progress_callback: ProgressFnT | None = None,
        *,
        meta: RequestParamsMeta | Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        input_responses: InputResponses | None = None,
        request_state: str | None = None,
        allow_input_required: Literal[False] = False,
    ) -> TaskCreated | CallToolResult: ...

    @overload
    async def create_task(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        progress_callback: ProgressFnT | None = None,
        *,
        meta: RequestParamsMeta | Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        input_responses: InputResponses | None = None,
        request_state: str | None = None,
        allow_input_required: bool,
    ) -> TaskCreated | CallToolResult | InputRequiredResult: ...

    async def create_task(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        progress_callback: ProgressFnT | None = None,
        *,
        meta: RequestParamsMeta | Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        input_responses: InputResponses | None = None,
        request_state: str | None = None,
        allow_input_required: bool = False,
    ) -> TaskCreated | CallToolResult | InputRequiredResult:
        """Call a tool as a task (SEP-2663): the server's `TaskCreated` (poll it with
        `get_task`, or wait for its result with `task_result`), or the tool's `CallToolResult`
        when the server ran it as a plain call. The session must declare the tasks extension
        (`Client(..., extensions=[TasksExtension()])`, on a 2026-07-28 session): the SDK stamps
        it into every request's capabilities, which is how a server learns it may task the call.

        Creating a task is a call like any other (rule 23): it carries the call's key (the same
        choice of key as `call_tool`, a `run` journals it by position), and a lost answer is
        maybe-executed, re-sent only through the gate and under the same key, so that a guarded
        server (or `mcp-once proxy`) answers the re-send with the task it already created
        (`TaskCreated.meta` marked as a replay, `last_report.replayed`). Raises as `call_tool`
        does, and TypeError for a session that cannot send tasks (`TaskSession`).

        A server may ask for input before it creates the task (SEP-2322 rounds composed with
        tasks): as for `call_tool`, `allow_input_required=True` returns its
        `InputRequiredResult`, and `input_responses` / `request_state` send the continuation,
        under the same key."""
        round_ = _Round.of(input_responses, request_state, allow_input_required)
        answer, _ = await self._started(
            name,
            arguments,
            read_timeout_seconds,
            progress_callback,
            meta,
            idempotency_key,
            round_,
            task=True,
        )
        return answer

    async def get_task(self, task_id: str) -> TaskState:
        """`tasks/get`: the task's status, and its outcome inlined once it is terminal
        (`TaskState.outcome()`). A pure read, re-sent on any failure that is not the server's
        answer, within the policy's attempts and deadline (see `_read`)."""
        request = GetTask(params=TaskIdParams(task_id=_task_id(task_id)))
        return await self._read(request, TASK_STATE)

    async def task_result(self, task_id: str) -> CallToolResult:
        """The tool's result of task `task_id`: `tasks/get` polled (at the server's
        `pollIntervalMs`) until the task is terminal, its inlined result returned. SEP-2663 has
        no `tasks/result`: the outcome comes with `tasks/get`. A failed task raises its inlined
        error (`MCPError`), a cancelled one ValueError, a task waiting for input RuntimeError
        (answer it with `update_task`). Each poll is re-sent as `get_task`'s; the wait has no
        bound of its own (the caller's cancel scope bounds it)."""
        return await until_done(task_id, lambda: self.get_task(task_id))

    async def update_task(self, task_id: str, input_responses: Mapping[str, Any]) -> None:
        """`tasks/update`: the caller's answers to a task's `inputRequests`. Sent once (it
        changes the task; a lost answer is raised as it came: poll `get_task`)."""
        if not isinstance(input_responses, Mapping):
            raise TypeError("input_responses must be a mapping of request key to answer")
        params = UpdateTaskParams(task_id=_task_id(task_id), input_responses=dict(input_responses))
        await self._read(UpdateTask(params=params), TASK_UPDATED, attempts=1)

    async def cancel_task(self, task_id: str) -> None:
        """`tasks/cancel`: ask the task to stop. SEP-2663 answers with an empty acknowledgement,
        not the task's status (poll `get_task` for that: a cancellation is cooperative, the task
        may still complete). Sent once (a lost answer is raised as it came)."""
        request = CancelTask(params=TaskIdParams(task_id=_task_id(task_id)))
        await self._read(request, TASK_UPDATED, attempts=1)

    async def _read(
        self, request: Request[Any, Any], answer: TypeAdapter[_T], attempts: int | None = None
    ) -> _T:
        """Send a request that changes nothing on the server: any failure but the server's own
        answer (an error it sent) is re-sent, on a replaced session if this one died, with the
        policy's backoff, until its attempts or deadline run out; then the last error is raised
        as it came (nothing to reconcile: a read has no effect)."""
        policy = self._policy
        deadline = anyio.current_time() + policy.deadline
        attempts = policy.max_attempts if attempts is None else attempts
        for attempt in range(1, attempts + 1):
            generation = self._slot.generation
            try:
                with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                    session, generation = await self._slot.acquire()
                    sender = task_session(tool_session(session))
                    timeout = policy.attempt_timeout
                    return await sender.send_task_request(request, answer, timeout, None)
            except (TypeError, ValueError, SessionUnavailable):
                raise  # bad input, a bad answer, or no session to be had: no retry mends them
            except Exception as exc:
                if not isinstance(exc, ReconnectFailed):  # else: not sent, the next one may be
                    current = self._slot.current()
                    closed = current is None or transport_closed(current)
                    failure = classify(exc, None, session_closed=closed)
                    if failure.kind == "permanent":
                        raise
                    if failure.session_dead:
                        self._slot.mark_dead(generation)
                wait = policy.backoff(attempt)
                if attempt >= attempts or anyio.current_time() + wait >= deadline:
                    raise
                await pause(wait)
        raise AssertionError("unreachable: the last attempt raises")  # pragma: no cover

    async def _started(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        read_timeout_seconds: float | None,
        progress_callback: ProgressFnT | None,
        meta: RequestParamsMeta | Mapping[str, Any] | None,
        idempotency_key: str | None,
        round_: _Round | None,
        task: bool = False,
    ) -> tuple[_Answer, CallReport]:
        """One call (a plain one, a round's, or a task's) checked, keyed and run."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty tool name, got {name!r}")
        if arguments is not None and not isinstance(arguments, dict):
            raise TypeError(f"arguments must be a dict or None, not {type(arguments).__name__}")
        if read_timeout_seconds is not None and (
            isinstance(read_timeout_seconds, bool)
            or not isinstance(read_timeout_seconds, int | float)
            or not math.isfinite(read_timeout_seconds)
            or read_timeout_seconds <= 0
        ):
            raise ValueError(
                f"read_timeout_seconds must be a positive number, got {read_timeout_seconds!r}"
            )
        if meta is not None and not isinstance(meta, Mapping):
            raise TypeError(f"meta must be a mapping or None, not {type(meta).__name__}")
        if meta is not None and wire.ATTEMPT_META in meta:
            raise ValueError(
                f"meta[{wire.ATTEMPT_META!r}] is set by RetryingSession, not the caller"
            )
        if self._slot.can_reconnect and not self._slot.entered:
            raise RuntimeError(
                "a RetryingSession with connect= must be entered (`async with`) before use:"
                " it owns the sessions it opens"
            )
        key_argument = await self._key_argument(name, arguments)
        meta, adapters = split_adapter_key(meta)
        try:
            brought = caller_key(idempotency_key, meta, arguments, key_argument)
        except ValueError:
            refusal = None if adapters is None else model_key_refusal(arguments, key_argument)
            if refusal is None:
                raise
            # A framework adapter's call whose arguments (the model's) carry a malformed key:
            # the server's own answer to it, raised before sending, so the framework shows the
            # model what it shows without mcp-once, instead of the agent run failing.
            raise refusal from None
        run = self._run_for(brought if brought is not None else adapters)
        if run is not None:
            if round_ is not None:
                # A run's journal holds one answer per position; a round's question is none, and
                # its continuation would take the next position under another key.
                raise ValueError(
                    "an input-required round cannot be journalled by a run: bring the call's key"
                    " (idempotency_key=), the same for the question and its continuation"
                )
            return await self._journaled(
                run, name, arguments, read_timeout_seconds, progress_callback, meta, task
            )
        kind: KeyKind
        if brought is not None:
            given = idempotency_key is not None or (meta is not None and wire.KEY_META in meta)
            key, kind = brought, "caller" if given else "argument"
        elif adapters is not None:
            key, kind = adapters, "adapter"
        else:
            key, kind = sourced_or_minted(self._key_source, name, arguments)
        call = _Call(
            self, name, arguments, read_timeout_seconds, progress_callback, meta, key, kind
        )
        call.adoptable = brought is None
        call.round = round_
        call.task = task
        return await call.run()

    async def _key_argument(
        self, name: str, arguments: Mapping[str, Any] | None
    ) -> tuple[str, ...] | None:
        """Where the tool's listing says its key may also travel among the arguments, learnt
        before the key is chosen when the arguments might already hold one (the caller's key).

        The listing is the one a call would make anyway (once per session, for an unknown tool),
        only made earlier; with no session yet (a first call through `connect=`), or only one
        known dead or discarded (whose listing would fail as the call would), it is left to the
        attempt, which adopts a key it then finds in the arguments (`_Call.with_key`).
        """
        catalog = self._catalog
        session = self._slot.current() if self._slot.usable() else None
        generation = self._slot.generation
        if (
            arguments
            and session is not None
            and catalog.fresh(name) is None
            and self._warmed_generation != generation
        ):
            self._warmed_generation = generation
            with anyio.move_on_after(self._policy.deadline):
                try:
                    await catalog.lookup(session, name)
                except Exception as exc:
                    telemetry.logger.debug("listing tools failed: %s", type(exc).__name__)
        return advertised_key_argument(catalog.get(name))

    def _run_for(self, brought: str | None) -> Run | None:
        """The run that keys this call: none when the caller brings a key, else the session's or
        the one a turn placed the call in."""
        if brought is not None:
            return None
        placed = placed_run()
        if placed is not None and self._run is not None and placed is not self._run:
            raise ValueError(
                f"this call was placed in {placed!r}, but the session journals {self._run!r}"
            )
        return placed if placed is not None else self._run

    async def _journaled(
        self,
        run: Run,
        name: str,
        arguments: dict[str, Any] | None,
        read_timeout: float | None,
        progress_callback: ProgressFnT | None,
        meta: Mapping[str, Any] | None,
        task: bool,
    ) -> tuple[_Answer, CallReport]:
        """One call of `run`: claimed (journal first), sent under the claimed key, marked done
        when an answer ends it (a result, an `isError` result or a permanent error). Anything
        else (`OutcomeUnknown`, `NotExecuted`, cancellation, a crash) leaves the intent: the
        journal cannot tell "never arrived" from "ran, answer lost", so a resume treats it as
        "may have run".

        The server's name is part of the entry, so the claim waits for a live session: it is
        made by the call's first attempt that has one (`_Call.before_send`). A call that never
        gets one fails as any call does (retried, then `NotExecuted`, under the key its
        position would have), with no position taken."""
        fingerprint = fingerprint_arguments(arguments)  # not plain JSON: refused, no position
        call = _Call(
            self, name, arguments, read_timeout, progress_callback, meta, run.next_key(), "run"
        )
        call.task = task
        catalog = self._catalog
        policy = self._policy
        claim: Claim | None = None

        async def claim_position(session: SessionLike) -> None:
            nonlocal claim
            position = run.take_position()

            async def lookup() -> Tool | None:
                if (tool := catalog.fresh(name)) is not None:
                    return tool
                with anyio.move_on_after(policy.deadline):
                    try:
                        return await catalog.lookup(session, name)
                    except Exception as exc:
                        telemetry.logger.debug("listing tools failed: %s", type(exc).__name__)
                return catalog.get(name)

            claim = await run.claim(
                position,
                server=server_name(session),
                tool=name,
                fingerprint=fingerprint,
                lookup=lookup,
                overrides=self._overrides,
                trust_annotations=policy.trust_annotations,
            )
            call.key = claim.key

        call.before_send = claim_position
        try:
            answer = await call.run()
        except ToolCallError:
            if claim is not None:
                await run.done(claim)
            raise
        assert claim is not None
        await run.done(claim)
        return answer


def _task_id(task_id: object) -> str:
    if not isinstance(task_id, str) or not task_id:
        raise ValueError(f"task_id must be a non-empty string, got {task_id!r}")
    return task_id


class _Call:
    """The state of one logical call across its attempts."""

    def __init__(
        self,
        owner: RetryingSession,
        name: str,
        arguments: dict[str, Any] | None,
        read_timeout: float | None,
        progress_callback: ProgressFnT | None,
        meta: Mapping[str, Any] | None,
        key: str,
        key_kind: KeyKind,
    ) -> None:
        self.owner = owner
        self.policy = owner._policy
        self.slot = owner._slot
        self.name = name
        self.arguments = arguments
        self.attempt_timeout = (
            read_timeout if read_timeout is not None else self.policy.attempt_timeout
        )
        self.progress_callback = progress_callback
        self.user_meta = dict(meta) if meta is not None else {}
        self.key = key
        #: Where the key came from, for telemetry (`mcp_once.key_source`).
        self.key_kind: KeyKind = key_kind
        #: The call's span (`telemetry.call_span`), once the call runs.
        self.span: trace.Span = trace.INVALID_SPAN
        #: Whether the key is this session's choice (minted or from its key source) or a framework
        #: adapter's (`adapter_key`), not the caller's nor a run's: only such a key gives way to
        #: one found in the arguments.
        self.adoptable = False
        self.records: list[AttemptReport] = []
        self.maybe_ran = False
        self.total_wait = 0.0
        self.start = 0.0
        self.deadline = 0.0
        self.connects_before = owner._slot.connects
        #: The input-required round the call carries (None: a plain call).
        self.round: _Round | None = None
        #: Whether the call is a task creation (its answer may be a `TaskCreated`).
        self.task = False
        #: Run once, by the first attempt that has a live session, before anything is sent (a
        #: run's journal claims the call's position there, since its entry names the server).
        self.before_send: Callable[[SessionLike], Awaitable[None]] | None = None

    def report(
        self,
        outcome: CallOutcome,
        *,
        replayed: bool = False,
        give_up: GiveUpReason | None = None,
    ) -> CallReport:
        report = CallReport(
            tool=self.name,
            key=self.key,
            outcome=outcome,
            attempts=tuple(self.records),
            total_wait=self.total_wait,
            elapsed=anyio.current_time() - self.start,
            replayed=replayed,
            connects=self.slot.connects - self.connects_before,
            give_up=give_up,
        )
        self.owner.last_report = report
        telemetry.ended(self.span, report, self.key_kind)
        return report

    async def run(self) -> tuple[_Answer, CallReport]:
        """The call, under its span (current, so the attempts' spans nest under it)."""
        with telemetry.call_span(self.name, self.key_kind) as self.span:
            return await self.attempts()

    async def attempts(self) -> tuple[_Answer, CallReport]:
        self.start = anyio.current_time()
        self.deadline = self.start + self.policy.deadline
        budget = self.owner._budget
        wait_before = 0.0
        finished = False
        try:
            for attempt in range(1, self.policy.max_attempts + 1):
                with telemetry.attempt_span(self.name, attempt, wait_before) as span:
                    result, failure, generation = await self.attempt(attempt)
                    if failure is not None:
                        telemetry.attempt_failed(
                            span, self.name, attempt, failure.kind, failure.error, failure.code
                        )
                if result is not None:
                    if budget is not None:
                        budget.record_success()
                    self.records.append(AttemptReport(attempt, wait_before, generation))
                    replayed = _replayed(result)
                    finished = True
                    report = self.report(_answered(result), replayed=replayed)
                    if isinstance(result, InputRequiredResult) and not self.round_allowed():
                        raise RuntimeError(
                            f"tool {self.name!r} asked for client input, and the call did not"
                            " allow it (allow_input_required=True returns the question)"
                        )
                    return result, report
                assert failure is not None
                self.records.append(
                    AttemptReport(
                        attempt,
                        wait_before,
                        generation,
                        failure=failure.kind,
                        error_type=type(failure.error).__name__,
                        code=failure.code,
                        http_status=failure.http_status,
                        retry_after=failure.retry_after,
                    )
                )
                if failure.kind == "permanent":
                    finished = True
                    self.permanent(failure)
                # One lost connection is one failure for the budget, however many calls it took.
                first_report = self.slot.mark_dead(generation) if failure.session_dead else True
                if budget is not None and first_report:
                    budget.record_failure()
                if failure.kind in ("maybe_executed", "in_progress"):
                    self.maybe_ran = True
                wait = await self.next_wait(failure, attempt)
                if isinstance(wait, str):
                    finished = True
                    self.give_up(wait, failure.error)
                telemetry.retrying(self.name, attempt + 1, wait)
                event = RetryEvent(self.name, attempt, failure.kind, failure.error, wait)
                fire("on_retry", self.policy.on_retry, event)
                await pause(wait)
                self.total_wait += wait
                wait_before = wait
            raise AssertionError("unreachable: the last attempt gives up")  # pragma: no cover
        finally:
            if not finished:
                cancelled = isinstance(sys.exception(), anyio.get_cancelled_exc_class())
                self.report("cancelled" if cancelled else "error")

    def round_allowed(self) -> bool:
        return self.round is not None and self.round.allowed

    async def attempt(self, attempt: int) -> tuple[_Answer | None, Failure | None, int]:
        """Send attempt `attempt`: a result or the classified failure, and the generation."""
        generation = self.slot.generation
        with anyio.CancelScope(deadline=self.deadline) as scope:
            try:
                session, generation = await self.slot.acquire()
            except ReconnectFailed as exc:
                return None, Failure("never_sent", exc), generation
            except SessionUnavailable as exc:
                return None, Failure("never_sent", exc, session_dead=True), generation
        if scope.cancelled_caught:
            return (
                None,
                Failure("never_sent", TimeoutError("deadline reached while reconnecting")),
                generation,
            )
        adapted = tool_session(session)
        rounds = round_session(adapted) if self.round is not None else None  # before sending
        tasks = task_session(adapted) if self.task else None
        if self.before_send is not None:
            prepare, self.before_send = self.before_send, None
            await prepare(session)
        await self.warm_catalog(session, generation)
        timeout = self.deadline - anyio.current_time()
        if self.attempt_timeout is not None:
            timeout = min(timeout, self.attempt_timeout)
        if timeout <= 0:
            return (
                None,
                Failure("never_sent", TimeoutError("no time left before the deadline")),
                generation,
            )
        arguments = self.with_key()
        meta = dict(self.user_meta)
        meta[wire.KEY_META] = self.key
        meta[wire.ATTEMPT_META] = attempt
        probe = AttemptProbe(self.key, attempt)
        token = current_probe.set(probe)
        telemetry.attempt_sent(self.name, attempt)
        sent = anyio.current_time()
        result: _Answer
        try:
            with anyio.CancelScope(deadline=self.deadline) as scope:
                if tasks is not None:
                    result = await self.send_task(tasks, arguments, timeout, meta)
                else:
                    result = await self.send(adapted, rounds, arguments, timeout, meta)
        except Exception as exc:
            telemetry.request_done(self.name, anyio.current_time() - sent, error_type(exc))
            return None, classify(exc, probe, session_closed=transport_closed(session)), generation
        finally:
            current_probe.reset(token)
        if scope.cancelled_caught:
            telemetry.request_done(self.name, anyio.current_time() - sent, "timeout")
            cut = TimeoutError("the call's deadline passed during the attempt")
            return (
                None,
                Failure("maybe_executed", cut, session_dead=transport_closed(session)),
                generation,
            )
        failed = "tool_error" if isinstance(result, CallToolResult) and result.is_error else None
        telemetry.request_done(self.name, anyio.current_time() - sent, failed)
        return result, None, generation

    async def send(
        self,
        session: ToolSession,
        rounds: InputRoundSession | None,
        arguments: dict[str, Any] | None,
        timeout: float,
        meta: dict[str, Any],
    ) -> CallToolResult | InputRequiredResult:
        """One `tools/call`: the plain one, or with the call's round on a session that carries
        it (the same request, answers and state on every attempt)."""
        wire_meta = cast(RequestParamsMeta, meta)
        if rounds is None or self.round is None:
            return await session.call_tool(
                self.name, arguments, timeout, self.progress_callback, meta=wire_meta
            )
        return await rounds.call_tool_round(
            self.name,
            arguments,
            timeout,
            self.progress_callback,
            meta=wire_meta,
            input_responses=self.round.input_responses,
            request_state=self.round.request_state,
        )

    async def send_task(
        self,
        session: TaskSession,
        arguments: dict[str, Any] | None,
        timeout: float,
        meta: dict[str, Any],
    ) -> _Answer:
        """One `tools/call` whose answer may be a task (the session's requests declare the
        tasks extension; the request itself is a plain call's, with the call's round if any:
        then a question may be the answer)."""
        round_ = self.round
        params = CallToolRequestParams(
            name=self.name,
            arguments=arguments,
            _meta=cast(RequestParamsMeta, meta),
            input_responses=None if round_ is None else round_.input_responses,
            request_state=None if round_ is None else round_.request_state,
        )
        request = CallToolRequest(params=params)
        return await session.send_task_request(
            request, TASK_ANSWER, timeout, self.progress_callback
        )

    def with_key(self) -> dict[str, Any] | None:
        """The arguments of the next attempt: the caller's, with the key at the path the tool's
        listing names (`keyArgument`), so that the argument and `_meta` carry one key (the
        server takes equal keys as one). Unchanged when the listing names none or the path
        cannot hold it.

        A value already there was taken as the caller's key when the call began; one found only
        now (the listing came after the key was chosen) is adopted if the key was this
        session's own and nothing has been sent, else refused (`ValueError`, before sending).
        """
        path = advertised_key_argument(self.owner._catalog.get(self.name))
        if path is None:
            return self.arguments
        found = wire.argument_at(self.arguments, path)
        if found is not wire.ABSENT and found != self.key:
            place = argument_place(path)
            if not (self.adoptable and not self.records):
                raise ValueError(f"{place} holds a key other than this call's ({self.key!r})")
            problem = wire.key_problem(found)
            if problem is not None:
                raise ValueError(f"{place}: {problem}")
            assert isinstance(found, str)
            self.key, self.key_kind = found, "argument"
        self.adoptable = False
        placed = with_key_argument(self.arguments, path, self.key)
        return self.arguments if placed is None else placed

    async def warm_catalog(self, session: SessionLike, generation: int) -> None:
        """List tools once per session if this tool is unknown (the SDK would list it anyway)."""
        owner = self.owner
        if owner._warmed_generation == generation or owner._catalog.fresh(self.name) is not None:
            return
        owner._warmed_generation = generation
        await self.lookup_tool(session)

    async def lookup_tool(self, session: SessionLike | None) -> Tool | None:
        """The tool's listing, within the deadline; None when it cannot be had."""
        catalog = self.owner._catalog
        if (tool := catalog.fresh(self.name)) is not None:
            return tool
        with anyio.CancelScope(deadline=self.deadline):
            try:
                if session is None or not self.slot.usable():
                    session, _ = await self.slot.acquire()
                return await catalog.lookup(session, self.name)
            except Exception as exc:
                telemetry.logger.debug("listing tools failed: %s", type(exc).__name__)
        return catalog.get(self.name)

    async def next_wait(self, failure: Failure, attempt: int) -> float | GiveUpReason:
        """Seconds to wait before the next attempt, or the reason to stop retrying."""
        policy = self.policy
        if failure.kind in GATED:
            overrides = self.owner._overrides
            tool: Tool | None = None
            if self.name not in overrides and policy.trust_annotations:
                tool = await self.lookup_tool(self.slot.current())
            decision = retry_gate(
                failure.kind,
                tool_name=self.name,
                tool=tool,
                overrides=overrides,
                trust_annotations=policy.trust_annotations,
                key_attached=True,
            )
            if not decision.open:
                telemetry.logger.debug("gate closed for %r: %s", self.name, decision.because)
                return "not_idempotent"
        if failure.session_dead and not self.slot.can_reconnect:
            return "no_connect"
        if attempt >= policy.max_attempts:
            return "attempts"
        budget = self.owner._budget
        if budget is not None and not budget.allows_retry():
            return "budget"
        if failure.retry_after is not None:
            wait = policy.clamp_hint(failure.retry_after)
        else:
            wait = policy.backoff(attempt)
        if anyio.current_time() + wait >= self.deadline:
            return "deadline"
        return wait

    def give_up(self, reason: GiveUpReason, last_error: Exception) -> NoReturn:
        attempts = len(self.records)
        telemetry.gave_up(self.name, attempts, reason, self.maybe_ran)
        outcome: CallOutcome = "outcome_unknown" if self.maybe_ran else "not_executed"
        report = self.report(outcome, give_up=reason)
        cls = OutcomeUnknown if self.maybe_ran else NotExecuted
        error = cls(
            tool=self.name,
            key=self.key,
            attempts=attempts,
            last_error=last_error,
            reason=reason,
            report=report,
        )
        fire("on_give_up", self.policy.on_give_up, error)
        raise error from last_error

    def permanent(self, failure: Failure) -> NoReturn:
        error = failure.error
        attempts = len(self.records)
        if isinstance(error, MCPError) and error.code == wire.OUTCOME_UNKNOWN:
            telemetry.gave_up(self.name, attempts, "server", True)
            report = self.report("outcome_unknown", give_up="server")
            unknown = ServerOutcomeUnknown(
                tool=self.name, key=self.key, attempts=attempts, last_error=error, report=report
            )
            fire("on_give_up", self.policy.on_give_up, unknown)
            raise unknown from error
        report = self.report("error")
        if isinstance(error, MCPError):
            raise tool_call_error(
                error,
                tool=self.name,
                key=self.key,
                attempts=attempts,
                http_status=failure.http_status,
                report=report,
            ) from error
        raise error
