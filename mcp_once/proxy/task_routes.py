"""Tasks through the gateway (SEP-2663): a task id the front hands out names the upstream that
created it, as a tool name does.

A task id is the receiver's, and says nothing of which upstream created it; the front must send
`tasks/get`, `tasks/update` and `tasks/cancel` for it to that upstream. The gateway namespaces
the ids it hands out exactly as it namespaces tool names: the upstream's own id `ID` of upstream
`NAME` is `NAME_ID` on the front (with one upstream, nothing is prefixed), and a task request is
routed by the same rule as a tool call (`OnceGateway.route`). Stateless, so it holds on every
replica and across restarts with nothing stored and no store round trip per poll; the rejected
alternative, a task-id-to-upstream mapping in the key store, would add a write per task and a
read per poll, and a poll that fails when the store does.

Each upstream's proxy guards and stores its tasks as a single proxy of it does: its record holds
the upstream's own `CreateTaskResult` (so a record written through the gateway is the one a
single proxy of the same entry replays, and the other way round), and the front prefixes the id
on every answer that carries one: the first `CreateTaskResult`, every replay of it, the -32011
refusal naming it (`data.taskId`), `tasks/get` and `tasks/cancel`. The prefix is a function of
the upstream's name alone, so the first answer and every replay, through any replica, carry the
same id, the one the caller polls with. The request itself goes to that upstream's own
`TaskForwarding` (`tasks.py`), with the upstream's id: whatever a single proxy does with a task
request, its proxy does behind the gateway. An id that names no upstream (or nothing after the
prefix) is an unknown task: -32602 "Task ID not found", as a task server answers one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastmcp.server.dependencies import bind_request_context
from fastmcp.server.extensions import MethodBinding, ServerExtension
from mcp import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value, encode_header_value
from mcp_types import INVALID_PARAMS
from pydantic import BaseModel
from starlette.requests import Request

from idempotency import TaskCreated
from orchestrator import TASK_RESULT_TYPE, TASKS_EXTENSION

from .tasks import producing_tasks

if TYPE_CHECKING:
    from .server import OnceProxy

#: The task requests a front answers (SEP-2663 has no `tasks/result`).
TASK_METHODS = ("tasks/get", "tasks/update", "tasks/cancel")


def front_id(prefix: str | None, task_id: str) -> str:
    """The front's id of upstream `prefix`'s task `task_id` (None: one upstream, unprefixed)."""
    return task_id if prefix is None else f"{prefix}_{task_id}"


def created_on_front(result: BaseModel, prefix: str | None) -> BaseModel:
    """A proxy's `tools/call` answer, its `CreateTaskResult`'s id as the front hands it out (a
    `ToolResult` or any other answer as it is)."""
    if prefix is None:
        return result
    fields = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    if fields.get("resultType") != TASK_RESULT_TYPE or "taskId" not in fields:
        return result
    return TaskCreated({**fields, "taskId": front_id(prefix, str(fields["taskId"]))})


def refusal_on_front(error: MCPError, prefix: str | None) -> MCPError:
    """A proxy's refusal naming a task (-32011 to a caller that did not declare the extension),
    the task's id as the front hands it out; any other error as it is."""
    data = error.error.data
    if prefix is None or not isinstance(data, dict) or not isinstance(data.get("taskId"), str):
        return error
    own = data["taskId"]
    front = front_id(prefix, own)
    message = error.error.message.replace(repr(own), repr(front))
    return MCPError(error.error.code, message, {**data, "taskId": front})


def _unknown(task_id: str) -> MCPError:
    return MCPError(INVALID_PARAMS, f"Task {task_id} not found")


def as_sent_upstream(ctx: Any, front: str, own: str) -> Any:
    """The request context of a task request for the front's id `front`, as the upstream's
    proxy is to see it: its HTTP request's routing header (`Mcp-Name`, which names the task on
    the 2026-07-28 HTTP transport) naming the upstream's own id `own`, as its body does, when it
    named `front`. A header naming another task is left as sent, for the proxy to refuse."""
    request = getattr(ctx, "request", None)
    if not isinstance(request, Request) or front == own:
        return ctx
    header = request.headers.get(MCP_NAME_HEADER)
    if header is None or decode_header_value(header) != front:
        return ctx
    name = MCP_NAME_HEADER.encode("latin-1")
    headers = [(k, v) for k, v in request.scope["headers"] if k.lower() != name]
    headers.append((name, encode_header_value(own).encode("latin-1")))
    rewritten = Request({**request.scope, "headers": headers}, request.receive)
    return dataclasses.replace(ctx, request=rewritten)


#: A front task id's upstream proxy, its prefix and the upstream's own id (None: no upstream's).
Router = Callable[[str], "tuple[OnceProxy, str | None, str] | None"]


class TaskRoutes(ServerExtension):
    """The tasks extension on the gateway's front: each task request sent to the `TaskForwarding`
    of the upstream its id names (see the module doc)."""

    identifier = TASKS_EXTENSION

    def __init__(self, route: Router, params: Mapping[str, type[BaseModel]]) -> None:
        self.route = route
        #: Each method's params, as the upstreams' `TaskForwarding` reads them.
        self.params = dict(params)

    def clone(self) -> TaskRoutes:
        return TaskRoutes(self.route, self.params)

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        with producing_tasks():
            yield

    def methods(self) -> list[MethodBinding]:
        return [MethodBinding(m, self.params[m], self._handler(m)) for m in TASK_METHODS]

    def _handler(self, method: str) -> Any:
        async def handle(ctx: Any, params: BaseModel) -> Any:
            fields = params.model_dump(by_alias=True, exclude_none=True)
            task_id = str(fields["taskId"])
            found = self.route(task_id)
            if found is None or not found[2]:
                raise _unknown(task_id)
            proxy, prefix, own = found
            forwarding = proxy._extensions.get(TASKS_EXTENSION)
            binding = None
            if forwarding is not None:
                binding = next((b for b in forwarding.methods() if b.method == method), None)
            if binding is None:  # pragma: no cover - every proxy serves the extension
                raise _unknown(task_id)
            inner = binding.params_type.model_validate({**fields, "taskId": own})
            sent = as_sent_upstream(ctx, task_id, own)
            with bind_request_context(sent):
                answer = await binding.handler(sent, inner)
            if isinstance(answer, BaseModel):
                answer = answer.model_dump(by_alias=True, mode="json", exclude_none=True)
            if isinstance(answer, dict) and answer.get("taskId") == own:
                return {**answer, "taskId": front_id(prefix, own)}
            return answer

        return handle
