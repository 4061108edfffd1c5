"""The conformance fixture's tasks extension (SEP-2663, `io.modelcontextprotocol/tasks`): the tools
and the task surface the suite's `tasks-*` scenarios (0.2.0-alpha.x) expect, with an in-memory
task store, on the SDK's `MCPServer` extension seams.

The scenarios name the tools (`greet` sync-only; `slow_compute`, `failing_job`,
`protocol_error_job`, `confirm_delete`, `multi_input`, `test_tool_with_task` task-supporting, the
last two of them required) and check the wire: a flat `CreateTaskResult` (`resultType: "task"`)
for a caller that declared the extension on its request, a plain result otherwise (-32021 for a
required-task tool), `tasks/get` with the result, the error or the pending `inputRequests`
inlined, `tasks/update` and `tasks/cancel` acked with an empty `{resultType: "complete"}`,
-32602 for an unknown task. In guarded mode the fixture wraps this extension with
`idempotency.idempotent_tasks(...)`, so every task creation runs under the guard (rule 23); the
bodies run in the fixture's task group (`TasksFixture.running`).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
from anyio.abc import TaskGroup
from mcp import MCPError
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding, ToolBinding
from mcp.shared.inbound import MCP_NAME_HEADER
from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CallToolRequestParams,
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    InputRequiredResult,
    RequestParams,
    TextContent,
)
from pydantic import BaseModel, ConfigDict, Field

TASKS = "io.modelcontextprotocol/tasks"
TTL_MS = 600_000
POLL_MS = 100
#: Task-supporting tools: "optional" tasks for a declaring caller only; "required" refuses others.
TASK_TOOLS: Mapping[str, str] = {
    "slow_compute": "optional",
    "failing_job": "required",
    "protocol_error_job": "optional",
    "confirm_delete": "optional",
    "multi_input": "optional",
    "test_tool_with_task": "required",
}
TERMINAL = frozenset({"completed", "failed", "cancelled"})


class TaskIdParams(RequestParams):
    """`tasks/get` and `tasks/cancel`."""

    model_config = ConfigDict(populate_by_name=True)
    task_id: str = Field(alias="taskId")


class UpdateParams(TaskIdParams):
    """`tasks/update`: the caller's answers to the task's pending input requests."""

    input_responses: dict[str, Any] = Field(alias="inputResponses")


class Ack(BaseModel):
    """The empty acknowledgement of `tasks/update` and `tasks/cancel`."""

    result_type: str = Field(default="complete", serialization_alias="resultType")


class Flat(BaseModel):
    """A flat wire object (a task, a `tasks/get` answer), produced as given."""

    model_config = ConfigDict(extra="allow")


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _ask(message: str, field_name: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {field_name: {"type": "string"}}}
    params = ElicitRequestFormParams(message=message, requested_schema=schema)
    return ElicitRequest(params=params).model_dump(by_alias=True, mode="json", exclude_none=True)


def _text(text: str, error: bool = False) -> dict[str, Any]:
    result = CallToolResult(content=[TextContent(type="text", text=text)], is_error=error)
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


def declared(meta: Mapping[str, Any] | None) -> bool:
    """Whether the request's `_meta` declares the tasks extension (SEP-2575 per request)."""
    capabilities = (meta or {}).get(CLIENT_CAPABILITIES_META_KEY)
    found = capabilities.get("extensions") if isinstance(capabilities, Mapping) else None
    return isinstance(found, Mapping) and isinstance(found.get(TASKS), Mapping)


def _missing() -> MCPError:
    return MCPError(
        MISSING_REQUIRED_CLIENT_CAPABILITY,
        f"this request requires the {TASKS} extension",
        {"requiredCapabilities": {"extensions": {TASKS: {}}}},
    )


@dataclass
class Task:
    task_id: str
    status: str = "working"
    created_at: str = field(default_factory=_now)
    updated_at: str = ""
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    answers: dict[str, Any] = field(default_factory=dict)
    changed: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    def set(self, status: str, **values: Any) -> None:
        if self.status in TERMINAL:
            return
        self.status, self.updated_at = status, _now()
        for name, value in values.items():
            setattr(self, name, value)
        self.changed.set()
        self.changed = anyio.Event()

    def wire(self) -> dict[str, Any]:
        task: dict[str, Any] = {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": self.created_at,
            "lastUpdatedAt": self.updated_at or self.created_at,
            "ttlMs": TTL_MS,
            "pollIntervalMs": POLL_MS,
        }
        if self.status == "completed" and self.result is not None:
            task["result"] = self.result
        if self.status == "failed" and self.error is not None:
            task["error"] = self.error
        if self.status == "input_required":
            task["inputRequests"] = dict(self.pending)
        return task


class TasksFixture(Extension):
    """The tasks extension the scenarios expect: tools, task creation, tasks/get|update|cancel."""

    identifier = TASKS

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}
        self._ids = itertools.count(1)
        self._group: TaskGroup | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The task group the bodies run in, for as long as the server serves. What ends the
        server (SystemExit on SIGTERM) leaves as itself, not wrapped in an exception group."""
        try:
            async with anyio.create_task_group() as group:
                self._group = group
                try:
                    yield
                finally:
                    group.cancel_scope.cancel()
        except BaseExceptionGroup as ended:
            if len(ended.exceptions) == 1:
                raise ended.exceptions[0] from None
            raise

    def tools(self) -> Sequence[ToolBinding]:
        async def greet(name: str) -> str:
            return f"Hello, {name}!"

        async def slow_compute(seconds: float = 0) -> str:
            await anyio.sleep(seconds)
            return f"computed after {seconds}s"

        async def failing_job() -> CallToolResult:
            return CallToolResult(content=[TextContent(type="text", text="failed")], is_error=True)

        async def protocol_error_job() -> str:
            raise MCPError(INTERNAL_ERROR, "protocol_error_job fails by design")

        async def confirm_delete(filename: str = "") -> str:
            return f"deleted {filename}"

        async def multi_input() -> str:
            return "both answered"

        async def test_tool_with_task() -> str:
            return "needs the tasks extension"

        described: dict[Callable[..., Any], str] = {
            greet: "Sync-only: greets",
            slow_compute: "Task-supporting: sleeps `seconds`, then answers",
            failing_job: "Task-required: ends in a tool error",
            protocol_error_job: "Task-supporting: ends in a protocol error",
            confirm_delete: "Task-supporting: asks for a confirmation first",
            multi_input: "Task-supporting: asks two questions at once",
            test_tool_with_task: "Task-required: asks for a name (MRTR), then tasks",
        }
        return [ToolBinding(fn, kwargs={"description": text}) for fn, text in described.items()]

    def methods(self) -> Sequence[MethodBinding]:
        return (
            MethodBinding("tasks/get", TaskIdParams, self._get),
            MethodBinding("tasks/update", UpdateParams, self._update),
            MethodBinding("tasks/cancel", TaskIdParams, self._cancel),
        )

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        support = TASK_TOOLS.get(params.name)
        if support is None:
            return await call_next(ctx)
        if not declared(params.meta):
            if support == "required":
                raise _missing()
            return await call_next(ctx)
        arguments = dict(params.arguments or {})
        if params.name == "test_tool_with_task":
            name = _answer((params.input_responses or {}).get("user_name"), "name")
            if name is None:
                return InputRequiredResult(
                    input_requests={
                        "user_name": ElicitRequest.model_validate(
                            _ask("What is your name?", "name")
                        )
                    }
                )
            arguments["user_name"] = name
        task = Task(f"task-{next(self._ids)}")
        self.tasks[task.task_id] = task
        if self._group is None:
            raise RuntimeError("the tasks fixture is not running (TasksFixture.running)")
        self._group.start_soon(self._body, task, params.name, arguments)
        return Flat.model_validate({"resultType": "task", **task.wire()})

    async def _body(self, task: Task, tool: str, arguments: dict[str, Any]) -> None:
        with task.scope:
            if tool == "slow_compute":
                seconds = float(arguments.get("seconds") or 0)
                await anyio.sleep(seconds)
                task.set("completed", result=_text(f"computed after {seconds}s"))
            elif tool == "failing_job":
                await anyio.sleep(0.2)
                task.set("completed", result=_text("job failed", error=True))
            elif tool == "protocol_error_job":
                await anyio.sleep(0.2)
                task.set("failed", error={"code": INTERNAL_ERROR, "message": "by design"})
            elif tool == "confirm_delete":
                answers = await self._ask(task, {"confirm": _ask("Delete the file?", "ok")})
                task.set("completed", result=_text(f"deleted? {answers['confirm']}"))
            elif tool == "multi_input":
                asked = {"first": _ask("First?", "a"), "second": _ask("Second?", "b")}
                await self._ask(task, asked)
                task.set("completed", result=_text("both answered"))
            else:
                task.set("completed", result=_text(f"Hello, {arguments['user_name']}!"))

    async def _ask(self, task: Task, requests: dict[str, dict[str, Any]]) -> dict[str, Any]:
        task.set("input_required", pending=dict(requests))
        while task.pending:
            await task.changed.wait()
        task.set("working")
        return task.answers

    def _find(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> Task:
        if not declared(params.meta):
            raise _missing()
        # SEP-2663 extends SEP-2243's Mcp-Name to the tasks methods (the task id); the SDK checks
        # it for the core methods only.
        headers = getattr(ctx.request, "headers", None)
        if headers is not None and headers.get(MCP_NAME_HEADER) != params.task_id:
            raise MCPError(HEADER_MISMATCH, f"{MCP_NAME_HEADER} header does not match taskId")
        task = self.tasks.get(params.task_id)
        if task is None:
            raise MCPError(INVALID_PARAMS, f"Task {params.task_id} not found")
        return task

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> Flat:
        return Flat.model_validate({"resultType": "complete", **self._find(ctx, params).wire()})

    async def _update(self, ctx: ServerRequestContext[Any, Any], params: UpdateParams) -> Ack:
        task = self._find(ctx, params)
        for key, answer in params.input_responses.items():
            if key in task.pending:
                del task.pending[key]
                task.answers[key] = answer
        if task.status == "input_required":
            task.updated_at = _now()
            task.changed.set()
            task.changed = anyio.Event()
        return Ack()

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> Ack:
        task = self._find(ctx, params)
        if task.status not in TERMINAL:
            task.set("cancelled")
            task.scope.cancel()
        return Ack()


def _answer(response: Any, field_name: str) -> str | None:
    """An accepted elicitation answer's `field_name` (a model or its wire form)."""
    if isinstance(response, BaseModel):
        response = response.model_dump(by_alias=True, mode="json")
    if not isinstance(response, Mapping) or response.get("action") != "accept":
        return None
    value = (response.get("content") or {}).get(field_name)
    return None if value is None else str(value)
