"""Every place mcp-once touches `MCPServer` internals, in one module.

The decorator sits under `@server.tool()`, so it runs before the tool is registered and never sees
the server. Three things still need the SDK's registration machinery:

- the listed definition must carry our `_meta` (and `idempotentHint` where it holds) without
  the author writing them: `Tool.from_function` is wrapped once (process-wide) to merge in what
  holds for every caller, for functions that carry our stamp and only for those; and
  `MCPServer.add_tool` is wrapped once so that a server that registers a stamped tool gets the
  listing middleware (`_listing`) that tells each caller what holds for it;
- a decorator placed *above* `@server.tool()` would wrap a function the server never calls, which
  would silently leave the tool unguarded: the same hook remembers registered functions so that
  `idempotent` can refuse them;
- at call time the wrapper finds its registered `Tool` (`MCPServer._tool_manager`) to convert the
  return value exactly as the SDK would (honouring `structured_output`), and to know the tool name.

Pinned to mcp 2.x (`pyproject.toml`); the tests exercise each seam through real sessions.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import (
    ResourceError,
    ToolError,
    UnexpectedResourceError,
    UnexpectedToolError,
)
from mcp.server.mcpserver.tools import Tool, ToolManager
from mcp_types import CallToolResult, TextContent

from ._advertise import advertise_annotations, advertise_meta, declares_idempotent
from ._telemetry import crash_report, logger

if TYPE_CHECKING:
    from ._guard import Guard

#: Where a guarded wrapper keeps its `ToolStamp`.
STAMP_ATTR = "__mcp_once__"
#: Name of the Context parameter added to a tool that declares none (no leading underscore:
#: the SDK refuses those; excluded from the input schema because it is typed `Context`).
HIDDEN_CONTEXT = "mcp_once_context"


@dataclass(slots=True)
class ToolStamp:
    """What a guarded wrapper carries for registration and calls."""

    guard: Guard
    #: The parameter the SDK passes the Context in (the author's, or `HIDDEN_CONTEXT`).
    context_param: str
    #: True when `context_param` was added by us and must not reach the author's function.
    hidden: bool
    #: Per registered tool name: did the author declare the tool idempotent by itself?
    declared: dict[str, bool] = field(default_factory=dict)


def stamp_of(fn: object) -> ToolStamp | None:
    stamp = getattr(fn, STAMP_ATTR, None)
    return stamp if isinstance(stamp, ToolStamp) else None


_registered: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()
_hook_lock = threading.Lock()
_hook_installed = False


def was_registered(fn: object) -> bool:
    """Whether `fn` itself was already registered as a tool (the decorator would be too late)."""
    try:
        return fn in _registered
    except TypeError:
        return False


def _remember(fn: Callable[..., Any]) -> None:
    # Not weak-referenceable: misuse detection is best effort.
    with contextlib.suppress(TypeError):
        _registered.add(fn)


def ensure_registration_hook() -> None:
    """Wrap `Tool.from_function` once, so stamped functions are advertised as guarded."""
    global _hook_installed
    with _hook_lock:
        if _hook_installed:
            return
        original: Callable[..., Tool] = Tool.from_function.__func__  # type: ignore[attr-defined]
        signature = inspect.signature(Tool.from_function)

        def from_function(
            cls: type[Tool], fn: Callable[..., Any], *args: Any, **kwargs: Any
        ) -> Tool:
            stamp = stamp_of(fn)
            if stamp is None:
                tool = original(cls, fn, *args, **kwargs)
            else:
                bound = signature.bind(fn, *args, **kwargs)
                annotations = bound.arguments.get("annotations")
                name = bound.arguments.get("name") or getattr(fn, "__name__", "")
                stamp.declared[str(name)] = declares_idempotent(annotations)
                policy = stamp.guard.policy
                bound.arguments["annotations"] = advertise_annotations(annotations, policy, False)
                bound.arguments["meta"] = advertise_meta(bound.arguments.get("meta"), policy, False)
                tool = original(cls, *bound.args, **bound.kwargs)
            _remember(fn)
            return tool

        original_add: Callable[..., None] = MCPServer.add_tool

        def add_tool(
            self: MCPServer[Any], fn: Callable[..., Any], *args: Any, **kwargs: Any
        ) -> None:
            original_add(self, fn, *args, **kwargs)
            if stamp_of(fn) is not None:
                ensure_listing(self)

        Tool.from_function = classmethod(from_function)  # type: ignore[method-assign,assignment]
        MCPServer.add_tool = add_tool  # type: ignore[method-assign]
        _hook_installed = True


def ensure_listing(server: MCPServer[Any]) -> None:
    """Add the per-caller listing middleware to `server`, once."""
    from ._listing import ListingMiddleware  # the middleware itself needs this module

    if not any(isinstance(m, ListingMiddleware) for m in server.middleware):
        server.middleware.append(ListingMiddleware(server))


def tool_manager(server: MCPServer[Any]) -> ToolManager:
    manager = getattr(server, "_tool_manager", None)
    if not isinstance(manager, ToolManager):
        raise TypeError("this MCPServer has no tool manager mcp-once knows how to guard")
    return manager


def request_of(ctx: object) -> ServerRequestContext[Any, Any] | None:
    """The request context behind a tool's `Context`, or None outside a request."""
    if not isinstance(ctx, Context):
        return None
    try:
        return ctx.request_context
    except ValueError:
        return None


def own_tool(ctx: object, wrapper: Callable[..., Any]) -> Tool | None:
    """The registered tool this request called, if it is the one `wrapper` guards.

    None for anything else: a direct `MCPServer.call_tool`, or a tool invoked from inside another
    tool's request (which shares the outer request's context and is covered by its record).
    """
    request = request_of(ctx)
    if request is None or request.method != "tools/call" or not isinstance(ctx, Context):
        return None
    params = request.params
    name = params.get("name") if isinstance(params, Mapping) else None
    if not isinstance(name, str):
        return None
    try:
        tool = tool_manager(ctx.mcp_server).get_tool(name)
    except (TypeError, ValueError):
        return None
    if tool is None or tool.fn is not wrapper:
        return None
    return tool


def arguments_of(ctx: Context[Any, Any]) -> Mapping[str, Any] | None:
    """The tool arguments exactly as the client sent them (before pre-parsing and validation)."""
    params = ctx.request_context.params
    arguments = params.get("arguments") if isinstance(params, Mapping) else None
    return arguments if isinstance(arguments, Mapping) else None


def sdk_error_result(tool: str, exc: Exception) -> CallToolResult:
    """The `isError` result `MCPServer` makes of an exception from a tool, text and logging alike,
    so the first answer and every replay of it read the same as an unguarded tool's."""
    # Logged by type and traceback only: the message may quote the caller's arguments.
    if isinstance(exc, ToolError | ResourceError) and not isinstance(
        exc, UnexpectedToolError | UnexpectedResourceError
    ):
        text = f"Error executing tool {tool}: {exc}"
        logger.info("Tool %r failed with %s", tool, type(exc).__name__)
    else:
        expected = isinstance(exc, UnexpectedToolError | UnexpectedResourceError)
        text = f"Error executing tool {tool}: {exc}" if expected else f"Error executing tool {tool}"
        logger.error("Tool %r raised an unexpected %s", tool, crash_report(exc))
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def adopt(tool: Tool, wrap: Callable[[Callable[..., Any], str | None], Callable[..., Any]]) -> None:
    """Guard an already registered tool in place (server-wide `install`): its schema, name and
    position are untouched; its function, Context parameter and advertisement change."""
    declared = declares_idempotent(tool.annotations)
    wrapper = wrap(tool.fn, tool.context_kwarg)
    stamp = stamp_of(wrapper)
    assert stamp is not None
    stamp.declared[tool.name] = declared
    tool.fn = wrapper
    tool.is_async = True
    tool.context_kwarg = stamp.context_param
    policy = stamp.guard.policy
    tool.annotations = advertise_annotations(tool.annotations, policy, False)
    tool.meta = advertise_meta(tool.meta, policy, False)
    _remember(wrapper)
