"""An in-process `io.modelcontextprotocol/tasks` backend for FastMCP (SEP-2663), and its client.

`fastmcp-tasks` 4.1.6 (the Docket-backed extension) is not on PyPI and 4.1.4 is pinned against an
older FastMCP, so the tests serve tasks with this backend: a FastMCP `ServerExtension` like the
real one (the same seams: a `tools/call` interceptor below the middleware chain that answers a
task-augmented call with a `CreateTaskResult`, `tasks/get`, a lifespan). Creating a task queues
it; the test is its worker: `work` runs a queued task's body, through
`idempotency.fastmcp.run_task_body` as a task backend calls it, and running it again is what a
queue's redelivery does.

Claimed results need the production half the SDK lacks: like `fastmcp_tasks.wire_production`,
the lifespan lets a modern `tools/call` result tagged `resultType: "task"` through
`serialize_server_result` as produced.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncGenerator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from fastmcp import Context, FastMCP
from fastmcp.server.extensions import (
    MethodBinding,
    ServerExtension,
    ToolCallContinuation,
    ToolCallOutcome,
)
from fastmcp.tools.base import Tool, ToolResult
from mcp import MCPError
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    RequestParams,
)
from pydantic import Field
from task_wire import TASKS, new_task, producing_tasks

from idempotency.fastmcp import run_task_body


class GetTaskParams(RequestParams):
    task_id: str = Field(alias="taskId")


@dataclass
class TaskState:
    tool: Tool
    arguments: dict[str, Any]
    status: str = "working"
    result: CallToolResult | None = None
    error: dict[str, Any] | None = None


class InProcessTasks(ServerExtension):
    """Tasks served in process; counts the tasks it created (`created`)."""

    identifier = TASKS

    def __init__(self, *, create_gate: anyio.Event | None = None) -> None:
        self.tasks: dict[str, TaskState] = {}
        self.created = 0
        #: When set, a creation waits for it before answering (its answer can then be lost).
        self.create_gate = create_gate

    def methods(self) -> Sequence[MethodBinding]:
        return [MethodBinding("tasks/get", GetTaskParams, self._get)]

    async def _get(self, ctx: Any, params: GetTaskParams) -> dict[str, Any]:
        state = self.tasks[params.task_id]
        answer: dict[str, Any] = {"taskId": params.task_id, "status": state.status}
        if state.result is not None:
            answer["result"] = state.result.model_dump(by_alias=True, mode="json")
        if state.error is not None:
            answer["error"] = state.error
        return answer

    @asynccontextmanager
    async def lifespan(self) -> AsyncGenerator[None, None]:
        with producing_tasks():
            yield

    async def intercept_tool_call(
        self, params: CallToolRequestParams, context: Context, call_next: ToolCallContinuation
    ) -> ToolCallOutcome:
        tool = await context.fastmcp.get_tool(params.name)
        if (
            tool is None
            or not tool.task_config.supports_tasks()
            or context.client_extension_settings(TASKS) is None
        ):
            return await call_next()
        task_id = secrets.token_urlsafe(24)
        self.created += 1
        self.tasks[task_id] = TaskState(tool, dict(params.arguments or {}))
        if self.create_gate is not None:
            await self.create_gate.wait()
        return new_task(task_id)

    async def work(self, server: FastMCP[Any], task_id: str) -> TaskState:
        """Run queued task `task_id`'s body (again, for a redelivery), as a worker does."""
        state = self.tasks[task_id]

        async def body() -> ToolResult:
            return await state.tool.run(state.arguments)

        try:
            result = await run_task_body(server, state.tool, task_id, state.arguments, body)
        except MCPError as exc:
            state.status, state.error = "failed", {"code": exc.error.code}
        else:
            state.status = "completed"
            state.result = CallToolResult.model_validate(
                result.to_mcp_result().model_dump(by_alias=True)  # type: ignore[union-attr]
            )
        return state
