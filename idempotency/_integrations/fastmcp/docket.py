"""A guarded task's body under the task-body fence in `fastmcp-tasks`' Docket worker (rule 23).

`fastmcp-tasks` registers each task tool's callable with Docket, wrapped by its
`reentrant_task_fn` (the end-and-reenter input loop), and a Docket worker runs it outside every
middleware. Docket redelivers an execution whose worker died (`redelivery_timeout`) and retries
on its own where a retry policy says so; nothing there calls `run_task_body`, so a redelivery
would run the body again. `install` replaces the extension's `components.reentrant_task_fn` (the
name it looks up when it registers a component, at its lifespan) so that the callable it wraps
runs through `run_task_body`, keyed by the MCP task id of the running execution:

- Inside the loop, not around it: an input-required round reaches the fence as such (handed
  back unstored, its claim released: rule 8) before the loop parks it; around the loop, the
  park's `None` would be stored as the body's result.
- The fence's protocol errors (OUTCOME_UNKNOWN, IN_PROGRESS, STORE_UNAVAILABLE) are `MCPError`s,
  which the loop lets through: the Docket execution fails and `tasks/get` inlines the error. A
  replayed result is a `ToolResult`, which the extension inlines as it is.
- A server without an `IdempotencyMiddleware` (or one that does not guard the tool) runs the
  callable as before: `run_task_body` falls through.

`IdempotencyMiddleware` installs it when `fastmcp_tasks` is already imported (a module that adds
a `TasksExtension` has imported it; importing it here would switch on FastMCP's client task
support in every process). Fails loudly: a `fastmcp-tasks` without `reentrant_task_fn` is refused
at install, and a guarded server's Docket execution without an MCP task id raises rather than
run its body unfenced.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from fastmcp.tools.base import InputRequiredToolResult, Tool, ToolResult
from mcp_types import InputRequiredResult

Fn = Callable[..., Awaitable[Any]]
_PATCHED = "__mcp_once_task_body_fence__"


def install() -> None:
    """Fence the bodies `fastmcp_tasks` registers from now on (once per process; a no-op where
    `fastmcp_tasks` is not imported)."""
    if "fastmcp_tasks" not in sys.modules:
        return
    from fastmcp_tasks import components

    original: Callable[[Fn, str], Fn] | None = getattr(components, "reentrant_task_fn", None)
    if original is None:
        raise RuntimeError(
            "fastmcp_tasks.components has no reentrant_task_fn: this fastmcp-tasks is not one "
            "mcp-once can fence task bodies in (rule 23); use fastmcp-tasks 4.1.6"
        )
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def reentrant_task_fn(fn: Fn, tool_name: str) -> Fn:
        return original(_fenced(fn), tool_name)

    setattr(reentrant_task_fn, _PATCHED, True)
    components.reentrant_task_fn = reentrant_task_fn  # type: ignore[attr-defined]


def _fenced(fn: Fn) -> Fn:
    """`fn` (a task tool's callable, as Docket calls it) run under `run_task_body`."""

    @functools.wraps(fn)
    async def fenced(*args: Any, **kwargs: Any) -> Any:
        from fastmcp.server.dependencies import get_server

        from idempotency.fastmcp import IdempotencyMiddleware, run_task_body

        server = get_server()
        if not any(isinstance(m, IdempotencyMiddleware) for m in server.middleware):
            return await fn(*args, **kwargs)
        tool, task_id = await _running_task(server)

        async def body() -> ToolResult:
            raw = await fn(*args, **kwargs)
            if isinstance(raw, InputRequiredResult):
                return InputRequiredToolResult(raw)
            return tool.convert_result(raw)

        if kwargs or not args:
            names = set(tool.parameters.get("properties", {}))
            arguments = {name: value for name, value in kwargs.items() if name in names}
        else:
            arguments = args[0] if isinstance(args[0], dict) else None
        return await run_task_body(server, tool, task_id, arguments, body)

    fenced.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return fenced


async def _running_task(server: Any) -> tuple[Tool, str]:
    """The tool and MCP task id of the Docket execution running here, as the extension's own
    `tasks/get` resolves them (its task key)."""
    from docket.dependencies import current_execution
    from fastmcp_tasks.context import get_task_context
    from fastmcp_tasks.handlers import _resolve_tool

    task = get_task_context()
    if task is None:
        raise RuntimeError(
            "a task tool's body ran under a guarded server without an MCP task id (not a "
            "fastmcp-tasks Docket execution); refused rather than run unfenced (rule 23)"
        )
    return await _resolve_tool(server, current_execution.get().key), task.task_id
