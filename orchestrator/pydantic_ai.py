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

Needs the `pydantic-ai` extra (`pip install "mcp-once[pydantic-ai]"`).
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import ModelRetry, RunContext, ToolFailed
from pydantic_ai.mcp import CallToolFunc, ToolResult

from idempotency import wire

from ._integration import tell_model
from ._key import derive_key
from ._outcome import NotExecuted, OutcomeUnknown

__all__ = ["KEY_SOURCE", "keyed_tool_calls", "tool_call_key"]

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
    key = tool_call_key(ctx, name)
    try:
        return await call_tool(name, args, metadata={wire.KEY_META: key} if key else None)
    except OutcomeUnknown as unknown:
        raise ToolFailed(tell_model(unknown)) from unknown
    except NotExecuted as not_run:
        raise ModelRetry(tell_model(not_run)) from not_run
