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
the extension's own, untouched (no claim, no cost).

That give-back costs two store round trips more than a plain call (claim and release, then the
tool's guard's claim and completion). `task_tools` spares them: the tools the extension may answer
with a task (SEP-2663's `taskSupport` "optional" or "required"; every other tool's is
"forbidden"). A declaring call of any other tool is not claimed here and costs what a plain call
costs; the extension still sees it (the SDK gives no other way to run it), and should it answer
with a task anyway, that task's creation ran unguarded: the answer is refused loudly (a
`RuntimeError`, the client gets an error, never the task) and the misdeclaration logged. Without
`task_tools` every declaring call is claimed: safe whatever the extension does.

The task's body is the extension's to run: it fences it with `run_task_body`
(`_guard/task_body.py`), keyed by the task id.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
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

logger = logging.getLogger(__name__)


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

    def __init__(
        self,
        inner: Extension,
        guard: Guard,
        server_name: str,
        task_tools: frozenset[str] | None = None,
    ) -> None:
        self.identifier = inner.identifier
        self.inner = inner
        self.guard = guard
        self._server_name = server_name
        self._task_tools = task_tools

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
        if self._task_tools is not None and params.name not in self._task_tools:
            return await self._foreground(params, ctx, call_next)

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

    async def _foreground(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        """A declaring call of a tool outside `task_tools`: unclaimed, as a plain call; a task
        the extension answers it with anyway was created unguarded and is refused."""
        result = await self.inner.intercept_tool_call(params, ctx, call_next)
        if tasks.recorded(result) is not None:
            logger.error(
                "the %s extension answered a call of %r with a task, but %r is not in"
                " idempotent_tasks(task_tools=...): its creation was not guarded (rule 23)",
                self.identifier,
                params.name,
                params.name,
            )
            raise RuntimeError(
                f"the {self.identifier} extension answered a call of {params.name!r} with a task,"
                f" but {params.name!r} is not in idempotent_tasks(task_tools=...): the task was"
                " created without the guard (rule 23); add the tool to task_tools"
            )
        return result


def idempotent_tasks(
    extension: Extension,
    store: KeyStore,
    *,
    server_name: str,
    task_tools: Collection[str] | None = None,
    **options: Unpack[PolicyOptions],
) -> IdempotentTasks:
    """`extension` (a tasks extension for `MCPServer(extensions=[...])`) with its task creation
    guarded: one task per key, every re-send gets it. `server_name`: the `MCPServer`'s name
    (records are scoped by it, as the tools' own guards scope theirs). `task_tools`: the names of
    the tools the extension may answer with a task (None: any); a declaring call of another tool
    is left to the tool's own guard, at a plain call's cost (module docstring)."""
    return IdempotentTasks(
        extension, Guard(store, make_policy(options)), server_name, _task_tools(task_tools)
    )


def _task_tools(names: Collection[str] | None) -> frozenset[str] | None:
    """`task_tools` checked: a collection of tool names, not one name (whose letters would
    otherwise pass for names)."""
    if names is None:
        return None
    if isinstance(names, str | bytes) or not isinstance(names, Collection):
        raise TypeError(f"task_tools must be a collection of tool names, not {names!r}")
    bad = [name for name in names if not isinstance(name, str) or not name]
    if bad:
        raise TypeError(f"task_tools must name tools (non-empty strings), got {bad!r}")
    return frozenset(names)
