"""`@idempotent(store, **options)`: guard one `MCPServer` tool.

Placed under `@server.tool(...)`. The wrapper keeps the tool's input and output schema exactly as
written — the key travels in the request `_meta`, never in the arguments — and, when the function
declares no `Context` parameter, adds a hidden one the SDK fills and leaves out of the schema.

Only the mcp SDK's `MCPServer` fills that parameter, so anywhere else the guard would be skipped
in silence. The decorator therefore refuses, with a `TypeError` naming the integration that works:
- at decoration time, a function some framework already registered or marked as a tool (the
  decorator placed above `@server.tool()`, or above FastMCP's `@mcp.tool`);
- at registration time, FastMCP registering a guarded function (`@mcp.tool`, `mcp.add_tool`),
  whenever FastMCP was loaded when `idempotent(...)` ran;
- at call time, as the backstop, a guarded function run by FastMCP (its request context is
  current) without the SDK's `Context`: it raises instead of running unguarded.

"Without the SDK's context" means exactly that: no `Context` at all *while FastMCP serves the
request*. `MCPServer` always passes its `Context` — for a tools/call of this tool (guarded), for
its own `call_tool` or a tool calling another inside its request (run as written: not this
tool's tools/call, or already covered by the outer call's record). A plain Python call outside
any server (a unit test, a helper) passes none either; it is not a tool call and has no key, so
it too runs the function as written.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Collection
from typing import Any, ParamSpec, Protocol, TypeVar, overload

import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.utilities.context_injection import find_context_parameter
from mcp.shared._callable_inspection import is_async_callable
from typing_extensions import Unpack

from ..._guard.guard import Guard, ToolCall, ToolResult, as_is
from ..._guard.policy import PolicyOptions, make_policy
from ..._stores.store import KeyStore
from .sdk import (
    FASTMCP,
    HIDDEN_CONTEXT,
    converter,
    ensure_registration_hook,
    fastmcp_refusal,
    own_call,
    registered_by,
    sdk_error_result,
    served_by_fastmcp,
)
from .stamp import STAMP_ATTR, ToolStamp, stamp_of

P = ParamSpec("P")
R = TypeVar("R")


class ToolDecorator(Protocol):
    """What `idempotent(...)` returns. A sync tool becomes a coroutine function: its body runs
    in a worker thread, as the SDK would run it."""

    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]: ...
    @overload
    def __call__(self, fn: Callable[P, R]) -> Callable[P, Awaitable[R]]: ...


def _with_hidden_context(fn: Callable[..., Any], name: str) -> inspect.Signature:
    try:
        signature = inspect.signature(fn, eval_str=True)
    except (NameError, TypeError):  # unresolvable annotations: let the SDK report them itself
        signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    hidden = inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Context
    )
    at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), None)
    params.insert(len(params) if at is None else at, hidden)
    return signature.replace(parameters=params)


def _free_name(fn: Callable[..., Any]) -> str:
    taken = set(inspect.signature(fn).parameters)
    name, n = HIDDEN_CONTEXT, 1
    while name in taken:
        n += 1
        name = f"{HIDDEN_CONTEXT}{n}"
    return name


def wrap_tool_function(
    fn: Callable[..., Any],
    guard: Guard,
    context_param: str | None,
    underived: Collection[str] = (),
) -> Callable[..., Awaitable[Any]]:
    """The guarded stand-in for `fn`; `context_param` is `fn`'s own Context parameter, if any;
    `underived` names tools never merged under a derived key (see `install`)."""
    hidden = context_param is None
    ctx_name = _free_name(fn) if context_param is None else context_param
    fn_is_async = is_async_callable(fn)
    stamp = ToolStamp(
        guard=guard, context_param=ctx_name, hidden=hidden, underived=frozenset(underived)
    )

    async def call_original(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if fn_is_async:
            return await fn(*args, **kwargs)
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

    @functools.wraps(fn)
    async def guarded(*args: Any, **kwargs: Any) -> Any:
        ctx = kwargs.get(ctx_name)
        if hidden:
            kwargs.pop(ctx_name, None)
        if ctx is None and served_by_fastmcp():
            # The backstop for a FastMCP registration the hook could not see: never unguarded.
            raise fastmcp_refusal(fn)
        found = own_call(ctx, guarded)
        if found is None:
            # Not a tools/call of this tool (a direct call, or one tool calling another inside
            # its own request, which the outer record already covers): run as written.
            return await call_original(args, kwargs)
        tool = found.tool
        request = found.request
        calls = stamp.calls_of(tool, sdk_error_result)
        call = ToolCall(
            server=found.server_name,
            tool=tool.name,
            arguments=found.arguments,
            meta=request.meta,
            request=request,
            derivable=calls.derivable,
        )
        convert = converter(tool)

        async def execute() -> ToolResult:
            if fn_is_async:  # one awaited frame fewer than through `call_original`
                return convert(await fn(*args, **kwargs))
            return convert(await call_original(args, kwargs))

        # Passed through, the function's own return value goes back to the SDK, which converts
        # it exactly as for an unguarded tool; the guard's answers are already converted.
        return await guard.call(
            call,
            execute,
            error_result=calls.error_result,
            takeover=calls.takeover,
            passthrough=functools.partial(call_original, args, kwargs),
            render=as_is,
            convert=convert,
        )

    if hidden:
        guarded.__signature__ = _with_hidden_context(fn, ctx_name)  # type: ignore[attr-defined]
        guarded.__annotations__ = {**getattr(fn, "__annotations__", {}), ctx_name: Context}
    setattr(guarded, STAMP_ATTR, stamp)
    return guarded


def check_wrappable(fn: object) -> None:
    if not callable(fn):
        raise TypeError(f"@idempotent wraps a tool function, not {type(fn).__name__}")
    if stamp_of(fn) is not None:
        raise TypeError(f"{getattr(fn, '__name__', fn)!r} is already guarded by @idempotent")
    framework = registered_by(fn)
    if framework == FASTMCP:
        raise fastmcp_refusal(fn)
    if framework is not None:
        raise TypeError(
            f"{getattr(fn, '__name__', fn)!r} was registered as a tool before @idempotent wrapped"
            " it, so the server would call it unguarded: put @idempotent(...) *under*"
            " @server.tool(...)"
        )


def idempotent(store: KeyStore, **options: Unpack[PolicyOptions]) -> ToolDecorator:
    """Guard a tool of `MCPServer`: at most one execution per (scope, tool, key), replays after.

    ```python
    @server.tool()
    @idempotent(store)
    async def charge(order: str, cents: int) -> str: ...
    ```

    Options and defaults: see `Policy`. Only for the mcp SDK's `MCPServer`: on a FastMCP server
    use `idempotency.fastmcp.IdempotencyMiddleware` (this decorator refuses FastMCP tools).
    """
    guard = Guard(store, make_policy(options))
    ensure_registration_hook()

    def decorate(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
        check_wrappable(fn)
        return wrap_tool_function(fn, guard, find_context_parameter(fn))

    return decorate
