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

`IdempotencyMiddleware` installs it: at once when `fastmcp_tasks` is already imported, else the
moment `fastmcp_tasks.components` is imported (an import hook, `_PatchOnImport`), so the order in
which an application imports the two never leaves a body unfenced; importing `fastmcp_tasks`
here would switch on FastMCP's client task support in every process. Fails loudly: a
`fastmcp-tasks` without `reentrant_task_fn` is refused when it is patched. A Docket execution
with no MCP task behind it (an application's own `docket.add` of the tool's function) was never
an MCP call and has no key or task id to fence by: it runs as it would without the guard.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import inspect
import sys
from collections.abc import Awaitable, Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from fastmcp.server.dependencies import _current_server
from fastmcp.tools.base import InputRequiredToolResult, Tool, ToolResult
from mcp import MCPError
from mcp_types import InputRequiredResult
from pydantic_core import to_jsonable_python

Fn = Callable[..., Awaitable[Any]]
#: `idempotency.fastmcp.run_task_body` (passed in: that module installs this one).
RunBody = Callable[
    [Any, Tool, str, Any, Callable[[], Awaitable[ToolResult]]], Awaitable[ToolResult]
]
_PATCHED = "__mcp_once_task_body_fence__"
_COMPONENTS = "fastmcp_tasks.components"


def install(run_body: RunBody, guarded: Callable[[Any], bool]) -> None:
    """Fence the bodies `fastmcp_tasks` registers from now on with `run_body`, on servers that
    are `guarded` (once per process): now if `fastmcp_tasks` is imported, else when it is."""
    if "fastmcp_tasks" in sys.modules:  # its components are imported with it, or by this
        _patch(importlib.import_module(_COMPONENTS), run_body, guarded)
    elif not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(lambda module: _patch(module, run_body, guarded)))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches `fastmcp_tasks.components` right after it is first executed (and before any
    lifespan can look `reentrant_task_fn` up), then leaves `sys.meta_path`. A loader it cannot
    hook (no `exec_module`) fails the import: the module would load unpatched, every task body
    unfenced (rule 23), and nothing would say so."""

    def __init__(self, patch: Callable[[ModuleType], None]) -> None:
        self.patch = patch

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name != _COMPONENTS:
            return None
        sys.meta_path.remove(self)
        # The spec the other finders give (a path entry, an editable install's finder, ...).
        spec = next(
            (
                found
                for finder in sys.meta_path
                if hasattr(finder, "find_spec")
                and (found := finder.find_spec(name, path, target)) is not None
            ),
            None,
        )
        if spec is None:
            return None  # not there: the import fails as it would without the hook
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            raise RuntimeError(
                f"{_COMPONENTS} is loaded by {type(loader).__name__}, which has no exec_module: "
                "mcp-once cannot fence the task bodies it registers (rule 23)"
            )
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            self.patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _patch(components: ModuleType, run_body: RunBody, guarded: Callable[[Any], bool]) -> None:
    """Replace `components.reentrant_task_fn` with one whose callable is fenced (once)."""
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
        return original(_fenced(fn, tool_name, run_body, guarded), tool_name)

    setattr(reentrant_task_fn, _PATCHED, True)
    setattr(components, "reentrant_task_fn", reentrant_task_fn)  # noqa: B010 (a module's name)


def _fenced(fn: Fn, tool_name: str, run_body: RunBody, guarded: Callable[[Any], bool]) -> Fn:
    """`fn` (a task tool's callable, as Docket calls it) run under `run_task_body` of the
    server that runs the worker (the root, whose middleware guarded the creation: one guard per
    call, the outermost; `get_server()` would name a mounted tool's child), its errors rendered
    as the extension renders them (`_error_result`) and stored so; its protocol errors raised."""

    @functools.wraps(fn)
    async def fenced(*args: Any, **kwargs: Any) -> Any:
        root = _current_server.get()
        server = root() if root is not None else None
        if server is None or not guarded(server):
            return await fn(*args, **kwargs)
        task = importlib.import_module("fastmcp_tasks.context").get_task_context()
        if task is None:
            return await fn(*args, **kwargs)  # not an MCP task: nothing of the guard's
        tool = await _running_tool(server, fn)
        task_id: str = task.task_id
        loop = importlib.import_module("fastmcp_tasks.input_loop")

        async def body() -> ToolResult:
            try:
                raw = await fn(*args, **kwargs)
            except MCPError:
                raise
            except Exception as exc:
                error: ToolResult = loop._error_result(tool_name, exc)
                return error
            if isinstance(raw, InputRequiredResult):
                return InputRequiredToolResult(raw)
            return tool.convert_result(raw)

        arguments: dict[str, Any] | None
        if kwargs or not args:
            names = set(tool.parameters.get("properties", {}))
            arguments = {name: value for name, value in kwargs.items() if name in names}
        else:
            arguments = args[0] if isinstance(args[0], dict) else None
        # Docket hands the coerced values (models, datetimes): the record keeps their JSON.
        arguments = to_jsonable_python(arguments)
        return await run_body(server, tool, task_id, arguments, body)

    fenced.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return fenced


async def _running_tool(server: Any, fn: Fn) -> Tool:
    """The tool of the Docket execution running here: the tool as the extension's own
    `tasks/get` resolves it (its task key), else (a mounted child's server in context, where the
    key's namespaced name is unknown) the tool of `server` whose callable `fn` is."""
    execution = importlib.import_module("docket.dependencies").current_execution
    handlers = importlib.import_module("fastmcp_tasks.handlers")
    try:
        tool: Tool = await handlers._resolve_tool(server, execution.get().key)
        return tool
    except MCPError:
        for tool in await server.list_tools(run_middleware=False):
            if getattr(tool, "fn", None) is fn or getattr(fn, "__self__", None) is tool:
                return tool
        raise
