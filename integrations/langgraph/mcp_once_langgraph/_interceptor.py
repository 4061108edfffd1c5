"""`CheckpointKeys`: a `langchain-mcp-adapters` tool-call interceptor that sends each MCP call with
an idempotency key taken from the LangGraph checkpoint the call runs under.

Why an interceptor that makes the call itself: the adapters' own call (`ClientSession.call_tool`
inside `convert_mcp_tool_to_langchain_tool`) passes no `_meta`, and an interceptor may change only
the name, the arguments and the HTTP headers of the request it hands on. `mcp` 1.x's
`ClientSession.call_tool` takes `meta=` (since before 1.24, the adapters' floor), so this
interceptor does not hand the request on: it sends it, with the key in `_meta`, on the session
it was given (`session=`) or on a session of its own to the request's server (`connections=`,
the same mapping `MultiServerMCPClient` takes, one session per call as the adapters open one).
The server needs no change: it reads the key where every mcp-once client puts it.

Consequences, documented for the user: it must be the *last* interceptor of the list (the
innermost; interceptors after it never run), the adapters' `callbacks=` (progress, logging,
elicitation) do not reach the calls it makes, and it returns the raw `CallToolResult`, so an
interceptor in front of it sees the server's replay marker (`IDEMPOTENCY_META` in `result.meta`).

Why the checkpoint must be written before the tool runs (`durability="sync"`): the key is built
from the model's `tool_call_id`, which exists only in the model's message. Measured with
`langgraph` 1.2 and its SQLite checkpointer: under the default `durability="async"`, 7 of 18
workers killed around an MCP call had lost that message (its checkpoint was still being written),
the model ran again, minted a new `tool_call_id`, and 6 of the 18 paid twice *with* a key. So a
call under any durability but `"sync"` (or with no checkpointer, or outside a tool node) is
refused before anything is sent (`DurabilityError`), unless the user chooses `on_unsafe="warn"`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from langchain_mcp_adapters.interceptors import MCPToolCallRequest, MCPToolCallResult
from langchain_mcp_adapters.sessions import Connection, create_session
from langgraph._internal._constants import (
    CONFIG_KEY_CHECKPOINTER,
    CONFIG_KEY_DURABILITY,
    NS_SEP,
)
from langgraph.prebuilt import ToolRuntime

from ._key import IDEMPOTENCY_META, KEY_META, checkpoint_key

if TYPE_CHECKING:
    from mcp import ClientSession
    from mcp.types import CallToolResult

__all__ = ["CallIdentity", "CheckpointKeys", "DurabilityError", "OnUnsafe", "call_identity"]

_log = logging.getLogger("mcp_once_langgraph")

#: What to do with a call whose key would not survive a crash: refuse it (the default) or send it
#: anyway and log a warning on every such call.
OnUnsafe = Literal["refuse", "warn"]

#: LangGraph 1.2's durability when the caller passed none (`Pregel._defaults`): it puts nothing in
#: the config then, so an absent setting means this.
_DEFAULT_DURABILITY = "async"
#: The transports whose connection config carries HTTP headers (as the adapters merge them).
_HTTP_TRANSPORTS = frozenset({"sse", "http", "streamable_http", "streamable-http"})

_Handler = Callable[[MCPToolCallRequest], Awaitable[MCPToolCallResult]]


class DurabilityError(RuntimeError):
    """The call was not sent: its key would not be the same after a crash and a resume.

    Raised from inside the tool, so LangGraph's `ToolNode` (whose default error handling re-raises
    everything but invalid tool arguments) fails the run loudly instead of showing the model an
    error it might answer by calling again.
    """


@dataclass(frozen=True)
class CallIdentity:
    """Where one MCP tool call runs, as LangGraph hands it to the task again after a resume."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    tool_call_id: str
    tool: str
    #: The graph run's durability (`"sync"`, `"async"`, `"exit"`), LangGraph's default if unset.
    durability: str
    checkpointer: bool

    @property
    def key(self) -> str:
        return checkpoint_key(
            thread_id=self.thread_id,
            checkpoint_ns=self.checkpoint_ns,
            checkpoint_id=self.checkpoint_id,
            tool_call_id=self.tool_call_id,
            tool=self.tool,
        )

    def problem(self) -> str | None:
        """Why this call's key would not survive a crash, or None when it would."""
        if not self.checkpointer:
            return (
                "the graph has no checkpointer: after a crash nothing resumes the thread, the"
                " model runs again and its new tool_call_id makes a new key"
            )
        if self.durability != "sync":
            return (
                f"the graph runs with durability={self.durability!r}: a crash can lose the"
                " model's message before its checkpoint is written, the model runs again with a"
                " new tool_call_id and the tool runs twice despite the key (measured: 6 of 18"
                " crashes under 'async'); run the graph with durability='sync'"
            )
        return None


def call_identity(runtime: object, tool: str) -> CallIdentity | None:
    """The identity of the call `tool` makes under `runtime` (the `ToolRuntime` the adapters pass
    interceptors as `request.runtime`), or None outside a LangGraph tool node.

    `checkpoint_ns` is the task's own namespace (`tools:<task id>`, the task id a hash of the
    checkpoint the step runs from), `checkpoint_id` that checkpoint's id, as the task's
    `checkpoint_map` gives it for the parent namespace (inside a task the config's own
    `checkpoint_id` is the one the caller passed, usually none).
    """
    if not isinstance(runtime, ToolRuntime) or runtime.tool_call_id is None:
        return None
    configurable: Mapping[str, Any] = runtime.config.get("configurable") or {}
    namespace = str(configurable.get("checkpoint_ns") or "")
    checkpoint_map: Mapping[str, Any] = configurable.get("checkpoint_map") or {}
    parent = namespace.rpartition(NS_SEP)[0]
    checkpoint_id = checkpoint_map.get(parent) or configurable.get("checkpoint_id") or ""
    return CallIdentity(
        thread_id=str(configurable.get("thread_id") or ""),
        checkpoint_ns=namespace,
        checkpoint_id=str(checkpoint_id),
        tool_call_id=str(runtime.tool_call_id),
        tool=tool,
        durability=str(configurable.get(CONFIG_KEY_DURABILITY) or _DEFAULT_DURABILITY),
        checkpointer=configurable.get(CONFIG_KEY_CHECKPOINTER) is not None,
    )


class CheckpointKeys:
    """Keys every MCP tool call from the LangGraph checkpoint it runs under, and sends it.

        connections = {"shop": {"transport": "streamable_http", "url": url}}
        keys = CheckpointKeys(connections=connections)
        client = MultiServerMCPClient(connections, tool_interceptors=[keys])
        graph = builder.compile(checkpointer=saver)
        await graph.ainvoke(inputs, config, durability="sync")

    Give it exactly one of `session` (the `ClientSession` given to `load_mcp_tools`) or
    `connections` (server name -> the adapters' connection config, as `MultiServerMCPClient`
    takes). Put it last in `tool_interceptors`. `on_unsafe="warn"` sends calls whose key would not
    survive a crash (see `CallIdentity.problem`) anyway, with a warning on each, instead of
    refusing them with `DurabilityError`.
    """

    def __init__(
        self,
        *,
        session: ClientSession | None = None,
        connections: Mapping[str, Connection] | None = None,
        on_unsafe: OnUnsafe = "refuse",
    ) -> None:
        if (session is None) == (connections is None):
            raise ValueError("CheckpointKeys needs exactly one of session= or connections=")
        if on_unsafe not in ("refuse", "warn"):
            raise ValueError(f"on_unsafe must be 'refuse' or 'warn', not {on_unsafe!r}")
        self._session = session
        self._connections = dict(connections) if connections is not None else None
        self._on_unsafe = on_unsafe

    async def __call__(self, request: MCPToolCallRequest, handler: _Handler) -> MCPToolCallResult:
        identity = call_identity(request.runtime, request.name)
        if identity is None:
            self._unsafe(
                request.name,
                "no LangGraph tool runtime (the tool was not run by a ToolNode): there is no"
                " checkpoint to key the call from",
            )
            return await handler(request)  # warned: sent as the adapters send it, unkeyed
        problem = identity.problem()
        if problem is not None:
            self._unsafe(request.name, problem)
        result = await self._send(request, identity.key)
        if _replayed(result):
            _log.info("tool %s: the server replayed the stored result", request.name)
        return result

    def _unsafe(self, tool: str, problem: str) -> None:
        if self._on_unsafe == "refuse":
            raise DurabilityError(f"mcp-once did not send the call to {tool!r}: {problem}")
        _log.warning("tool %s: sent with a key that may not survive a crash: %s", tool, problem)

    async def _send(self, request: MCPToolCallRequest, key: str) -> CallToolResult:
        meta = {KEY_META: key}
        if self._session is not None:
            return await self._session.call_tool(request.name, request.args, meta=meta)
        assert self._connections is not None
        connection = self._connections.get(request.server_name)
        if connection is None:
            known = ", ".join(sorted(self._connections)) or "none"
            raise KeyError(
                f"CheckpointKeys has no connection for server {request.server_name!r} (known:"
                f" {known}); give it the mapping MultiServerMCPClient was given"
            )
        if request.headers is not None and connection["transport"] in _HTTP_TRANSPORTS:
            merged: dict[str, Any] = dict(connection)
            merged["headers"] = {**(merged.get("headers") or {}), **request.headers}
            connection = merged  # type: ignore[assignment]
        failure: Exception | None = None
        async with create_session(connection) as session:
            await session.initialize()
            try:
                result = await session.call_tool(request.name, request.args, meta=meta)
            except Exception as exc:
                # Raised outside the session's context, as the adapters do: the MCP SDK's
                # session teardown may otherwise swallow it.
                failure = exc
        if failure is not None:
            raise failure
        return result


def _replayed(result: CallToolResult) -> bool:
    marker = (result.meta or {}).get(IDEMPOTENCY_META)
    return isinstance(marker, Mapping) and marker.get("status") == "replayed"
