"""Every place mcp-once touches `MCPServer` internals (and FastMCP's registration), in one module.

The decorator sits under `@server.tool()`, so it runs before the tool is registered and never sees
the server. Four things still need the registration machinery:

- the listed definition must carry our `_meta` (and `idempotentHint` where it holds) without
  the author writing them: `Tool.from_function` is wrapped once (process-wide) to merge in what
  holds for every caller, for functions that carry our stamp (`stamp.py`) and only for those;
  and `MCPServer.add_tool` is wrapped once so that a server that registers a stamped tool gets the
  listing middleware (`listing.py`) that tells each caller what holds for it;
- a decorator placed *above* `@server.tool()` would wrap a function the server never calls, which
  would silently leave the tool unguarded: the same hook remembers registered functions so that
  `idempotent` can refuse them;
- FastMCP registers functions through its own `FunctionTool.from_function` and never hands them
  the SDK's `Context`, so the guard could never run there: when FastMCP is loaded, its
  registration is wrapped too, to refuse guarded functions (and remember the ones it registers),
  and `served_by_fastmcp` lets a wrapper refuse to run unguarded under FastMCP at call time.
  FastMCP is never imported here: only looked up in `sys.modules`;
- at call time the wrapper finds its registered `Tool` (`MCPServer._tool_manager`) to convert the
  return value exactly as the SDK would (honouring `structured_output`), and to know the tool name.

Pinned to mcp 2.x (`pyproject.toml`); the tests exercise each seam through real sessions.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import inspect
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import (
    ResourceError,
    ToolError,
    UnexpectedResourceError,
    UnexpectedToolError,
)
from mcp.server.mcpserver.tools import Tool, ToolManager
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
from mcp_types import CallToolResult, InputRequiredResult, TextContent

from ..._guard.advertise import (
    advertise_annotations,
    advertise_meta,
    advertise_schema,
    declares_idempotent,
)
from ..._guard.telemetry import crash_report, logger
from .listing import ListingMiddleware
from .stamp import stamp_of

#: Name of the Context parameter added to a tool that declares none (no leading underscore:
#: the SDK refuses those; excluded from the input schema because it is typed `Context`).
HIDDEN_CONTEXT = "mcp_once_context"

MCPSERVER = "MCPServer"
FASTMCP = "FastMCP"
#: The attribute FastMCP's `@mcp.tool` / `@tool` decorators put on the function they return.
_FASTMCP_MARK = "__fastmcp__"

#: Functions registered as tools, and by which framework.
_registered: weakref.WeakKeyDictionary[Callable[..., Any], str] = weakref.WeakKeyDictionary()
_hook_lock = threading.Lock()
_hook_installed = False
_fastmcp_hooked = False


def registered_by(fn: object) -> str | None:
    """The framework that already registered (or marked) `fn` itself as a tool, or None: either
    way the decorator would come too late."""
    found: str | None = None
    if callable(fn):
        with contextlib.suppress(TypeError):  # not weak-referenceable: never remembered
            found = _registered.get(fn)
    if found is None and getattr(fn, _FASTMCP_MARK, None) is not None:
        return FASTMCP
    return found


def _remember(fn: Callable[..., Any], framework: str) -> None:
    # Not weak-referenceable: misuse detection is best effort.
    with contextlib.suppress(TypeError):
        _registered[fn] = framework


#: What a FastMCP server uses instead, said by every refusal below.
_USE_THE_MIDDLEWARE = (
    "`mcp.add_middleware(IdempotencyMiddleware(store, ...))` from `idempotency.fastmcp`"
    " (pip install 'mcp-once[fastmcp]')."
)


def fastmcp_refusal(fn: object) -> TypeError:
    """The error for `@idempotent` on a FastMCP tool, naming the integration that works."""
    return TypeError(
        f"{getattr(fn, '__name__', fn)!r} is a FastMCP tool: FastMCP runs it without the mcp"
        " SDK's Context, so @idempotent cannot guard it and every call would run unprotected."
        " Drop @idempotent and add the middleware instead: " + _USE_THE_MIDDLEWARE
    )


def check_mcpserver(server: object) -> None:
    """Refuse a server `install` cannot guard, naming the integration that can."""
    if isinstance(server, MCPServer):
        return
    if type(server).__module__.partition(".")[0] == "fastmcp":
        raise TypeError(
            "install() guards the mcp SDK's MCPServer; a FastMCP server uses " + _USE_THE_MIDDLEWARE
        )
    raise TypeError(f"install() guards the mcp SDK's MCPServer, not {type(server).__name__}")


def served_by_fastmcp() -> bool:
    """Whether the running code is inside a FastMCP request (FastMCP's current Context is set)."""
    dependencies = sys.modules.get("fastmcp.server.dependencies")
    if dependencies is None:
        return False
    try:
        dependencies.get_context()
    except RuntimeError:
        return False
    return True


def _refuse_fastmcp_registration() -> None:
    """Once FastMCP is loaded, make its registration refuse functions `@idempotent` wrapped."""
    global _fastmcp_hooked
    if _fastmcp_hooked or "fastmcp" not in sys.modules:
        return
    function_tool = importlib.import_module("fastmcp.tools.function_tool").FunctionTool
    original: Callable[..., Any] = function_tool.from_function.__func__

    def from_function(cls: type[Any], *args: Any, **kwargs: Any) -> Any:
        fn = kwargs["fn"] if "fn" in kwargs else (args[0] if args else None)
        if stamp_of(fn) is not None:
            raise fastmcp_refusal(fn)
        tool = original(cls, *args, **kwargs)
        if callable(fn):
            _remember(fn, FASTMCP)
        return tool

    from_function.__wrapped__ = original  # type: ignore[attr-defined]
    function_tool.from_function = classmethod(from_function)
    _fastmcp_hooked = True


def ensure_registration_hook() -> None:
    """Wrap `Tool.from_function` once, so stamped functions are advertised as guarded (and,
    once FastMCP is loaded, refused by FastMCP's registration)."""
    global _hook_installed
    with _hook_lock:
        _refuse_fastmcp_registration()
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
                stamp.declare(str(name), declares_idempotent(annotations))
                policy = stamp.guard.policy
                bound.arguments["annotations"] = advertise_annotations(annotations, policy, False)
                bound.arguments["meta"] = advertise_meta(bound.arguments.get("meta"), policy, False)
                tool = original(cls, *bound.args, **bound.kwargs)
                # The SDK's argument model ignores undeclared arguments, so the key argument
                # reaches the body only when its signature declares it; only the listing grows.
                tool.parameters = advertise_schema(tool.parameters, policy)
                convert_once(tool)
            _remember(fn, MCPSERVER)
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
    if not any(isinstance(m, ListingMiddleware) for m in server.middleware):
        server.middleware.append(ListingMiddleware(tool_manager(server)))


def tool_manager(server: MCPServer[Any]) -> ToolManager:
    manager = getattr(server, "_tool_manager", None)
    if not isinstance(manager, ToolManager):
        raise TypeError("this MCPServer has no tool manager mcp-once knows how to guard")
    return manager


def _parts_of(ctx: Context[Any, Any]) -> tuple[ServerRequestContext[Any, Any] | None, Any]:
    """The Context's request context and server, read once.

    `Context` keeps both as pydantic private attributes, and reading those through the public
    properties costs a Python-level `BaseModel.__getattr__` each: read from pydantic's private
    dict instead, with the public properties as the fallback should the SDK or pydantic ever keep
    them elsewhere.
    """
    private = getattr(ctx, "__pydantic_private__", None)
    if isinstance(private, dict) and "_request_context" in private and "_mcp_server" in private:
        return private["_request_context"], private["_mcp_server"]
    try:
        return ctx.request_context, ctx.mcp_server
    except ValueError:  # outside a request
        return None, None


@dataclass(slots=True)
class OwnCall:
    """A tools/call of the tool a wrapper guards, as the wrapper needs it (`own_call`)."""

    tool: Tool
    request: ServerRequestContext[Any, Any]
    server_name: str
    #: The tool arguments exactly as the client sent them (before pre-parsing and validation).
    arguments: Mapping[str, Any] | None


def own_call(ctx: object, wrapper: Callable[..., Any]) -> OwnCall | None:
    """The tools/call this request makes of the tool `wrapper` guards, or None.

    None for anything else: a direct `MCPServer.call_tool`, or a tool invoked from inside another
    tool's request (which shares the outer request's context and is covered by its record).
    """
    if not isinstance(ctx, Context):
        return None
    request, server = _parts_of(ctx)
    if request is None or server is None or request.method != "tools/call":
        return None
    params = request.params
    if type(params) is not dict and not isinstance(params, Mapping):  # dict: no ABC check
        return None
    name = params.get("name")
    if not isinstance(name, str):
        return None
    try:
        tool = tool_manager(server).get_tool(name)
    except (TypeError, ValueError):
        return None
    if tool is None or tool.fn is not wrapper:
        return None
    arguments = params.get("arguments")
    return OwnCall(
        tool,
        request,
        server.name,
        arguments if type(arguments) is dict or isinstance(arguments, Mapping) else None,
    )


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
    stamp.declare(tool.name, declared)
    tool.fn = wrapper
    tool.is_async = True
    tool.context_kwarg = stamp.context_param
    policy = stamp.guard.policy
    tool.annotations = advertise_annotations(tool.annotations, policy, False)
    tool.meta = advertise_meta(tool.meta, policy, False)
    tool.parameters = advertise_schema(tool.parameters, policy)
    convert_once(tool)
    _remember(wrapper, MCPSERVER)


#: The structured content the guard's conversion of the running request's tool result last
#: validated (`_ConvertOnce.convert_checked`): the SDK's own conversion of that same result, once
#: the guard hands it back, need not validate it again.
_validated: contextvars.ContextVar[object] = contextvars.ContextVar(
    "mcp_once_validated_output", default=None
)


class _ConvertOnce(FuncMetadata):
    """A guarded tool's `FuncMetadata`: the result the guard executed was converted (and its
    structured content validated against the output schema) inside the guard, before it was
    stored; `MCPServer` converts what the wrapper returns once more, which would validate the
    same content a second time. That second validation is skipped for exactly that content
    (the very object, once); everything else — a passed-through return value, a replay, a tool
    calling another — is converted as the SDK always does."""

    def convert_result(self, result: Any) -> CallToolResult | InputRequiredResult:
        if type(result) is CallToolResult:
            content = result.structured_content
            if content is not None and content is _validated.get():
                _validated.set(None)
                return result
        return super().convert_result(result)

    def convert_checked(self, result: Any) -> CallToolResult | InputRequiredResult:
        """`convert_result`, remembering the structured content it validated."""
        converted = super().convert_result(result)
        if type(converted) is CallToolResult and converted.structured_content is not None:
            _validated.set(converted.structured_content)
        return converted


def convert_once(tool: Tool) -> None:
    """Let `tool`'s metadata skip validating a result the guard already converted (same object,
    same fields: only its class changes, so a reference held elsewhere sees the same metadata).
    A metadata class of some other making is left as it is (and validates twice)."""
    metadata = tool.fn_metadata
    if type(metadata) is FuncMetadata:
        metadata.__class__ = _ConvertOnce


def converter(tool: Tool) -> Callable[[Any], CallToolResult | InputRequiredResult]:
    """How the guard converts `tool`'s return value (`_ConvertOnce.convert_checked` where the
    metadata is ours)."""
    metadata = tool.fn_metadata
    if isinstance(metadata, _ConvertOnce):
        return metadata.convert_checked
    return metadata.convert_result
