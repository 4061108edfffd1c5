"""Task-augmented calls on the wire (SEP-2663, the 2026-07-28 `io.modelcontextprotocol/tasks`
extension): what is sent, what comes back.

A client opts in per request: the request's capabilities (`_meta`
`io.modelcontextprotocol/clientCapabilities`, which the SDK stamps on every request of a session
from the extensions the session was made with) declare the extension, and a server may then
answer a `tools/call` of a task-capable tool with a flat `CreateTaskResult` (`resultType`
"task", `taskId`, `status`, `createdAt`, `lastUpdatedAt`, `ttlMs`, `pollIntervalMs`) instead of
the tool's result. `tasks/get` polls it: the task's fields, and once it is terminal its outcome
inlined (`result`, or `error`; `inputRequests` while it waits for input, answered with
`tasks/update`); `tasks/cancel` asks it to stop. There is no `tasks/result` (the 2025-11-25
core-era method) and no client-chosen task id or TTL. Tasks exist on 2026-07-28 sessions only:
on a 2025-era session the SDK advertises no claimed result, and the server never tasks.

The task id is the receiver's, so creating a task is not idempotent by itself: a lost
`CreateTaskResult` leaves the caller no id to poll, and a re-send would create a second task.
That is why a task creation is a call like any other here (rule 23): it carries the call's key,
a lost answer is maybe-executed (re-sent only through the gate, under the same key), and a
guarded server or the proxy answers the re-send with the task the key's record holds, marked as
a replay. A server that runs the call plain (it does not task that tool) answers with the tool's
`CallToolResult`, returned as it came.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any, ClassVar, Literal

import anyio
from mcp import MCPError
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientSession
from mcp_types import (
    CallToolResult,
    ErrorData,
    InputRequiredResult,
    Request,
    RequestParams,
    Result,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict, Field, TypeAdapter

#: The tasks extension's identifier (SEP-2663), declared in a request's capabilities.
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"

#: The `resultType` of a task creation's answer (the tasks extension's claimed result).
TASK_RESULT_TYPE = "task"

#: The statuses after which a task changes no more.
TERMINAL = frozenset({"completed", "failed", "cancelled"})


class _TaskFields(Result):
    """The fields every task answer carries (`CreateTaskResult`, `tasks/get`);
    a field a server adds is kept, so that the proxy stores and forwards the task as it came."""

    model_config = ConfigDict(extra="allow")

    task_id: str
    status: str
    created_at: str | None = None
    last_updated_at: str | None = None
    ttl_ms: int | None = None
    status_message: str | None = None
    poll_interval_ms: int | None = None


class TaskCreated(_TaskFields):
    """A server's answer to a task-augmented `tools/call`: the task it created (`task_id`, to
    poll with `RetryingSession.get_task`). A guarded server's replay of it carries the
    idempotency `_meta` marker (`status` "replayed"), like any replayed answer."""

    result_type: Literal["task"] = "task"


class TaskState(_TaskFields):
    """`tasks/get`'s answer: the task's status and, once it is terminal,
    its outcome inlined: `result` (the tool's `CallToolResult`, as a mapping) or `error` (a
    JSON-RPC error object); `input_requests` while it waits for `tasks/update`."""

    result_type: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def outcome(self) -> CallToolResult:
        """The tool's result of a completed task; `MCPError` (the inlined error) for a failed
        one; ValueError for a task with no outcome yet (or a cancelled one: it has none)."""
        if self.error is not None:
            raise MCPError.from_error_data(ErrorData.model_validate(self.error))
        if self.result is None:
            raise ValueError(f"task {self.task_id!r} has no result ({self.status})")
        return CallToolResult.model_validate(self.result)


class TaskIdParams(RequestParams):
    task_id: str


class UpdateTaskParams(TaskIdParams):
    input_responses: dict[str, Any]


#: The param the 2026-07-28 HTTP transport mirrors into the `Mcp-Name` header of a task's
#: requests (SEP-2243, extended by SEP-2663 to the tasks methods, whose name-shaped field is the
#: task id): a server that reads the body checks the two agree, and may refuse a request without
#: it (-32020). The SDK's client sends the header for a request type that names its param.
_TASK_NAME_PARAM = "taskId"


class GetTask(Request[TaskIdParams, Literal["tasks/get"]]):
    name_param: ClassVar[str | None] = _TASK_NAME_PARAM
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams


class CancelTask(Request[TaskIdParams, Literal["tasks/cancel"]]):
    name_param: ClassVar[str | None] = _TASK_NAME_PARAM
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams


class UpdateTask(Request[UpdateTaskParams, Literal["tasks/update"]]):
    name_param: ClassVar[str | None] = _TASK_NAME_PARAM
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateTaskParams


#: `tasks/get`'s answer.
TASK_STATE: TypeAdapter[TaskState] = TypeAdapter(TaskState)

#: `tasks/update`'s and `tasks/cancel`'s answer (an acknowledgement, SEP-2663).
TASK_UPDATED: TypeAdapter[Result] = TypeAdapter(Result)

#: What a task-augmented `tools/call` may be answered with: the task (tried first: it needs a
#: `taskId`), a question asked before the task is created (an input-required round, SEP-2322
#: composed with SEP-2663; it needs `inputRequests` or `requestState`), or, from a server that
#: ran the call plain, the tool's result.
TASK_ANSWER: TypeAdapter[TaskCreated | InputRequiredResult | CallToolResult] = TypeAdapter(
    Annotated[TaskCreated | InputRequiredResult | CallToolResult, Field(union_mode="left_to_right")]
)


async def poll_interval(state: TaskState | TaskCreated) -> None:
    """Wait as long as the server asked between polls (`pollIntervalMs`; 0.1 s when it did not
    say, at least 0.02 s so that a server saying 0 cannot spin the client)."""
    ms = state.poll_interval_ms
    await anyio.sleep(max(0.02, ms / 1000) if ms is not None and ms > 0 else 0.1)


async def until_done(
    task_id: str,
    poll: Callable[[], Awaitable[TaskState]],
    waited: TaskState | TaskCreated | None = None,
) -> CallToolResult:
    """Poll task `task_id` (`poll`: one `tasks/get`) at the server's pace until it is terminal,
    after waiting out `waited`'s interval if given; its inlined result, or its error raised
    (`TaskState.outcome`). A task that asks for input is a RuntimeError: its answers go with
    `tasks/update`, which a wait cannot send."""
    while True:
        if waited is not None:
            await poll_interval(waited)
        state = await poll()
        if state.terminal:
            return state.outcome()
        if state.status == "input_required":
            raise RuntimeError(
                f"task {task_id!r} waits for input: answer its input_requests with"
                " RetryingSession.update_task, then wait again"
            )
        waited = state


async def _resolved(created: TaskCreated, ctx: ClaimContext) -> CallToolResult:
    """A plain `call_tool` the server answered with a task (the session declares the
    extension): polled to its end, as fastmcp-tasks' client does, so that the caller gets the
    tool's result as from a plain call."""
    session: ClientSession = ctx.session
    request = GetTask(params=TaskIdParams(task_id=created.task_id))

    async def poll() -> TaskState:
        return await session.send_request(request, TASK_STATE, ctx.read_timeout_seconds)

    return await until_done(created.task_id, poll, created)


class TasksExtension(ClientExtension):
    """The tasks extension for a session (`Client(..., extensions=[TasksExtension()])`): its
    requests then declare it, so a server may answer a task-capable tool's call with a task.
    `RetryingSession.create_task` reads that task; a plain `call_tool` on the same session that
    gets one polls it to its end and returns the tool's result."""

    identifier = TASKS_EXTENSION

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (
            ResultClaim(
                result_type=TASK_RESULT_TYPE,
                model=TaskCreated,
                resolve=_resolved,
                protocol_versions=frozenset(MODERN_PROTOCOL_VERSIONS),
            ),
        )
