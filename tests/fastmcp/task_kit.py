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
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, cast

import anyio
import mcp_types.methods as methods
from fastmcp import Client, Context, FastMCP
from fastmcp.server.extensions import (
    MethodBinding,
    ServerExtension,
    ToolCallContinuation,
    ToolCallOutcome,
)
from fastmcp.tools.base import Tool, ToolResult
from mcp import MCPError
from mcp.client import Client as LowLevelClient
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    RequestParams,
    RequestParamsMeta,
    Result,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, Field

from idempotency.fastmcp import run_task_body

TASKS = "io.modelcontextprotocol/tasks"
TTL_MS = 3_600_000


class CreateTask(BaseModel):
    """SEP-2663's flat `CreateTaskResult`, as `fastmcp_tasks.models` spells it."""

    model_config = ConfigDict(populate_by_name=True)
    result_type: Literal["task"] = Field(default="task", serialization_alias="resultType")
    task_id: str = Field(serialization_alias="taskId")
    status: str
    created_at: str = Field(serialization_alias="createdAt")
    last_updated_at: str = Field(serialization_alias="lastUpdatedAt")
    ttl_ms: int | None = Field(serialization_alias="ttlMs")
    poll_interval_ms: int | None = Field(default=None, serialization_alias="pollIntervalMs")


class GetTaskParams(RequestParams):
    task_id: str = Field(alias="taskId")


@dataclass
class TaskState:
    tool: Tool
    arguments: dict[str, Any]
    status: str = "working"
    result: CallToolResult | None = None
    error: dict[str, Any] | None = None


@contextmanager
def producing_tasks() -> Iterator[None]:
    """While entered, a modern `tools/call` result tagged `resultType: "task"` goes on the wire
    as produced (what `fastmcp_tasks.wire_production` installs for the real extension)."""
    original = methods.serialize_server_result

    def serialize(method: str, version: str, data: Mapping[str, Any], **kwargs: Any) -> Any:
        if (
            not kwargs
            and method == "tools/call"
            and version in MODERN_PROTOCOL_VERSIONS
            and data.get("resultType") == "task"
        ):
            return dict(data)
        return original(method, version, data, **kwargs)

    methods.serialize_server_result = serialize
    try:
        yield
    finally:
        methods.serialize_server_result = original


def new_task(task_id: str) -> CreateTask:
    """A task just created, in `working` status."""
    now = datetime.now(UTC).isoformat()
    return CreateTask(
        task_id=task_id,
        status="working",
        created_at=now,
        last_updated_at=now,
        ttl_ms=TTL_MS,
        poll_interval_ms=50,
    )


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


class ClientTask(Result):
    """The client's reading of a `CreateTaskResult` (its `_meta` included)."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str


class TasksClient(ClientExtension):
    """Declares the tasks extension on every request and reads its claimed result."""

    identifier = TASKS

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (
            ResultClaim(
                result_type="task",
                model=ClientTask,
                resolve=self._unused,
                protocol_versions=frozenset(MODERN_PROTOCOL_VERSIONS),
            ),
        )

    async def _unused(self, result: ClientTask, ctx: ClaimContext) -> CallToolResult:
        raise AssertionError("the tests read the task itself (allow_claimed=True)")


async def create(
    client: Client[Any] | LowLevelClient,
    name: str,
    arguments: dict[str, Any],
    meta: dict[str, Any] | None,
    *,
    timeout: float | None = None,
) -> ClientTask | CallToolResult:
    """A task-augmented `tools/call`: the task the server created (or a plain result)."""
    answer = await client.session.call_tool(
        name,
        arguments,
        read_timeout_seconds=timeout,
        meta=cast("RequestParamsMeta | None", meta),
        allow_claimed=True,
    )
    assert isinstance(answer, ClientTask | CallToolResult), answer
    return answer
