"""The session protocol: the four things `RetryingSession` needs of a connection to one server.

The retry loop must send a keyed `tools/call` with a per-attempt timeout, list the server's tools
(the gate reads their annotations), tell a dead connection from a live one (a request on a closed
session was never sent), and hear `notifications/tools/list_changed`. Three clients offer these
under different names: the SDK's `ClientSession`, its `mcp.client.Client`, and FastMCP's
`fastmcp.Client`. Each gets a small adapter here, so the loop itself knows one shape; any other
object that implements `ToolSession` itself is used as it is.

FastMCP is an optional dependency: its adapter lives in `orchestrator.fastmcp` and is imported only
when a `fastmcp.Client` is actually passed (it is then already imported by the caller).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

from mcp import Client, ClientSession
from mcp.shared.dispatcher import ProgressFnT
from mcp_types import (
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    RequestParamsMeta,
    ToolListChangedNotification,
)

if TYPE_CHECKING:
    from fastmcp import Client as FastMCPClient


@runtime_checkable
class ToolSession(Protocol):
    """What `RetryingSession` drives: implement it to put the retry loop on any MCP client.

    Failures must be raised the way the SDK's `ClientSession` raises them (`mcp.MCPError` with the
    SDK's codes: -32001 for a read timeout, -32000 for a closed connection), because that is what
    the retry decision reads.
    """

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        read_timeout_seconds: float | None,
        progress_callback: ProgressFnT | None,
        *,
        meta: RequestParamsMeta | None,
    ) -> CallToolResult:
        """Send one `tools/call` (one attempt) with this `_meta`, waiting at most the timeout."""
        ...

    async def list_tools_page(self, cursor: str | None) -> ListToolsResult:
        """One page of `tools/list`, fresh from the server (never a cached listing)."""
        ...

    def closed(self) -> bool:
        """Whether the connection can no longer send: a request now would never be written."""
        ...

    def watch_list_changed(self, on_change: Callable[[], None]) -> bool:
        """Call `on_change` on every `notifications/tools/list_changed`; False if impossible."""
        ...


if TYPE_CHECKING:
    #: What `RetryingSession` accepts: the SDK's session or client, a connected `fastmcp.Client`,
    #: or any `ToolSession`.
    SessionLike: TypeAlias = ClientSession | Client | FastMCPClient[Any] | ToolSession
else:  # fastmcp is optional: it is recognised at run time without being imported here
    SessionLike: TypeAlias = ClientSession | Client | ToolSession


def dispatcher_closed(session: ClientSession) -> bool:
    """Whether the SDK session's dispatcher refuses to send (SDK internals, read defensively).

    Unknown means open: the attempt is then classified by how it fails.
    """
    dispatcher = getattr(session, "_dispatcher", None)
    return getattr(dispatcher, "_closed", False) is True


def chain_list_changed(session: ClientSession, on_change: Callable[[], None]) -> bool:
    """Chain `on_change` onto the SDK session's message handler for list-changed notifications.

    The SDK fixes a session's message handler at construction, before the wrapper exists, so this
    chains onto it (SDK internals, best effort: returns False when the hook is not available).
    Every notification still reaches the original handler.
    """
    original = getattr(session, "_message_handler", None)
    if original is None or not callable(original):
        return False
    if getattr(original, "_mcp_once_watch", None) == on_change:
        return True
    handler: Callable[[Any], Awaitable[None]] = original

    async def chained(message: Any) -> None:
        if isinstance(message, ToolListChangedNotification):
            on_change()
        await handler(message)

    chained._mcp_once_watch = on_change  # type: ignore[attr-defined]
    session._message_handler = chained
    return True


class OverClientSession:
    """The half of an adapter that only needs the SDK `ClientSession` underneath (if any yet)."""

    def inner(self) -> ClientSession | None:
        """The live `ClientSession`, or None when there is none (not entered, or exited)."""
        raise NotImplementedError

    def closed(self) -> bool:
        inner = self.inner()
        return inner is None or dispatcher_closed(inner)

    def watch_list_changed(self, on_change: Callable[[], None]) -> bool:
        inner = self.inner()
        return inner is not None and chain_list_changed(inner, on_change)


class _SDK(OverClientSession):
    """The SDK's `ClientSession` or `mcp.client.Client` as a `ToolSession` (their `call_tool`s
    take the same arguments; the client's also drives input rounds itself)."""

    def __init__(self, target: ClientSession | Client) -> None:
        self._target = target

    def inner(self) -> ClientSession | None:
        if isinstance(self._target, ClientSession):
            return self._target
        try:
            return self._target.session
        except RuntimeError:  # exited, or never entered
            return None

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        read_timeout_seconds: float | None,
        progress_callback: ProgressFnT | None,
        *,
        meta: RequestParamsMeta | None,
    ) -> CallToolResult:
        return await self._target.call_tool(
            name, arguments, read_timeout_seconds, progress_callback, meta=meta
        )

    async def list_tools_page(self, cursor: str | None) -> ListToolsResult:
        if isinstance(self._target, Client):
            return await self._target.list_tools(cursor=cursor, cache_mode="refresh")
        params = PaginatedRequestParams(cursor=cursor) if cursor is not None else None
        return await self._target.list_tools(params=params)


def _fastmcp_adapter(session: object) -> ToolSession | None:
    """The `fastmcp.Client` adapter, if `session` is one (fastmcp is never imported from here)."""
    if "fastmcp" not in sys.modules:
        return None  # nobody imported fastmcp, so this cannot be a fastmcp.Client
    try:
        from .fastmcp import as_fastmcp_session
    except ImportError:  # a fastmcp without its client half
        return None
    return as_fastmcp_session(session)


def tool_session(session: object) -> ToolSession:
    """`session` as a `ToolSession`, or TypeError for anything the wrapper cannot drive."""
    if isinstance(session, ClientSession | Client):
        return _SDK(session)
    if (adapted := _fastmcp_adapter(session)) is not None:
        return adapted
    if isinstance(session, ToolSession):
        return session
    raise TypeError(
        "session must be an mcp ClientSession or Client, a fastmcp.Client, or implement"
        f" orchestrator.ToolSession; got {type(session).__name__}"
    )
