"""pydantic-ai: tool-call ids become idempotency keys, and a lost outcome is told, not retried.

    client = RetryingClient(url, policy=RetryPolicy())
    toolset = MCPToolset(client, process_tool_call=keyed_tool_calls)

`RetryingClient` (in `orchestrator.fastmcp`) retries one call safely. What it cannot know is which
calls are the same *logical* call: pydantic-ai does not hand the client its run context. This
hook, which `MCPToolset` calls with it, fills that gap and the other one:

- Key: derived from the run id, the tool-call id and the tool name. A model that re-issues a call
  under the same tool-call id (or a durable run re-executed with the same run id) sends the same
  key, so a guarded server replays instead of running the tool again. A call under a *new*
  tool-call id is a new logical call with a new key: the server runs it again. That is what a
  model deciding to "try again" means, and why the model must not be invited to.
- Outcome: `OutcomeUnknown` (the tool may have run; retrying was not safe) becomes `ToolFailed`,
  which pydantic-ai shows the model as a failed result without asking it to retry, with a text
  that says "do not repeat". `NotExecuted` (nothing ran) becomes `ModelRetry`: calling again is
  safe. Without this hook, `OutcomeUnknown` propagates out of the agent run.

A key the model fills: a tool whose listing names a key argument (`keyArgument`, a server's
`key_argument=`) asks the model for a key, to reuse when it retries the same action. That retry
is a new tool call with a new tool-call id, so only the model's key can say "the same action":
the model's key is the call's key, and the hook's (tool-call id, key source) gives way to it
instead of being refused as a disagreeing key. Without one from the model, the hook's key goes in
the argument as well as in `_meta` (`RetryingClient` does both). The hook marks its key as its
own for the client (`adapter_key`, nothing on the wire), so this needs the `RetryingClient`; over
a plain `fastmcp.Client` the server sees two keys and refuses the call (-32602).

To take keys from where the call runs instead (a durable engine's step, see `KeySource`), use
`process_tool_call=keyed_tool_calls_with(key_source)`: the source is asked first, and the
tool-call-id key is the fallback when it answers None. (`RetryingClient(key_source=...)` alone
does not do it under `keyed_tool_calls`: the hook puts its key in the call's `meta`, and a key
already in `meta` takes precedence over the client's source.)

Under DBOS (`DBOSDurability`, `pydantic-ai-slim[dbos]`) the same `keyed_tool_calls` is the
recipe, nothing more: each MCP call runs in a DBOS step of its own, and when `DBOS.launch()`
recovers a workflow whose worker died in that step, the step runs again with the same key. Both
parts of the key survive the crash: the default `run_id` is `<workflow id>:<step position>`
(replay-stable, not random), and the `tool_call_id` comes from the model response DBOS recorded
(the model is not asked again). Shown by `tests/durable/test_dbos_crash.py` (the `agent` leg)
and `examples/pydantic_ai_dbos.py`. Pass no per-process `run_id=` of your own to `agent.run`:
it would change the key on recovery.

To journal an agent run so that a restarted process resends what it had sent under the same keys
(`orchestrator.Run`), use `process_tool_call=keyed_tool_calls_with(run=run)` over a
`RetryingClient` (with or without its own `run=`): the hook sends no key of its own and places
each call at its index among the tool calls of the model response that asked for it, so the
calls of one response keep their positions whatever order they finish in; the run's journal
keys them.

Needs the `pydantic-ai` extra (`pip install "mcp-once[pydantic-ai]"`).
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import ModelRetry, RunContext, ToolFailed
from pydantic_ai.mcp import CallToolFunc, ProcessToolCallback, ToolResult
from pydantic_ai.messages import ModelResponse, ToolCallPart

from idempotency import wire

from ._integration import tell_model
from ._key import KeySource, adapter_key, derive_key, key_from_source
from ._outcome import NotExecuted, OutcomeUnknown
from ._run import Run, Turn

__all__ = [
    "KEY_SOURCE",
    "keyed_tool_calls",
    "keyed_tool_calls_with",
    "response_turn",
    "tool_call_key",
]

#: The prefix of keys derived from pydantic-ai's run and tool-call ids.
KEY_SOURCE = "pydantic-ai"


def tool_call_key(ctx: RunContext[Any], name: str) -> str | None:
    """The idempotency key of this tool call, or None when the run gives no tool-call id.

    For a `process_tool_call` hook of your own: pass it as
    `metadata={"io.github.mcp-once/idempotency-key": key}`.
    """
    if ctx.tool_call_id is None:
        return None
    return derive_key(KEY_SOURCE, ctx.run_id or "", ctx.tool_call_id, name)


async def keyed_tool_calls(
    ctx: RunContext[Any], call_tool: CallToolFunc, name: str, args: dict[str, Any]
) -> ToolResult:
    """`MCPToolset(process_tool_call=...)`: send the derived key, tell the model the outcome."""
    return await _keyed_call(ctx, call_tool, name, args, tool_call_key(ctx, name))


def keyed_tool_calls_with(
    key_source: KeySource | None = None, *, run: Run | None = None
) -> ProcessToolCallback:
    """`keyed_tool_calls`, with the key taken from `run`'s journal or from `key_source`.

    `MCPToolset(client, process_tool_call=keyed_tool_calls_with(step_keys))`: each call's key is
    the source's answer (asked once per call, in the calling task, so `key_step` ordinals apply),
    else the tool-call-id key of `tool_call_key`, else a fresh one. What the source raises
    propagates and a bad key is refused, before anything is sent.

    `keyed_tool_calls_with(run=run)` (the client must be a `RetryingClient`): the run keys every
    call (it comes before `key_source`, which is then not asked), at the call's index among the
    tool calls of its model response (`response_turn`); see the module doc.
    """
    if key_source is None and run is None:
        raise TypeError("keyed_tool_calls_with needs a key_source, a run, or both")
    if key_source is not None and not callable(key_source):
        raise TypeError("key_source must be a callable taking a KeyRequest")
    if run is not None and not isinstance(run, Run):
        raise TypeError(f"run must be an orchestrator.Run, not {type(run).__name__}")

    async def keyed(
        ctx: RunContext[Any], call_tool: CallToolFunc, name: str, args: dict[str, Any]
    ) -> ToolResult:
        if run is not None:
            placed = response_turn(run, ctx)
            if placed is None:
                return await _keyed_call(ctx, call_tool, name, args, None)
            turn, index = placed
            with turn.call(index):
                return await _keyed_call(ctx, call_tool, name, args, None)
        assert key_source is not None
        key = key_from_source(key_source, name, args)
        if key is None:
            key = tool_call_key(ctx, name)
        return await _keyed_call(ctx, call_tool, name, args, key)

    return keyed


def response_turn(run: Run, ctx: RunContext[Any]) -> tuple[Turn, int] | None:
    """The turn of the model response that asked for this tool call, and the call's index among
    its tool calls; None when the run context does not show the response (the call then takes
    the run's next position when it is made).

    The response is named by its place in the message history, the same on every run of a
    deterministic pipeline; its tool calls are counted all, MCP or not, so the index is the
    call's place in what the model wrote.
    """
    if ctx.tool_call_id is None:
        return None
    for number, message in enumerate(ctx.messages):
        if not isinstance(message, ModelResponse):
            continue
        calls = [part for part in message.parts if isinstance(part, ToolCallPart)]
        for index, part in enumerate(calls):
            if part.tool_call_id == ctx.tool_call_id:
                return run.turn_of(("pydantic-ai", number), len(calls)), index
    return None


async def _keyed_call(
    ctx: RunContext[Any],
    call_tool: CallToolFunc,
    name: str,
    args: dict[str, Any],
    key: str | None,
) -> ToolResult:
    try:
        with adapter_key(key):  # gives way to a key the model put in the key argument
            return await call_tool(name, args, metadata={wire.KEY_META: key} if key else None)
    except OutcomeUnknown as unknown:
        raise ToolFailed(tell_model(unknown)) from unknown
    except NotExecuted as not_run:
        raise ModelRetry(tell_model(not_run)) from not_run
