"""FastMCP's client with mcp-once's retries: `RetryingClient`, a `fastmcp.Client` drop-in.

`RetryingClient(transport, ..., policy=RetryPolicy(...))` takes `fastmcp.Client`'s own arguments.
Its tool calls (`call_tool`, `call_tool_mcp`, and so everything built on them, such as
pydantic-ai's `MCPToolset`) go through `RetryingSession`: one idempotency key per logical call,
retries only where the tool's annotations and the key make them safe, `OutcomeUnknown` where they
do not. `call_tool` keeps FastMCP's result parsing and return type. Everything else (listing,
resources, prompts, the connection itself) is FastMCP's, untouched.

Needs the `fastmcp` extra (`pip install "mcp-once[fastmcp]"`): `fastmcp.Client` lives in
`fastmcp-slim[client]`, which the full `fastmcp` package and pydantic-ai's `mcp` extra both pull.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

import mcp_types
from fastmcp import Client
from fastmcp.client.progress import ProgressHandler
from fastmcp.client.transports import ClientTransport
from fastmcp.client.transports.base import SessionKwargs, TransportOptions
from fastmcp.utilities.timeout import normalize_timeout_to_seconds
from mcp import ClientSession, MCPError
from mcp.shared.dispatcher import ProgressFnT
from mcp_types import (
    CONNECTION_CLOSED,
    CallToolResult,
    ListToolsResult,
    RequestParamsMeta,
)

from ._integration import PerConnection, attempt_timeout
from ._key import KeySource
from ._policy import RetryPolicy
from ._run import Run
from ._sessions import OverClientSession

if TYPE_CHECKING:
    from mcp.client._transport import TransportStreams

__all__ = ["FastMCPSession", "RetryingClient", "SDKStreamTransport"]

ResultT = TypeVar("ResultT")


def as_tool_session(session: object) -> FastMCPSession | None:
    """`session` as a `ToolSession` if it is a `fastmcp.Client`: the hook by which
    `RetryingSession` (through `tool_session`, which finds this module by the client's package
    name and never imports it otherwise) drives a plain `fastmcp.Client`."""
    return FastMCPSession(session) if isinstance(session, Client) else None


class FastMCPSession(OverClientSession):
    """A connected `fastmcp.Client` as an `orchestrator.ToolSession`.

    Calls go through the client's own `call_tool_mcp` (trace propagation, input rounds, extension
    results, and its watch on the session task) of `fastmcp.Client` itself, so a `RetryingClient`
    wrapped here does not retry twice. A failure that killed the client's session task is
    reported as the SDK reports a closed link (-32000), which is what it is for the retry
    decision: the request may have been sent, and the session is gone.
    """

    def __init__(self, client: Client[Any]) -> None:
        self._client = client

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        read_timeout_seconds: float | None,
        progress_callback: ProgressFnT | None,
        *,
        meta: RequestParamsMeta | None,
    ) -> CallToolResult:
        return await self._watched(
            Client.call_tool_mcp(
                self._client,
                name,
                arguments if arguments is not None else {},
                progress_handler=progress_callback,
                timeout=read_timeout_seconds,
                meta=dict(meta) if meta is not None else None,
            )
        )

    async def send_round(self, sending: Coroutine[Any, Any, ResultT]) -> ResultT:
        """A round's (or a task's) request, under the client's watch on its session task (as
        FastMCP's own proxy sends one), failing as `call_tool` does."""
        return await self._watched(self._client._await_with_session_monitoring(sending))

    async def _watched(self, sending: Awaitable[ResultT]) -> ResultT:
        """A failure that killed the client's session task reads as the SDK's closed link."""
        try:
            return await sending
        except MCPError:
            raise
        except Exception as exc:
            if self.closed():
                raise MCPError(CONNECTION_CLOSED, "Connection closed") from exc
            raise

    async def list_tools_page(self, cursor: str | None) -> ListToolsResult:
        return await Client.list_tools_mcp(self._client, cursor=cursor, cache_mode="refresh")

    def inner(self) -> ClientSession | None:
        return self._client.session if self._client.is_connected() else None


class RetryingClient(Client[Any]):
    """A `fastmcp.Client` whose tool calls are retried safely; usable wherever one is accepted.

    Takes `fastmcp.Client`'s arguments plus `policy=` (a `RetryPolicy`), `key_source=` (a
    `KeySource`) and `run=` (an entered `orchestrator.Run`, which journals the calls that bring
    no key; it comes before `key_source`). Per-attempt timeout: the call's `timeout=`, else the
    policy's `attempt_timeout`, else the client's `timeout=`. Keys: a key passed in `meta` under
    `io.github.mcp-once/idempotency-key` is used on every attempt (that is how pydantic-ai's
    tool-call ids become keys, see `orchestrator.pydantic_ai`); without one, `key_source` (if
    given) is asked, and otherwise (or when it answers None) each `call_tool` mints its own.
    Raises what `RetryingSession.call_tool` raises (`OutcomeUnknown`, `NotExecuted`,
    `ToolCallError`), plus FastMCP's own `ToolError` for an `isError` result when
    `raise_on_error` is set.

    A dead connection is not replaced behind FastMCP's back (the client owns it): the call ends
    `NotExecuted`/`OutcomeUnknown` with reason `no_connect`; entering the client again opens a
    new connection, which gets a fresh tool catalog and keeps the retry budget.
    """

    def __init__(
        self,
        transport: Any,
        *args: Any,
        policy: RetryPolicy | None = None,
        key_source: KeySource | None = None,
        run: Run | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(transport, *args, **kwargs)
        self._mcp_once = PerConnection(policy, key_source, run)

    @property
    def policy(self) -> RetryPolicy:
        return self._mcp_once.policy

    @property
    def key_source(self) -> KeySource | None:
        return self._mcp_once.key_source

    @property
    def run(self) -> Run | None:
        return self._mcp_once.run

    def new(self) -> RetryingClient:
        """A fresh clone (FastMCP's `new()`), with connection state of its own; budget, key
        source and run shared."""
        clone = super().new()
        assert isinstance(clone, RetryingClient)
        clone._mcp_once = PerConnection(
            self._mcp_once.policy, self._mcp_once.key_source, self._mcp_once.run
        )
        return clone

    async def call_tool_mcp(
        self,
        name: str,
        arguments: dict[str, Any],
        progress_handler: ProgressHandler | None = None,
        timeout: datetime.timedelta | float | int | None = None,
        meta: dict[str, Any] | None = None,
    ) -> mcp_types.CallToolResult:
        """`fastmcp.Client.call_tool_mcp`, retried by `RetryingSession` (see the class doc)."""
        connection = self.session  # FastMCP's own RuntimeError when not connected
        retrying = self._mcp_once.session_for(connection, self)
        framework_timeout = self._session_kwargs.get("read_timeout_seconds")
        read_timeout = attempt_timeout(
            normalize_timeout_to_seconds(timeout), retrying.policy, framework_timeout
        )
        return await retrying.call_tool(name, arguments, read_timeout, progress_handler, meta=meta)


class SDKStreamTransport(ClientTransport):
    """A FastMCP transport over any MCP SDK stream transport, such as `Chaos.wrap(...)`.

    `make` returns a fresh SDK transport (an async context manager yielding the read and write
    streams) for each connection, since SDK transports are single-use. This is how a
    `fastmcp.Client` runs over the fault-injecting link of `orchestrator.chaos`.
    """

    def __init__(self, make: Callable[[], AbstractAsyncContextManager[TransportStreams]]) -> None:
        self._make = make

    @contextlib.asynccontextmanager
    async def connect_session(
        self,
        *,
        transport_options: TransportOptions | None = None,
        **session_kwargs: Unpack[SessionKwargs],
    ) -> AsyncGenerator[ClientSession, None]:
        options = transport_options or TransportOptions()
        async with (
            self._make() as (read, write),
            options.session_class(
                read_stream=read, write_stream=write, **session_kwargs
            ) as session,
        ):
            yield session

    def __repr__(self) -> str:
        return "<SDKStreamTransport>"
