"""Task-augmented calls (the tasks extension, SEP-2663) on the wire: what is sent, what comes back.

A task-augmented `tools/call` carries `params.task` (`TaskMetadata`, its `ttl`), and a server
that runs it as a task answers at once with a `CreateTaskResult`: the task's id and status, not
the tool's result, which `tasks/result` gives later (`tasks/get` polls the status). The task id is
the receiver's, so creating a task is not idempotent by itself: a lost `CreateTaskResult` leaves
the caller no id to poll, and a re-send would create a second task. That is why a task creation
is a call like any other here (rule 23): it carries the call's key, a lost answer is
maybe-executed (re-sent only through the gate, under the same key), and a guarded server or the
proxy answers the re-send with the task the key's record holds, marked as a replay.

On a 2026-07-28 session the tasks extension's result is a shape of its own (`resultType`
"task", which the SDK's server sends as it is and no core model reads), so it is read here as
`TaskCreated`. A server without tasks may run the call as a plain one: its `CallToolResult` is
returned as it came. Polling (`tasks/get`, `tasks/result`) changes nothing on the server, so the
client re-sends it at will (`RetryingSession.get_task`, `RetryingSession.task_result`).
"""

from __future__ import annotations

from typing import Any

from mcp_types import CallToolResult, CreateTaskResult, GetTaskResult, Task
from pydantic import TypeAdapter

#: The `resultType` of a task creation's answer on a 2026-07-28 session (the tasks extension's).
TASK_RESULT_TYPE = "task"


class _Task(Task):
    """A task as servers send it: `ttl` (null: unlimited) left out by those that drop nulls (the
    Python SDK's serializer does), read as null."""

    ttl: int | None = None


class TaskCreated(CreateTaskResult):
    """A server's answer to a task-augmented `tools/call`: the task it created (`task.task_id`,
    to poll with `tasks/get` and read with `tasks/result`). A guarded server's replay of it
    carries the idempotency `_meta` marker (`status` "replayed"), like any replayed answer."""

    task: _Task
    result_type: str = TASK_RESULT_TYPE


class _Polled(GetTaskResult):
    """`tasks/get`'s answer, `ttl` read as `_Task` reads it."""

    ttl: int | None = None


#: `tasks/get`'s answer.
TASK_STATUS: TypeAdapter[GetTaskResult] = TypeAdapter(_Polled)

#: What a task-augmented `tools/call` may be answered with: the task, or (a server that ran it as
#: a plain call) the tool's result.
TASK_ANSWER: TypeAdapter[TaskCreated | CallToolResult] = TypeAdapter(TaskCreated | CallToolResult)


def task_metadata(ttl: Any) -> dict[str, Any]:
    """`params.task` for a requested retention of `ttl` milliseconds (None: the server's)."""
    if ttl is None:
        return {}
    if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0:
        raise ValueError(f"ttl must be a positive number of milliseconds or None, got {ttl!r}")
    return {"ttl": ttl}
