"""SEP-2663 tasks on the wire for the tests, with the SDK alone: the flat `CreateTaskResult`
(`CreateTask`, `new_task`), the production half of a claimed `tools/call` result the SDK lacks
(`producing_tasks`, the proxy's front's own, as `fastmcp_tasks.wire_production` installs it),
and a client that declares the tasks extension and reads the task itself (`TasksClient`,
`create`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal, cast

from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp_types import CallToolResult, RequestParamsMeta, Result
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, Field

from mcp_once.proxy.tasks import producing_tasks as producing_tasks  # re-exported for the tests

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
    client: Any,
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
