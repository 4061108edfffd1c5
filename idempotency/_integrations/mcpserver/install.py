"""`install(server, store, **options)`: one policy for every tool of an `MCPServer`.

Tools already registered are guarded in place; tools registered later (through `server.tool()`
or `server.add_tool`) are guarded as they arrive. A tool that already carries its own
`@idempotent` keeps its own policy.

Why not an `Extension.intercept_tool_call`? The interceptor sees the SDK's finished result:
exceptions have already been turned into `isError` results (so `effect_free` could not be
honoured), and it cannot change the listed tool definitions. Wrapping each tool's function gives
the same behaviour as the decorator, from the same code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.utilities.context_injection import find_context_parameter
from typing_extensions import Unpack

from ..._guard.guard import Guard
from ..._guard.policy import PolicyOptions, make_policy
from ..._stores.store import KeyStore
from .decorator import wrap_tool_function
from .sdk import (
    adopt,
    check_mcpserver,
    ensure_listing,
    ensure_registration_hook,
    tool_manager,
)
from .stamp import stamp_of

_INSTALLED_ATTR = "__mcp_once_installed__"


def install(
    server: MCPServer[Any],
    store: KeyStore,
    *,
    exclude: Iterable[str] = (),
    underived: Iterable[str] = (),
    **options: Unpack[PolicyOptions],
) -> None:
    """Guard every tool of `server` (now and later) except those named in `exclude`.

    `underived` names tools whose keyless calls are never merged under a derived key (every
    call meant to be new); read-only tools never are. A client key still replays for both.
    """
    check_mcpserver(server)
    if getattr(server, _INSTALLED_ATTR, False):
        raise RuntimeError("mcp-once is already installed on this server")
    guard = Guard(store, make_policy(options))
    skipped = frozenset(exclude)
    fresh = frozenset(underived)
    ensure_registration_hook()

    def wrap(fn: Callable[..., Any], context_param: str | None) -> Callable[..., Any]:
        return wrap_tool_function(fn, guard, context_param, fresh)

    for tool in tool_manager(server).list_tools():
        if tool.name not in skipped and stamp_of(tool.fn) is None:
            adopt(tool, wrap)

    register = server.add_tool

    def add_tool(
        fn: Callable[..., Any], name: str | None = None, *args: Any, **kwargs: Any
    ) -> None:
        tool_name = name if name is not None else getattr(fn, "__name__", None)
        if tool_name not in skipped and stamp_of(fn) is None:
            fn = wrap(fn, find_context_parameter(fn))
        register(fn, name, *args, **kwargs)

    setattr(server, "add_tool", add_tool)  # noqa: B010 - an instance attribute, on purpose
    setattr(server, _INSTALLED_ATTR, True)
    ensure_listing(server)
