"""The session protocol: the four things `RetryingSession` needs of a connection to one server.

The retry loop must send a keyed `tools/call` with a per-attempt timeout, list the server's tools
(the gate reads their annotations), tell a dead connection from a live one (a request on a closed
session was never sent), and hear `notifications/tools/list_changed`. Three clients offer these
under different names: the SDK's `ClientSession`, its `mcp.client.Client`, and FastMCP's
`fastmcp.Client`. Each gets a small adapter, so the loop itself knows one shape; any other object
that implements `ToolSession` itself is used as it is.

The SDK's two are adapted here. A framework's client is adapted by its integration module, which
no module of the core names in an import (the integrations import the core, so an import here
would close a circle through every adapter): for an object of a class defined in the top-level
package `pkg` (or inheriting from one), `tool_session` looks `orchestrator.pkg` up at run time
(`importlib`), if there is such a module, and asks its `as_tool_session(obj)` hook (an
`AdaptSession`). So `orchestrator.fastmcp` adapts a
`fastmcp.Client` without being imported by anyone first, and a new adapter is one new module,
named after its framework's package, with nothing in the core changed. The lookup runs once per
class: a framework is imported by then (its class exists), and the integration is optional (it
is imported only when one of its framework's objects is actually passed).

Rejected: a registry the integrations fill when imported (a plain `fastmcp.Client` would then be
refused until something imported `orchestrator.fastmcp`), and a table of frameworks here (every
new adapter would change the core).
"""

from __future__ import annotations

import importlib
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar, runtime_checkable

from mcp import Client, ClientSession, MCPError
from mcp.shared.dispatcher import ProgressFnT
from mcp_types import (
    CONNECTION_CLOSED,
    CallToolResult,
    InputRequiredResult,
    InputResponses,
    ListToolsResult,
    PaginatedRequestParams,
    Request,
    RequestParamsMeta,
    ToolListChangedNotification,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, TypeAdapter

if TYPE_CHECKING:
    from fastmcp import Client as FastMCPClient

_T = TypeVar("_T", bound=BaseModel)


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


@runtime_checkable
class InputRoundSession(Protocol):
    """The optional capability of a `ToolSession` to carry an input-required round (SEP-2322).

    A second protocol rather than a fifth method of `ToolSession`, so that a user's own
    `ToolSession` written before rounds existed keeps working: it is asked for a round only when a
    caller asks `RetryingSession` for one, and then refused with a `TypeError` naming what is
    missing. The SDK's session and client and a `fastmcp.Client` have it.
    """

    async def call_tool_round(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        read_timeout_seconds: float | None,
        progress_callback: ProgressFnT | None,
        *,
        meta: RequestParamsMeta | None,
        input_responses: InputResponses | None,
        request_state: str | None,
    ) -> CallToolResult | InputRequiredResult:
        """Send one `tools/call` (one attempt) carrying the continuation of a round, if any, and
        return the server's `InputRequiredResult` as it came instead of answering it here."""
        ...


def round_session(session: ToolSession) -> InputRoundSession:
    """`session` as one that carries input-required rounds, or TypeError (before anything is
    sent) for a `ToolSession` that does not implement `InputRoundSession`."""
    if isinstance(session, InputRoundSession):
        return session
    raise TypeError(
        f"{type(session).__name__} cannot carry an input-required round: implement"
        " orchestrator.InputRoundSession (call_tool_round) to pass input_responses,"
        " request_state or allow_input_required"
    )


@runtime_checkable
class TaskSession(Protocol):
    """The optional capability of a `ToolSession` to send the tasks extension's requests: a
    task-augmented `tools/call` and the `tasks/*` polls, whose answers the SDK's typed
    `call_tool` cannot read (a second protocol, as `InputRoundSession`, so that a user's own
    `ToolSession` keeps working; the SDK's session and client and a `fastmcp.Client` have it)."""

    async def send_task_request(
        self,
        request: Request[Any, Any],
        result_type: TypeAdapter[_T],
        read_timeout_seconds: float | None,
        progress_callback: ProgressFnT | None,
    ) -> _T:
        """Send `request` (one attempt), its answer read as `result_type`."""
        ...


def task_session(session: ToolSession) -> TaskSession:
    """`session` as one that sends the tasks extension's requests, or TypeError (before anything
    is sent) for a `ToolSession` that does not implement `TaskSession`."""
    if isinstance(session, TaskSession):
        return session
    raise TypeError(
        f"{type(session).__name__} cannot send a task-augmented call: implement"
        " orchestrator.TaskSession (send_task_request) to create or poll tasks"
    )


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
    """The half of an adapter that only needs the SDK `ClientSession` underneath (if any yet),
    including its input-required rounds: they are sent on that session itself, since the
    clients above it (`mcp.client.Client`, `fastmcp.Client`) answer a round on their own."""

    def inner(self) -> ClientSession | None:
        """The live `ClientSession`, or None when there is none (not entered, or exited)."""
        raise NotImplementedError

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        read_timeout_seconds: float | None,
        progress_callback: ProgressFnT | None,
        *,
        meta: RequestParamsMeta | None,
    ) -> CallToolResult:
        """The adapter's plain `tools/call` (`ToolSession.call_tool`)."""
        raise NotImplementedError

    async def call_tool_round(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        read_timeout_seconds: float | None,
        progress_callback: ProgressFnT | None,
        *,
        meta: RequestParamsMeta | None,
        input_responses: InputResponses | None,
        request_state: str | None,
    ) -> CallToolResult | InputRequiredResult:
        """`InputRoundSession.call_tool_round`. A round exists on a 2026-07-28 session only: on a
        handshake-era one (which asks by server-to-client requests, answered by the client's own
        callbacks) the call is the plain one, and a continuation cannot be carried (TypeError).
        Without a live session the plain call fails as a closed link does."""
        inner = self.inner()
        if inner is None or inner.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            if inner is not None and (input_responses is not None or request_state is not None):
                raise TypeError(
                    "input_responses and request_state need a 2026-07-28 session; this one"
                    f" speaks {inner.protocol_version}"
                )
            return await self.call_tool(
                name, arguments, read_timeout_seconds, progress_callback, meta=meta
            )
        return await self.send_round(
            inner.call_tool(
                name,
                arguments,
                read_timeout_seconds,
                progress_callback,
                input_responses=input_responses,
                request_state=request_state,
                meta=meta,
                allow_input_required=True,
            )
        )

    async def send_round(self, sending: Coroutine[Any, Any, _T]) -> _T:
        """Await a round's (or a task's) request on the inner session (an adapter adds its
        client's watch)."""
        return await sending

    async def send_task_request(
        self,
        request: Request[Any, Any],
        result_type: TypeAdapter[_T],
        read_timeout_seconds: float | None,
        progress_callback: ProgressFnT | None,
    ) -> _T:
        """`TaskSession.send_task_request`, on the inner session; without one, it fails as a
        closed link does (never sent)."""
        inner = self.inner()
        if inner is None:
            raise MCPError(CONNECTION_CLOSED, "Connection closed")
        return await self.send_round(
            inner.send_request(
                request,
                result_type,
                request_read_timeout_seconds=read_timeout_seconds,
                progress_callback=progress_callback,
            )
        )

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


#: The hook an integration module defines to adapt its framework's client: `obj` as a
#: `ToolSession` when it is one of that framework's clients, else None.
AdaptSession: TypeAlias = Callable[[object], ToolSession | None]

#: Per class: the integration hooks found for it (empty for most), in MRO order. Weak, so that
#: classes made on the fly (mocks) do not accumulate.
_hooks: weakref.WeakKeyDictionary[type, tuple[AdaptSession, ...]] = weakref.WeakKeyDictionary()


def _integration_hook(package: str) -> AdaptSession | None:
    """`orchestrator.<package>.as_tool_session`, if that integration module exists and imports."""
    if not package.isidentifier() or package.startswith("_") or package == __package__:
        return None  # not a framework's package: a private module, or this library itself
    try:
        module = importlib.import_module(f"{__package__}.{package}")
    except ImportError:  # no integration for this package, or its framework lacks a part it needs
        return None
    hook = getattr(module, "as_tool_session", None)
    return hook if callable(hook) else None


def _hooks_for(cls: type) -> tuple[AdaptSession, ...]:
    """The integration hooks for objects of `cls`: one per top-level package in its MRO."""
    hooks = _hooks.get(cls)
    if hooks is None:
        modules = (getattr(klass, "__module__", None) for klass in cls.__mro__)
        packages = dict.fromkeys(m.partition(".")[0] for m in modules if isinstance(m, str))
        found = (_integration_hook(package) for package in packages)
        hooks = _hooks[cls] = tuple(hook for hook in found if hook is not None)
    return hooks


def _integration_adapter(session: object) -> ToolSession | None:
    """`session` adapted by the integration of the framework that defines its class, if any."""
    for hook in _hooks_for(type(session)):
        if (adapted := hook(session)) is not None:
            return adapted
    return None


def tool_session(session: object) -> ToolSession:
    """`session` as the `ToolSession` that `RetryingSession` drives, or TypeError for anything
    it cannot drive: the SDK's `ClientSession` or `Client`, a framework client its integration
    adapts (a connected `fastmcp.Client`), or a `ToolSession` itself (returned as it is)."""
    if isinstance(session, ClientSession | Client):
        return _SDK(session)
    if (adapted := _integration_adapter(session)) is not None:
        return adapted
    if isinstance(session, ToolSession):
        return session
    raise TypeError(
        "session must be an mcp ClientSession or Client, a client an orchestrator integration"
        " adapts (such as a connected fastmcp.Client), or implement orchestrator.ToolSession;"
        f" got {type(session).__name__}"
    )
