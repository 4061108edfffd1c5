"""A task-capable MCP server the tests did not guard: the SDK's `MCPServer` with a minimal tasks
extension (a task-augmented `tools/call` answered with a `CreateTaskResult` of `resultType`
"task", `tasks/get`, `tasks/result`, `tasks/cancel`), and an effect ledger.

    python tests/task_server.py LEDGER_DIR PORT      streamable HTTP at /mcp on PORT

Files in LEDGER_DIR, each appended with one line and fsynced before anything else happens, so
what a test counts is what happened, whatever a client or the proxy says:
  calls    one line per `tools/call` of `deploy` received: "task <key>" or "plain <key>"
  effects  one line per effect of `deploy` (one per task created, or per plain call)
  tasks    one line per task created: its id
The task's body runs when the task is created (it is done before the `CreateTaskResult` is sent),
so a lost `CreateTaskResult` is a task that exists and an effect that happened. Every task is
remembered by this process only: a test that restarts it asks nothing of the old ones.

`deploy({target})` has `idempotentHint` (a client may re-send it under its key); `release` is the
same tool without it, and `release({target, crash: true})` SIGKILLs this process right after its
effect, before any answer (a task's `CreateTaskResult` lost with the server).
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp_types import (
    CallToolResult,
    CancelTaskRequestParams,
    CancelTaskResult,
    CreateTaskResult,
    GetTaskPayloadRequestParams,
    GetTaskRequestParams,
    GetTaskResult,
    Task,
    ToolAnnotations,
)

KEY_META = "io.github.mcp-once/idempotency-key"


class _Created(CreateTaskResult):
    result_type: str = "task"


def _record(ledger: Path, file: str, line: str) -> None:
    fd = os.open(ledger / file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class _Tasks(Extension):
    identifier = "io.modelcontextprotocol/tasks"

    def __init__(self, ledger: Path) -> None:
        self.ledger = ledger
        self.tasks: dict[str, tuple[Task, CallToolResult]] = {}

    def methods(self) -> list[MethodBinding]:
        async def get(ctx: Any, params: GetTaskRequestParams) -> GetTaskResult:
            task, _ = self._task(params.task_id)
            return GetTaskResult(**task.model_dump())

        async def result(ctx: Any, params: GetTaskPayloadRequestParams) -> CallToolResult:
            return self._task(params.task_id)[1]

        async def cancel(ctx: Any, params: CancelTaskRequestParams) -> CancelTaskResult:
            task, _ = self._task(params.task_id)
            return CancelTaskResult(**task.model_dump())

        return [
            MethodBinding("tasks/get", GetTaskRequestParams, get),
            MethodBinding("tasks/result", GetTaskPayloadRequestParams, result),
            MethodBinding("tasks/cancel", CancelTaskRequestParams, cancel),
        ]

    def _task(self, task_id: str) -> tuple[Task, CallToolResult]:
        from mcp import MCPError

        found = self.tasks.get(task_id)
        if found is None:
            raise MCPError(-32602, f"no task {task_id!r}")
        return found

    async def intercept_tool_call(self, params: Any, ctx: Any, call_next: Any) -> Any:
        meta = dict(params.meta or {})
        key = meta.get(KEY_META)
        _record(self.ledger, "calls", f"{'task' if params.task else 'plain'} {key}")
        if params.task is None:
            return await call_next(ctx)
        out = await call_next(ctx)  # the body, run now: the effect happens before the answer
        now = datetime.datetime.now(datetime.UTC).isoformat()
        task = Task(
            task_id=uuid.uuid4().hex,
            status="completed",
            created_at=now,
            last_updated_at=now,
            ttl=params.task.ttl,
        )
        self.tasks[task.task_id] = (task, out)
        _record(self.ledger, "tasks", task.task_id)
        return _Created(task=task)


def build(ledger: Path) -> MCPServer:
    """The server, writing its ledger in `ledger`."""
    server = MCPServer("task-upstream", extensions=[_Tasks(ledger)])

    def effect(target: str) -> str:
        count = sum(1 for _ in (ledger / "effects").open()) if (ledger / "effects").exists() else 0
        _record(ledger, "effects", target)
        return f"deployed {target} (#{count + 1})"

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True))
    def deploy(target: str) -> str:
        return effect(target)

    @server.tool()
    def release(target: str, crash: bool = False) -> str:
        done = effect(target)
        if crash:
            os.kill(os.getpid(), signal.SIGKILL)
        return done

    return server


if __name__ == "__main__":
    ledger_dir, port = Path(sys.argv[1]), int(sys.argv[2])
    build(ledger_dir).run("streamable-http", host="127.0.0.1", port=port)
