"""A task-capable MCP server the tests did not guard, on the real SEP-2663 wire (the 2026-07-28
`io.modelcontextprotocol/tasks` extension, as `fastmcp_tasks` serves it): the SDK's `MCPServer`
with a minimal tasks extension and an effect ledger. A `tools/call` of a tool whose request
declared the extension (the request's `_meta` client capabilities) is answered with a flat
`CreateTaskResult` (`resultType` "task", `taskId`, `status`, ...), produced on the wire as
`fastmcp_tasks.wire_production` does (`producing_tasks`); `tasks/get` answers the task's fields
with its result inlined; `tasks/update` and `tasks/cancel` acknowledge (empty, as SEP-2663 says).
A request that did not declare the extension is run plain.

    python tests/task_server.py LEDGER_DIR PORT      streamable HTTP at /mcp on PORT

Files in LEDGER_DIR, each appended with one line and fsynced before anything else happens, so
what a test counts is what happened, whatever a client or the proxy says:
  calls    one line per `tools/call` received: "task <key>" or "plain <key>"
  effects  one line per effect of a tool (one per task created, or per plain call)
  tasks    one line per task created: its id
The task's body runs when the task is created (it is done before the `CreateTaskResult` is sent),
so a lost `CreateTaskResult` is a task that exists and an effect that happened. Every task is
remembered by this process only: a test that restarts it asks nothing of the old ones.

Task requests (`tasks/get|update|cancel`) whose `Mcp-Name` header is not their task id (or is
missing) are refused with -32020, as the 2026-07-28 HTTP transport lets a server refuse them.
`approve({target})`, called declaring the extension, first asks (an input-required round, key
"ok") and creates its task only when the continuation carries an accepting answer.

`deploy({target})` has `idempotentHint` (a client may re-send it under its key); `release` is the
same tool without it, and `release({target, crash: true})` SIGKILLs this process right after its
effect, before any answer (a task's `CreateTaskResult` lost with the server).
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

from mcp import MCPError
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp.shared.inbound import MCP_NAME_HEADER
from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    HEADER_MISMATCH,
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    InputRequiredResult,
    RequestParams,
    ToolAnnotations,
)
from pydantic import Field
from task_wire import TASKS, CreateTask, new_task, producing_tasks

KEY_META = "io.github.mcp-once/idempotency-key"


class TaskId(RequestParams):
    task_id: str = Field(alias="taskId")


def _record(ledger: Path, file: str, line: str) -> None:
    fd = os.open(ledger / file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def routed(ctx: Any, task_id: str) -> None:
    """Refuse a task request over HTTP whose `Mcp-Name` header is not its task id (SEP-2663
    extends SEP-2243's routing header to the tasks methods), missing included: -32020."""
    headers = getattr(ctx.request, "headers", None)
    if headers is not None and headers.get(MCP_NAME_HEADER) != task_id:
        raise MCPError(HEADER_MISMATCH, f"{MCP_NAME_HEADER} header does not match taskId")


_ASK = ElicitRequestFormParams(
    message="Approve?", requested_schema={"type": "object", "properties": {}}
)


def _approved(responses: dict[str, Any] | None) -> bool:
    answer = (responses or {}).get("ok")
    if answer is not None and not isinstance(answer, dict):
        answer = answer.model_dump(by_alias=True, mode="json")
    return isinstance(answer, dict) and answer.get("action") == "accept"


def declared(meta: dict[str, Any]) -> bool:
    """Whether a request declared the tasks extension in its per-request capabilities."""
    capabilities = meta.get(CLIENT_CAPABILITIES_META_KEY)
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return isinstance(extensions, dict) and isinstance(extensions.get(TASKS), dict)


class _Tasks(Extension):
    identifier = TASKS

    def __init__(self, ledger: Path) -> None:
        self.ledger = ledger
        self.tasks: dict[str, tuple[CreateTask, CallToolResult]] = {}

    def methods(self) -> list[MethodBinding]:
        async def get(ctx: Any, params: TaskId) -> dict[str, Any]:
            routed(ctx, params.task_id)
            task, result = self._task(params.task_id)
            inlined = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            return {**self._fields(task), "resultType": "complete", "result": inlined}

        async def update(ctx: Any, params: TaskId) -> dict[str, Any]:
            routed(ctx, params.task_id)
            self._task(params.task_id)
            return {}

        async def cancel(ctx: Any, params: TaskId) -> dict[str, Any]:
            routed(ctx, params.task_id)
            self._task(params.task_id)
            return {"resultType": "complete"}  # SEP-2663: an empty acknowledgement

        return [
            MethodBinding("tasks/get", TaskId, get),
            MethodBinding("tasks/update", TaskId, update),
            MethodBinding("tasks/cancel", TaskId, cancel),
        ]

    @staticmethod
    def _fields(task: CreateTask) -> dict[str, Any]:
        fields = task.model_dump(by_alias=True, mode="json", exclude_none=True)
        del fields["resultType"]
        return fields

    def _task(self, task_id: str) -> tuple[CreateTask, CallToolResult]:
        found = self.tasks.get(task_id)
        if found is None:
            raise MCPError(-32602, f"no task {task_id!r}")
        return found

    async def intercept_tool_call(self, params: Any, ctx: Any, call_next: Any) -> Any:
        meta = dict(params.meta or {})
        task = declared(meta)
        _record(self.ledger, "calls", f"{'task' if task else 'plain'} {meta.get(KEY_META)}")
        if not task:
            return await call_next(ctx)
        if params.name == "approve" and not _approved(params.input_responses):
            # Asks before it creates the task (SEP-2322 composed with SEP-2663): the task is
            # created only by the continuation that carries the answer.
            return InputRequiredResult(input_requests={"ok": ElicitRequest(params=_ASK)})
        out = await call_next(ctx)  # the body, run now: the effect happens before the answer
        created = new_task(uuid.uuid4().hex).model_copy(update={"status": "completed"})
        self.tasks[created.task_id] = (created, CallToolResult.model_validate(out))
        _record(self.ledger, "tasks", created.task_id)
        return created.model_dump(by_alias=True, mode="json", exclude_none=True)


def build(ledger: Path) -> MCPServer:
    """The server, writing its ledger in `ledger` (enter `producing_tasks()` to serve it)."""
    server = MCPServer("task-upstream", extensions=[_Tasks(ledger)])

    def effect(target: str) -> str:
        count = sum(1 for _ in (ledger / "effects").open()) if (ledger / "effects").exists() else 0
        _record(ledger, "effects", target)
        return f"deployed {target} (#{count + 1})"

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True))
    def deploy(target: str) -> str:
        return effect(target)

    @server.tool()
    def approve(target: str) -> str:
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
    with producing_tasks():
        build(ledger_dir).run("streamable-http", host="127.0.0.1", port=port)
