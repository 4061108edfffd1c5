"""`idempotent_tasks(extension, store, server_name=..., **options)`: task creation on an
`MCPServer` under the guard (rule 23), through the SDK's extension hooks.

On `MCPServer` a tasks extension (SEP-2663, identifier `io.modelcontextprotocol/tasks`) answers a
task-augmented `tools/call` in its `intercept_tool_call`, above the tool's function: `@idempotent`
and `install()`, which wrap that function, never see the call. This wraps the extension itself:
same identifier, settings, tools, resources and methods; its interceptor is the one that runs,
under the guard, for a request on which the client declared the tasks extension (per request,
SEP-2133). The task the extension answers with is the key's answer (`_guard/tasks.py`): a
re-send gets that same task, marked replayed; other arguments, -32011.

Where the extension runs the call in the foreground instead (it hands the call on), the claim is
given back before the call goes on (nothing of the task's was done): the tool's own guard, if it
has one, guards it as any call. A request whose client did not declare the tasks extension is
the extension's own, untouched (no claim, no cost). The task's body is the extension's to run: it
fences it with `run_task_body` (`_guard/task_body.py`), keyed by the task id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding, ResourceBinding, ToolBinding
from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    CallToolRequestParams,
)
from typing_extensions import Unpack

from ..._guard import tasks
from ..._guard.guard import Guard, NothingDone, ToolResult
from ..._guard.policy import PolicyOptions, make_policy
from ..._stores.store import KeyStore
from ..lowlevel import TaskBodies, guard_sdk_call


class _Foreground(Exception):
    """The wrapped extension handed the call on: it is not a task."""

    def __init__(self, ctx: ServerRequestContext[Any, Any]) -> None:
        super().__init__("foreground")
        self.ctx = ctx


def declared(params: CallToolRequestParams, identifier: str) -> bool:
    """Whether the client declared extension `identifier` on this request (SEP-2133: its
    capabilities repeated in the request's `_meta`)."""
    meta = params.meta
    capabilities = meta.get(CLIENT_CAPABILITIES_META_KEY) if meta else None
    found = capabilities.get("extensions") if isinstance(capabilities, Mapping) else None
    return isinstance(found, Mapping) and isinstance(found.get(identifier), Mapping)


class IdempotentTasks(Extension, TaskBodies):
    """A tasks extension whose task creation runs under the guard (`idempotent_tasks`); the
    extension runs each task's body through `run_task_body` (`TaskBodies`)."""

    def __init__(self, inner: Extension, guard: Guard, server_name: str) -> None:
        self.identifier = inner.identifier
        self.inner = inner
        self.guard = guard
        self._server_name = server_name

    def settings(self) -> dict[str, Any]:
        return self.inner.settings()

    def tools(self) -> Sequence[ToolBinding]:
        return self.inner.tools()

    def resources(self) -> Sequence[ResourceBinding]:
        return self.inner.resources()

    def methods(self) -> Sequence[MethodBinding]:
        return self.inner.methods()

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        inner = self.inner
        if not declared(params, self.identifier):
            return await inner.intercept_tool_call(params, ctx, call_next)

        async def forward(next_ctx: ServerRequestContext[Any, Any]) -> HandlerResult:
            raise _Foreground(next_ctx)

        async def execute() -> ToolResult:
            try:
                result = await inner.intercept_tool_call(params, ctx, forward)
            except _Foreground as went_on:
                raise NothingDone(went_on) from None
            task = tasks.recorded(result)
            if task is None:
                raise TypeError(
                    f"the {self.identifier} extension answered without a task or handing the"
                    f" call on ({type(result).__name__})"
                )
            return task

        async def passthrough() -> HandlerResult:
            return await inner.intercept_tool_call(params, ctx, call_next)

        try:
            return await guard_sdk_call(  # type: ignore[no-any-return]
                self.guard, self._server_name, ctx, params, execute, passthrough
            )
        except _Foreground as went_on:
            return await call_next(went_on.ctx)  # claim given back: the tool's own guard's call


def idempotent_tasks(
    extension: Extension,
    store: KeyStore,
    *,
    server_name: str,
    **options: Unpack[PolicyOptions],
) -> IdempotentTasks:
    """`extension` (a tasks extension for `MCPServer(extensions=[...])`) with its task creation
    guarded: one task per key, every re-send gets it. `server_name`: the `MCPServer`'s name
    (records are scoped by it, as the tools' own guards scope theirs)."""
    return IdempotentTasks(extension, Guard(store, make_policy(options)), server_name)
