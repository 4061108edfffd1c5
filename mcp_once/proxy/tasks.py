"""Task-augmented calls through the proxy (rule 23): the task a key created is the key's answer.

A caller's `tools/call` with `params.task` (the tasks extension, SEP-2663) to a guarded tool is
claimed like any call and goes upstream once, with the task and under the record's upstream key
(`tools.py`). The upstream answers at once with the task it created (`TaskCreated`: its id, not
the tool's result), and that is what the record stores: the task, in the stored result's `_meta`
under `STORED_TASK` (`stored_task`), beside a line of text naming it. A re-send of the key (same
caller scope, same arguments; a lost `CreateTaskResult`, another replica) is the guard's replay
of that record, which the middleware turns back into the same `CreateTaskResult`, marked as a
replay (`task_answer`); no second task is created upstream. A plain re-send of the key is
refused as a re-use of the key for another request (-32011, naming the task: the caller asked for
a tool's result, and the key's answer is a task, which its SDK could not read); a task-augmented
re-send of a key whose record holds a plain answer gets that answer, as from a server that ran
the call plain.

The task's polls (`tasks/get`, `tasks/result`, `tasks/cancel`) are the upstream's to answer:
`TaskForwarding` sends them on, on the link's session (a poll is re-sent at will, a cancel once).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fastmcp.server.extensions import MethodBinding, ServerExtension
from fastmcp.tools.base import ToolResult
from mcp import MCPError
from mcp_types import (
    CallToolResult,
    CancelTaskRequestParams,
    GetTaskPayloadRequestParams,
    GetTaskRequestParams,
    GetTaskResult,
    TaskMetadata,
    TextContent,
)

from idempotency import wire
from orchestrator import TaskCreated

if TYPE_CHECKING:
    from fastmcp.server.context import Context

    from .upstream import UpstreamLink

#: Where a stored result keeps the task its call created (the `Task`, as the upstream sent it).
STORED_TASK = "io.github.mcp-once/task"

#: The tasks extension's identifier, which the proxy's front advertises for the polls it forwards.
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"


def requested_task(ctx: Context | None) -> TaskMetadata | None:
    """The `params.task` of the call as sent (FastMCP's middleware message and the tool's run
    are given the call without it, so the wire request's own params are read)."""
    wrapped = None if ctx is None else ctx.request_context
    params = None if wrapped is None else wrapped._srctx.params
    task = params.get("task") if isinstance(params, Mapping) else getattr(params, "task", None)
    if task is None:
        return None
    return task if isinstance(task, TaskMetadata) else TaskMetadata.model_validate(task)


def stored_task(created: TaskCreated) -> ToolResult:
    """The result the record keeps for a created task: the task in `_meta`, named in text."""
    task = created.task.model_dump(by_alias=True, mode="json", exclude_none=True)
    text = f"task {created.task.task_id} created ({created.task.status})"
    return ToolResult(
        content=[TextContent(type="text", text=text)],
        meta={**(created.meta or {}), STORED_TASK: task},
    )


def task_answer(result: ToolResult) -> TaskCreated | None:
    """The `CreateTaskResult` a stored (or just stored) task is answered with, its `_meta` the
    result's (the guard's marker: executed, or replayed); None for a result that holds no task."""
    if not result.meta or STORED_TASK not in result.meta:
        return None  # every plain answer: nothing copied
    meta: dict[str, Any] = dict(result.meta)
    task = meta.pop(STORED_TASK)
    if not isinstance(task, Mapping):
        return None
    return TaskCreated.model_validate({"task": task, "_meta": meta or None})


def plain_resend(tool: str, created: TaskCreated, result: ToolResult) -> MCPError:
    """The refusal of a plain call whose key's record holds a task (see the module doc)."""
    marker = (result.meta or {}).get(wire.IDEMPOTENCY_META)
    key = marker.get("key") if isinstance(marker, Mapping) else None
    task_id = created.task.task_id
    return MCPError(
        wire.KEY_REUSED,
        f"This idempotency key of tool {tool!r} created task {task_id!r} (a task-augmented"
        " call); re-send it with params.task to get the task again, or poll the task"
        " (tasks/get, tasks/result). A plain call needs a new key. Do not retry as is.",
        {"key": key, "tool": tool, "taskId": task_id},
    )


class TaskForwarding(ServerExtension):
    """The tasks extension on the proxy's front: its polls, sent on to the upstream."""

    identifier = TASKS_EXTENSION

    def __init__(self, link: UpstreamLink) -> None:
        self.link = link

    def clone(self) -> TaskForwarding:
        return TaskForwarding(self.link)  # the link is shared, never copied

    def methods(self) -> list[MethodBinding]:
        link = self.link

        async def get(_: Any, params: GetTaskRequestParams) -> GetTaskResult:
            return await link.tasks().get_task(params.task_id)

        async def result(_: Any, params: GetTaskPayloadRequestParams) -> CallToolResult:
            return await link.tasks().task_result(params.task_id)

        async def cancel(_: Any, params: CancelTaskRequestParams) -> GetTaskResult:
            return await link.tasks().cancel_task(params.task_id)

        return [
            MethodBinding("tasks/get", GetTaskRequestParams, get),
            MethodBinding("tasks/result", GetTaskPayloadRequestParams, result),
            MethodBinding("tasks/cancel", CancelTaskRequestParams, cancel),
        ]
