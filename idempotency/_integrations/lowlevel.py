"""`idempotent_call_tool(store, handler, **options)`: the guard for a low-level `Server`.

The low-level server has one `on_call_tool` handler for every tool and lists tools itself, so the
guarded handler also offers `advertise(on_list_tools)`, which merges the same policy into the
listed definitions. A handler exception (other than `MCPError` or a declared effect-free type) is
stored as an `isError` result whose text names the tool but not the exception, as `MCPServer`
does for unexpected errors. With `key_argument`, the handler still gets the arguments exactly as
sent, the key among them: it is the protocol-level handler (it sees `_meta` too), and it lists
its own schemas, to which `advertise` adds the key argument. A handler that answers a
task-augmented call with a task (SEP-2663: a `CreateTaskResult`, `resultType: "task"`, as a
model or a mapping) has that task kept as the key's answer (rule 23, `_guard/tasks.py`): a
re-send gets the same task, marked replayed. Its body is the handler's backend's to fence, with
the task id (`_guard/task_body.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    InputRequiredResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
)
from typing_extensions import Unpack

from .._guard import tasks
from .._guard.advertise import advertise_schema, advertise_tool, derivable
from .._guard.caller import caller_of
from .._guard.guard import Guard, ToolCall, ToolResult
from .._guard.policy import PolicyOptions, make_policy
from .._guard.task_body import run_task_body
from .._guard.telemetry import crash_report, logger
from .._stores.store import KeyStore

CallToolHandler = Callable[
    [ServerRequestContext[Any, Any], CallToolRequestParams],
    Awaitable[CallToolResult | InputRequiredResult],
]
ListToolsHandler = Callable[
    [ServerRequestContext[Any, Any], PaginatedRequestParams | None], Awaitable[ListToolsResult]
]


def generic_error_result(tool: str, exc: Exception) -> CallToolResult:
    logger.error("Tool %r raised an unexpected %s", tool, crash_report(exc))
    text = f"Error executing tool {tool}"
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def guard_sdk_call(
    guard: Guard,
    server: str,
    ctx: ServerRequestContext[Any, Any],
    params: CallToolRequestParams,
    execute: Callable[[], Awaitable[ToolResult]],
    passthrough: Callable[[], Awaitable[Any]],
    *,
    derivable: bool = True,
) -> Awaitable[Any]:
    """`Guard.call` of a `tools/call` as the SDK's handler layer sees it (the low-level handler,
    `MCPServer`'s tasks extension): a handler exception stored as the low-level handler stores
    one, a takeover only where the policy says so (the tool's annotations are not known here),
    and a task answer going out as the task (`_guard/tasks.py`)."""
    call = ToolCall(
        server=server,
        tool=params.name,
        arguments=params.arguments,
        meta=params.meta,
        request=ctx,
        derivable=derivable,
    )
    return guard.call(
        call,
        execute,
        error_result=functools.partial(generic_error_result, params.name),
        takeover=guard.policy.takeover_for(False),
        passthrough=passthrough,
        render=tasks.rendered,
    )


class TaskBodies:
    """`run_task_body` for an SDK entry point (the low-level handler, `MCPServer`'s tasks): its
    body returns the SDK's results, an exception it raises is stored as the low-level handler
    stores one, and a takeover happens only where the policy says so (the guard cannot see the
    tool's annotations)."""

    guard: Guard
    _server_name: str

    async def run_task_body(
        self,
        tool: str,
        task_id: str,
        arguments: Mapping[str, Any] | None,
        body: Callable[[], Awaitable[CallToolResult | InputRequiredResult]],
    ) -> CallToolResult | InputRequiredResult:
        """Run the body of task `task_id` (a task-augmented call of `tool` answered with a task)
        at most once, keyed by the task id (rule 23): for the task backend to call where it runs
        the task. A redelivery of a finished body gets its stored result, marked replayed; one of
        a body that died mid-run OUTCOME_UNKNOWN (-32012)."""
        return await run_task_body(
            self.guard,
            server=self._server_name,
            tool=tool,
            task_id=task_id,
            arguments=arguments,
            body=body,
            error_result=functools.partial(generic_error_result, tool),
            takeover=self.guard.policy.takeover_for(False),
        )


class GuardedCallTool(TaskBodies):
    """An `on_call_tool` handler that runs `handler` under the guard for the chosen tools."""

    def __init__(
        self,
        guard: Guard,
        handler: CallToolHandler,
        *,
        tools: Collection[str] | None,
        server_name: str,
        underived: Collection[str] = (),
    ) -> None:
        self.guard = guard
        self._handler = handler
        self._tools = None if tools is None else frozenset(tools)
        self._server_name = server_name
        self._underived = frozenset(underived)

    @property
    def server_name(self) -> str:
        """The server's name its records are scoped by and their histories name."""
        return self._server_name

    def guards(self, tool: str) -> bool:
        return self._tools is None or tool in self._tools

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], params: CallToolRequestParams
    ) -> CallToolResult | InputRequiredResult:
        if not self.guards(params.name):
            return await self._handler(ctx, params)

        async def execute() -> ToolResult:
            result: object = await self._handler(ctx, params)
            task = tasks.recorded(result)  # a task-augmented call's task is its answer
            if task is not None:
                return task
            if isinstance(result, Mapping):
                result = CallToolResult.model_validate(result)
            if not isinstance(result, CallToolResult | InputRequiredResult):
                raise TypeError(f"on_call_tool returned {type(result).__name__}")
            return result

        passthrough = functools.partial(self._handler, ctx, params)
        derivable = self.derivable(params.name)
        return await guard_sdk_call(  # type: ignore[no-any-return]  # a task goes out as the task
            self.guard, self._server_name, ctx, params, execute, passthrough, derivable=derivable
        )

    def derivable(self, tool: str) -> bool:
        """Whether a keyless call of `tool` may be merged under a derived key. The handler's
        annotations are not known to the guard: name read-only tools in `underived`."""
        return derivable(self.guard.policy, None, tool in self._underived)

    def _advertised(self, tool: Tool, caller_known: bool) -> Tool:
        listed = advertise_tool(tool, self.guard.policy, caller_known)
        schema = advertise_schema(listed.input_schema, self.guard.policy)
        if schema is listed.input_schema:
            return listed
        return listed.model_copy(update={"input_schema": schema})

    def advertise(self, handler: ListToolsHandler) -> ListToolsHandler:
        """Wrap `on_list_tools` so guarded tools are listed with the guard's annotations/_meta,
        as they hold for the caller who lists (see `mcpserver/listing.py`)."""

        async def list_tools(
            ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams | None
        ) -> ListToolsResult:
            listed = await handler(ctx, params)
            known = caller_of(ctx) is not None
            tools = [
                self._advertised(t, known and self.derivable(t.name)) if self.guards(t.name) else t
                for t in listed.tools
            ]
            return listed.model_copy(update={"tools": tools})

        return list_tools


def idempotent_call_tool(
    store: KeyStore,
    handler: CallToolHandler,
    *,
    tools: Collection[str] | None = None,
    server_name: str = "",
    underived: Collection[str] = (),
    **options: Unpack[PolicyOptions],
) -> GuardedCallTool:
    """Guard a low-level `on_call_tool` handler (all tools, or only those named in `tools`).

    `underived` names tools whose keyless calls are never merged under a derived key: those
    whose every call is meant to be new, and the read-only ones (the guard cannot see the
    handler's annotations).

    `server_name` joins the default scope, as the server name does for `MCPServer`. The takeover
    default (auto) can only use `naturally_idempotent` here: the handler's annotations are not
    known to the guard.
    """
    guard = Guard(store, make_policy(options))
    return GuardedCallTool(
        guard, handler, tools=tools, server_name=server_name, underived=underived
    )
