"""Task-augmented calls through the proxy (rule 23, SEP-2663): the task a key created is the key's
answer.

A caller opts in per request: a `tools/call` whose capabilities (`_meta`
`io.modelcontextprotocol/clientCapabilities`) declare the tasks extension may be answered with a
task (`declares_tasks`). Such a call to a guarded tool is claimed like any call and goes
upstream once, under the record's upstream key, on the link's session that declares the
extension too (`UpstreamLink.call(..., task=True)`). An upstream that tasks it answers at once
with its flat `CreateTaskResult` (`orchestrator.TaskCreated`: `resultType` "task", `taskId`,
`status`, ...), and that is what the record stores, in the one form every entry point of
mcp-once stores a task in: `idempotency.task_record`, a result with no content whose `_meta`
holds the `CreateTaskResult` under `wire.TASK_META`: the proxied tool returns the upstream's
task and the guard (`idempotency.fastmcp.IdempotencyMiddleware`, which keeps whatever task a
task backend below it returns) stores it. A re-send of the key (same caller scope, same
arguments; a lost `CreateTaskResult`, another replica) is the guard's replay of that record: the
same `CreateTaskResult` with the guard's marker, "replayed", in its `_meta`; no second task is
created upstream. A re-send with other arguments is -32011,
as for any call. A re-send that does not declare the extension is refused as a re-use of the
key for another request (-32011, naming the task: its caller cannot read a task); a declaring
re-send of a key whose record holds a plain answer gets that answer (a server may run a
declaring call plain).

Tasks are a 2026-07-28 matter: a 2025-era caller's request cannot declare the extension (the
SDK keeps no per-request capabilities there, and FastMCP tasks only on the modern protocol), so
its calls are plain calls; so are a stdio upstream's (one handshake session, no tasks).

A call the proxy does not claim (pass-through, keyless) from a declaring caller goes upstream on
that session too (`UpstreamLink.pass_task`), so the upstream may task it; nothing is stored.

The task's requests (`tasks/get`, `tasks/update`, `tasks/cancel`) are the upstream's to
answer: `TaskForwarding` sends them on, on the link's task session, with the task id in the
`Mcp-Name` header (a poll is re-sent at will, an update or a cancel once and its answer passed
on as it came). What a server answers without looking at the task, the front answers itself:
-32021 to a request that did not declare the extension, -32020 to one whose `Mcp-Name` names
another task, and "not found" for a task that is not the caller's (`task_owners.py`).
SEP-2663 has no `tasks/result`: the outcome is inlined in `tasks/get`. The proxy's front sends
a `CreateTaskResult` as produced (`producing_tasks`: the production half of a claimed
`tools/call` result the SDK lacks, as `fastmcp_tasks` installs it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

import mcp_types.methods as methods
from fastmcp.server.dependencies import get_http_request
from fastmcp.server.extensions import (
    MethodBinding,
    ServerExtension,
    read_client_extension_settings,
)
from mcp import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
from mcp_types import HEADER_MISMATCH, MISSING_REQUIRED_CLIENT_CAPABILITY, Request, RequestParams
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field, SerializeAsAny

from idempotency import TaskCreated, wire
from orchestrator import TASK_RESULT_TYPE, TASKS_EXTENSION

if TYPE_CHECKING:
    from fastmcp.server.context import Context

    from .task_owners import TaskOwners
    from .upstream import UpstreamLink


def declares_tasks(ctx: Context | None) -> bool:
    """Whether the caller's request declared the tasks extension (SEP-2663's per-request
    opt-in: a server may task only such a call)."""
    return ctx is not None and ctx.client_extension_settings(TASKS_EXTENSION) is not None


def plain_resend(tool: str, task: BaseModel) -> MCPError:
    """The refusal of a call that did not declare the extension, whose key's record holds a
    task (`task`, the guard's answer: the `CreateTaskResult` with its marker; see the module
    doc)."""
    created = TaskCreated.model_validate(task.model_dump(by_alias=True, mode="json"))
    marker = created.marker or {}
    return MCPError(
        wire.KEY_REUSED,
        f"This idempotency key of tool {tool!r} created task {created.task_id!r} (a call"
        f" whose request declared the {TASKS_EXTENSION} extension); re-send it declaring the"
        " extension to get the task again, or poll the task (tasks/get). A plain call needs a"
        " new key. Do not retry as is.",
        {"key": marker.get("key"), "tool": tool, "taskId": created.task_id},
    )


#: Holds on the serializer wrap (`producing_tasks`), and the SDK's own serializer while held.
_holds: list[Any] = []


def _serialize(method: str, version: str, data: Mapping[str, Any], **kwargs: Any) -> Any:
    if (
        not kwargs
        and method == "tools/call"
        and version in MODERN_PROTOCOL_VERSIONS
        and data.get("resultType") == TASK_RESULT_TYPE
    ):
        return dict(data)  # built from a validated CreateTaskResult: sent as it is
    return _holds[0](method, version, data, **kwargs)


@contextmanager
def producing_tasks() -> Iterator[None]:
    """While entered (reference-counted: every front of the process), a modern `tools/call`
    result tagged `resultType: "task"` goes on the wire as produced: the SDK's runner would
    otherwise validate it as a `CallToolResult` and strip the task to nothing. Every other
    result is the SDK's serializer's, unchanged."""
    if not _holds:
        _holds.append(methods.serialize_server_result)
        methods.serialize_server_result = _serialize
    _holds.append(None)
    try:
        yield
    finally:
        _holds.pop()
        if len(_holds) == 1:
            methods.serialize_server_result = _holds.pop()


class TaskId(RequestParams):
    """A task request's params: the task's id (`tasks/get`, `tasks/cancel`)."""

    task_id: str = Field(alias="taskId")


class TaskUpdate(TaskId):
    """`tasks/update`'s params: the answers to the task's input requests."""

    input_responses: dict[str, Any] = Field(alias="inputResponses")


class TaskRequest(Request[TaskId, str]):
    """A task's request as the proxy sends it on: its method and params (the caller's own
    `_meta` left behind: it describes the front connection). The task id is mirrored into
    the `Mcp-Name` header (`name_param`), as the 2026-07-28 HTTP transport requires of the
    tasks methods."""

    name_param: ClassVar[str | None] = "taskId"
    method: str
    params: SerializeAsAny[TaskId]  # `TaskUpdate`'s answers too

    @classmethod
    def of(cls, method: str, params: TaskId) -> TaskRequest:
        return cls(method=method, params=params.model_copy(update={"meta": None}))


def _same_route(task_id: str) -> None:
    """Refuse (-32020) a task request whose `Mcp-Name` header names another task than its body
    (SEP-2243's routing header, which SEP-2663 extends to the tasks methods: a server that reads
    the body checks they agree, as `fastmcp_tasks` does; the SDK checks the core methods only).
    An intermediary may have routed it by the header: forwarding it would act on the other."""
    try:
        request = get_http_request()
    except RuntimeError:
        return  # not over HTTP: no routing headers
    header = request.headers.get(MCP_NAME_HEADER)
    if header is not None and decode_header_value(header) != task_id:
        raise MCPError(
            HEADER_MISMATCH,
            f"{MCP_NAME_HEADER} header does not match the request body's 'taskId' parameter",
        )


class TaskForwarding(ServerExtension):
    """The tasks extension on the proxy's front: its requests, sent on to the upstream.

    A request that did not declare the extension is answered -32021 (as a server answers it,
    SEP-2663), not forwarded. With `owners` (`task_owners.TaskOwners`), a request for a task
    the current caller does not own is answered as an unknown task (-32602), not forwarded."""

    identifier = TASKS_EXTENSION

    def __init__(self, link: UpstreamLink, owners: TaskOwners | None = None) -> None:
        self.link = link
        self.owners = owners

    def clone(self) -> TaskForwarding:
        return TaskForwarding(self.link, self.owners)  # the link is shared, never copied

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        with producing_tasks():
            yield

    async def _admitted(self, ctx: Any, task_id: str) -> None:
        """Refuse a request that did not declare the extension, or for another's task."""
        if read_client_extension_settings(ctx, TASKS_EXTENSION) is None:
            raise MCPError(
                MISSING_REQUIRED_CLIENT_CAPABILITY,
                f"This request targets the tasks extension ({TASKS_EXTENSION}); the client did"
                " not declare it for this request.",
                {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
            )
        _same_route(task_id)
        if self.owners is not None:
            await self.owners.check(task_id)

    def methods(self) -> list[MethodBinding]:
        link = self.link

        def answer(state: Any) -> dict[str, Any]:
            return dict(state.model_dump(by_alias=True, mode="json", exclude_none=True))

        async def get(ctx: Any, params: TaskId) -> dict[str, Any]:
            await self._admitted(ctx, params.task_id)
            return answer(await link.tasks().get_task(params.task_id))

        async def update(ctx: Any, params: TaskUpdate) -> dict[str, Any]:
            await self._admitted(ctx, params.task_id)
            return await link.task_request(TaskRequest.of("tasks/update", params))

        async def cancel(ctx: Any, params: TaskId) -> dict[str, Any]:
            await self._admitted(ctx, params.task_id)
            return await link.task_request(TaskRequest.of("tasks/cancel", params))

        return [
            MethodBinding("tasks/get", TaskId, get),
            MethodBinding("tasks/update", TaskUpdate, update),
            MethodBinding("tasks/cancel", TaskId, cancel),
        ]
