"""OpenAI Agents SDK servers whose tool calls are retried safely instead of blindly.

`RetryingMCPServerStdio`, `RetryingMCPServerStreamableHttp` and `RetryingMCPServerSse` are the
SDK's own server classes (same arguments, plus keywords `policy=`, a `RetryPolicy`,
`key_source=`, a `KeySource`, and `run=`, an entered `orchestrator.Run`) with one
difference: `call_tool` goes through `RetryingSession`. Why: with `max_retry_attempts > 0` the SDK
re-sends *any* failed `call_tool` (and the streamable HTTP class re-sends on a fresh session after
a timeout or a 5xx) with no key and no look at the tool's annotations, so a tool whose answer was
lost runs twice. Here:

- the SDK's retry loop never runs for tool calls (`max_retry_attempts` still governs listing);
- every call carries an idempotency key, the first of: a key already in the call's `_meta` (set by a
  user `tool_meta_resolver`, which still runs, or by a workflow-side resolver that hands `call_tool`
  its `meta`); the server's `run=` (the run's journal: the key comes from the run id and the call's
  position, see `orchestrator.Run`; the SDK does not tell a tool its index in the model's response,
  so the calls of one response are numbered in the order they reach the server object: the SDK
  starts them in response order, but with its default concurrency they reach it as its scheduling
  has them; set `RunConfig(tool_execution=ToolExecutionConfig(max_function_tool_concurrency=1))`
  where that order must hold strictly); the server's `key_source=` (a `KeySource`, e.g. a durable
  engine's step); a key derived from the server's name, the tool name and the model's tool-call id;
  a fresh one (a `call_tool` outside an agent run, with no source). The derived key is the same
  logical call on every attempt, if the model re-issues it under the same id, and in another process
  of the same run (a worker that picks the run up after a crash): it holds nothing random of the
  server object's;
- a key the model put in the tool's key argument (the listing's `keyArgument`, a server's
  `key_argument=`) is the call's key: every key above (a resolver's, `temporal_tool_meta`'s, the
  run's, the source's, the derived one) gives way to it, as the framework's and not the model's.
  The listing tells the model to reuse its key when it retries an action, and that retry is a
  new tool call with a new tool-call id: only the model's key carries its intent. Without one
  from the model, the call's key goes in the argument as well as in `_meta`;
- `client_session_timeout_seconds` is the per-attempt timeout unless the policy sets one;
- a call that may have run but cannot be retried reaches the model as an `isError` tool result
  that says so ("may have run; do not repeat"), not as the SDK's default "Please try again".

A tool listing's `_meta` never carries a request key out of these classes (`list_tools` drops
`KEY_META` and `ATTEMPT_META` from each tool's `_meta`): the SDK copies a listed tool's `_meta`
into every call to it and merges it *after* a resolver's, so a key in a listing would overwrite
every call's key with one shared key, and a guarded server would replay one call's result to all.

On Temporal (`temporalio.contrib.openai_agents`), the tool-call id exists only in workflow code:
`temporal_tool_meta` is the workflow-side `tool_meta_resolver` that keys each call from the
workflow run and the tool-call id (`temporal_mcp_server("shop", tool_meta_resolver=
temporal_tool_meta)`); the worker-side server (one of these classes, or the SDK's) sends it.

A dead connection is not replaced: the SDK owns it (`connect()` again). Needs the `openai-agents`
extra (`pip install "mcp-once[openai-agents]"`); works with openai-agents 0.22 to 0.24, so it
installs beside `temporalio[openai-agents]` (whose plugin pins 0.22).
"""

from __future__ import annotations

import inspect
from typing import Any

from agents import AgentBase, RunContextWrapper
from agents.mcp import MCPServerSse, MCPServerStdio, MCPServerStreamableHttp
from agents.mcp.server import _MCPServerWithClientSession
from agents.mcp.util import MCPToolMetaContext, MCPToolMetaResolver
from agents.tool_context import ToolContext
from mcp_types import CallToolResult, TextContent, Tool

from idempotency import wire

from ._integration import PerConnection, attempt_timeout, tell_model
from ._key import KeySource, adapter_key, derive_key, key_from_source
from ._outcome import NotExecuted, OutcomeUnknown
from ._policy import RetryPolicy
from ._run import Run

__all__ = [
    "KEY_SOURCE",
    "RetryingMCPServerSse",
    "RetryingMCPServerStdio",
    "RetryingMCPServerStreamableHttp",
    "temporal_tool_call_key",
    "temporal_tool_meta",
    "tool_call_key",
]

#: The prefix of keys derived from the Agents SDK's tool-call ids.
KEY_SOURCE = "openai-agents"


def tool_call_key(server_name: str, tool_name: str, tool_call_id: str) -> str:
    """The key derived for one tool call of an agent run: hashed from the server's name, the
    tool's name and the model's tool-call id.

    Why these and nothing random: a run resumed in another process (or a server object made
    again) must send the keys of the first attempt, so the scope has to be something both
    processes know. The server's name (the SDK's `name=`, by default built from its command or
    URL) keeps two *different* servers apart, so a call to one cannot replay another's stored
    result; the tool-call id tells the calls of a run apart. OpenAI's tool-call ids are random
    per call; a model or gateway that repeats ids across runs (e.g. "call_0" every run) would
    make two runs share keys, and a guarded server would replay the first run's result: give
    such a server a `key_source` (or a `tool_meta_resolver` setting the key) that brings a run
    identity.
    """
    return derive_key(KEY_SOURCE, server_name, tool_name, tool_call_id)


def temporal_tool_call_key(
    namespace: str,
    workflow_id: str,
    run_id: str,
    server_name: str,
    tool_name: str,
    tool_call_id: str,
) -> str:
    """The key of one tool call of an agent run inside a Temporal workflow: hashed from the
    workflow run (namespace, workflow id, run id), the server and tool names and the model's
    tool-call id.

    Why the run and not only the tool-call id: a scripted or gateway model may repeat ids across
    runs, and a new run (a reset, Continue-As-New, the same workflow id started again) is meant
    to execute again, by Temporal's design. The tool-call id comes from the model's answer,
    which Temporal records (the model runs as an activity), so a replay sees the same id.
    """
    return derive_key(
        KEY_SOURCE, "temporal", namespace, workflow_id, run_id, server_name, tool_name, tool_call_id
    )


def temporal_tool_meta(context: MCPToolMetaContext) -> dict[str, Any]:
    """A `tool_meta_resolver` for workflow code (`temporalio.contrib.openai_agents`): `_meta`
    holding the call's idempotency key, `temporal_tool_call_key` of this workflow run.

    Pass it to `temporal_mcp_server(name, tool_meta_resolver=temporal_tool_meta)`. Why here: the
    workflow is the only place that knows the tool-call id (the activity that calls the server
    gets the tool name, arguments and `_meta` only), and the only identity that survives a
    worker crash; a worker-side key would be new on every activity attempt. Deterministic and
    sandbox-safe: `workflow.info()` and a SHA-256, no I/O, clock or randomness, so a replay
    gives the same `_meta` (and the same history). A tool-call id repeated within one run (a
    model that reuses ids) gives one key: the second call replays the first call's result.
    To compose with a resolver of your own, call this one and merge its answer last.
    """
    # Lazily: only workflow code on Temporal calls this, and the Agents SDK extra does not
    # bring temporalio.
    from temporalio import workflow

    if not workflow.in_workflow():
        raise RuntimeError(
            "temporal_tool_meta is a workflow-side resolver: call it in workflow code"
        )
    run = context.run_context
    if not isinstance(run, ToolContext):
        raise TypeError(
            "temporal_tool_meta needs the tool call's context (a ToolContext with tool_call_id), "
            f"got {type(run).__name__}"
        )
    info = workflow.info()
    key = temporal_tool_call_key(
        info.namespace,
        info.workflow_id,
        info.run_id,
        context.server_name,
        context.tool_name,
        run.tool_call_id,
    )
    return {wire.KEY_META: key}


#: Request `_meta` names that must never come from a tool listing (see the module doc).
_PER_CALL_META = frozenset({wire.KEY_META, wire.ATTEMPT_META})


def _without_per_call_meta(tools: list[Tool]) -> list[Tool]:
    """The listing with request-only names dropped from each tool's `_meta` (others kept)."""
    cleaned: list[Tool] = []
    for tool in tools:
        meta = tool.meta
        if meta is not None and not _PER_CALL_META.isdisjoint(meta):
            kept = {name: value for name, value in meta.items() if name not in _PER_CALL_META}
            tool = tool.model_copy(update={"meta": kept or None})
        cleaned.append(tool)
    return cleaned


class _RetryingServer(_MCPServerWithClientSession):
    """The behaviour the three retrying server classes share (see the module doc)."""

    def __init__(
        self,
        *args: Any,
        policy: RetryPolicy | None = None,
        key_source: KeySource | None = None,
        run: Run | None = None,
        **kwargs: Any,
    ) -> None:
        self._mcp_once = PerConnection(policy, key_source, run)
        self._user_meta_resolver: MCPToolMetaResolver | None = None
        super().__init__(*args, **kwargs)

    @property
    def policy(self) -> RetryPolicy:
        return self._mcp_once.policy

    @property
    def key_source(self) -> KeySource | None:
        return self._mcp_once.key_source

    @property
    def run(self) -> Run | None:
        return self._mcp_once.run

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
        if wire.KEY_META in meta:
            return meta  # the resolver's key wins; `RetryingSession` checks it
        if self._mcp_once.run is not None:
            return meta or None  # the run's journal keys the call, in `RetryingSession`
        key_source = self._mcp_once.key_source
        key = (
            key_from_source(key_source, context.tool_name, context.arguments)
            if key_source is not None
            else None
        )
        run = context.run_context
        if key is None and isinstance(run, ToolContext):
            key = tool_call_key(context.server_name, context.tool_name, run.tool_call_id)
        if key is not None:
            meta[wire.KEY_META] = key
        return meta or None

    async def list_tools(
        self,
        run_context: RunContextWrapper[Any] | None = None,
        agent: AgentBase | None = None,
    ) -> list[Tool]:
        """The SDK's listing, with no per-call `_meta` name in any tool's `_meta`: the SDK would
        merge it into every call after the resolver's key (see the module doc)."""
        return _without_per_call_meta(await super().list_tools(run_context, agent))

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
            # Whatever key the SDK's resolvers put in `_meta` gives way to the model's own.
            with adapter_key((meta or {}).get(wire.KEY_META)):
                return await retrying.call_tool(tool_name, arguments, read_timeout, meta=meta)

        try:
            return await self._maybe_serialize_request(call)
        except (OutcomeUnknown, NotExecuted) as gave_up:
            return CallToolResult(
                content=[TextContent(type="text", text=tell_model(gave_up))], is_error=True
            )


class RetryingMCPServerStdio(_RetryingServer, MCPServerStdio):
    """`agents.mcp.MCPServerStdio` with safe retries: the SDK's arguments plus
    `policy=`, `key_source=` and `run=`."""


class RetryingMCPServerStreamableHttp(_RetryingServer, MCPServerStreamableHttp):
    """`agents.mcp.MCPServerStreamableHttp` with safe retries: the SDK's arguments plus
    `policy=`, `key_source=` and `run=`.

    Also replaces the SDK's re-send on a fresh ("isolated") session after a timeout or a 5xx.
    """


class RetryingMCPServerSse(_RetryingServer, MCPServerSse):
    """`agents.mcp.MCPServerSse` with safe retries: the SDK's arguments plus
    `policy=`, `key_source=` and `run=`."""
