"""OpenAI Agents SDK servers whose tool calls are retried safely instead of blindly.

`RetryingMCPServerStdio`, `RetryingMCPServerStreamableHttp` and `RetryingMCPServerSse` are the
SDK's own server classes (same arguments, plus keyword `policy=`, a `RetryPolicy`) with one
difference: `call_tool` goes through `RetryingSession`. Why: with `max_retry_attempts > 0` the SDK
re-sends *any* failed `call_tool` (and the streamable HTTP class re-sends on a fresh session after
a timeout or a 5xx) with no key and no look at the tool's annotations, so a tool whose answer was
lost runs twice. Here:

- the SDK's retry loop never runs for tool calls (`max_retry_attempts` still governs listing);
- every call carries an idempotency key derived from the model's tool-call id (and the tool name),
  so the call is the same logical call on every attempt and if the model re-issues it under the
  same id; a user `tool_meta_resolver` still runs, and a key it sets wins;
- `client_session_timeout_seconds` is the per-attempt timeout unless the policy sets one;
- a call that may have run but cannot be retried reaches the model as an `isError` tool result
  that says so ("may have run; do not repeat"), not as the SDK's default "Please try again".

A dead connection is not replaced: the SDK owns it (`connect()` again). Needs the `openai-agents`
extra (`pip install "mcp-once[openai-agents]"`).
"""

from __future__ import annotations

import inspect
import secrets
from typing import Any

from agents.mcp import MCPServerSse, MCPServerStdio, MCPServerStreamableHttp
from agents.mcp.server import _MCPServerWithClientSession
from agents.mcp.util import MCPToolMetaContext, MCPToolMetaResolver
from agents.tool_context import ToolContext
from mcp_types import CallToolResult, TextContent

from idempotency import wire

from ._integration import PerConnection, attempt_timeout, tell_model
from ._key import derive_key
from ._outcome import NotExecuted, OutcomeUnknown
from ._policy import RetryPolicy

__all__ = ["RetryingMCPServerSse", "RetryingMCPServerStdio", "RetryingMCPServerStreamableHttp"]

#: The prefix of keys derived from the Agents SDK's tool-call ids.
KEY_SOURCE = "openai-agents"


class _RetryingServer(_MCPServerWithClientSession):
    """The behaviour the three retrying server classes share (see the module doc)."""

    def __init__(self, *args: Any, policy: RetryPolicy | None = None, **kwargs: Any) -> None:
        self._mcp_once = PerConnection(policy)
        self._user_meta_resolver: MCPToolMetaResolver | None = None
        # Tool-call ids are unique per call for OpenAI's models; this scope keeps two server
        # objects (or processes) whose model repeats ids from sharing a key.
        self._key_scope = secrets.token_hex(8)
        super().__init__(*args, **kwargs)

    @property
    def policy(self) -> RetryPolicy:
        return self._mcp_once.policy

    @property
    def tool_meta_resolver(self) -> MCPToolMetaResolver:
        """The SDK's `_meta` hook: the user's resolver (if any), plus the idempotency key."""
        return self._resolve_meta

    @tool_meta_resolver.setter
    def tool_meta_resolver(self, resolver: MCPToolMetaResolver | None) -> None:
        self._user_meta_resolver = resolver

    async def _resolve_meta(self, context: MCPToolMetaContext) -> dict[str, Any] | None:
        meta: dict[str, Any] = {}
        if self._user_meta_resolver is not None:
            resolved = self._user_meta_resolver(context)
            if inspect.isawaitable(resolved):
                resolved = await resolved
            if resolved is not None:
                if not isinstance(resolved, dict):
                    raise TypeError("MCP meta resolver must return a dict or None.")
                meta.update(resolved)
        run = context.run_context
        if wire.KEY_META not in meta and isinstance(run, ToolContext):
            meta[wire.KEY_META] = derive_key(
                KEY_SOURCE, self._key_scope, context.tool_name, run.tool_call_id
            )
        return meta or None

    async def call_tool(
        self,
        tool_name: str,
        arguments: dict[str, Any] | None,
        meta: dict[str, Any] | None = None,
    ) -> CallToolResult:
        """Call a tool through `RetryingSession`; never the SDK's blind retry loop."""
        session = self.session
        if session is None:
            return await super().call_tool(tool_name, arguments, meta)  # the SDK's own error
        self._validate_required_parameters(tool_name=tool_name, arguments=arguments)
        retrying = self._mcp_once.session_for(session, session)
        read_timeout = attempt_timeout(None, retrying.policy, self.client_session_timeout_seconds)

        async def call() -> CallToolResult:
            return await retrying.call_tool(tool_name, arguments, read_timeout, meta=meta)

        try:
            return await self._maybe_serialize_request(call)
        except (OutcomeUnknown, NotExecuted) as gave_up:
            return CallToolResult(
                content=[TextContent(type="text", text=tell_model(gave_up))], is_error=True
            )


class RetryingMCPServerStdio(_RetryingServer, MCPServerStdio):
    """`agents.mcp.MCPServerStdio` with safe retries: the SDK's arguments plus `policy=`."""


class RetryingMCPServerStreamableHttp(_RetryingServer, MCPServerStreamableHttp):
    """`agents.mcp.MCPServerStreamableHttp` with safe retries: the SDK's arguments plus `policy=`.

    Also replaces the SDK's re-send on a fresh ("isolated") session after a timeout or a 5xx.
    """


class RetryingMCPServerSse(_RetryingServer, MCPServerSse):
    """`agents.mcp.MCPServerSse` with safe retries: the SDK's arguments plus `policy=`."""
