"""The tools/list answer each caller of an `MCPServer` gets for its guarded tools.

A guarded tool's registered definition says what holds for *every* caller. Under the default
`keys="derived"` that is less than a caller the server can tell apart (`caller_of`) actually
gets: its keyless calls are deduplicated, so for it the tool may be listed `idempotentHint: true`
with `keys: "derived"`. A server cannot know in advance over which transport, or with which
credentials, it will be asked, so the listing is decided per tools/list request: this
middleware, added once to each server that holds a guarded tool, upgrades the definitions it
lists for a caller with an identity and leaves the rest as registered.

Being that server's one hook on every message, it also hands each `notifications/cancelled` to
`_guard/answers.py` first (rule 15: a give-up that arrives after the answer was written).
"""

from __future__ import annotations

from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver.tools import ToolManager

from ... import wire
from ..._guard import answers
from ..._guard.advertise import advertise_annotations
from ..._guard.caller import caller_of
from .stamp import stamp_of


class ListingMiddleware:
    """`MCPServer` middleware: per-caller annotations and `_meta` for guarded tools.

    Given the server's tool manager (`sdk.tool_manager`, where the registered tools are looked
    up) rather than the server, so that this module needs nothing from `sdk.py`, which adds it.
    """

    def __init__(self, tools: ToolManager) -> None:
        self._tools = tools

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.method == "notifications/cancelled":
            # Not the listing's, but this is the one hook on every message of a server with a
            # guarded tool: a cancel for an answer already handed out (`answers.py`).
            await answers.cancelled(ctx, ctx.params)
            return await call_next(ctx)
        result = await call_next(ctx)
        if ctx.method != "tools/list" or not isinstance(result, dict):
            return result
        if caller_of(ctx) is None:
            return result  # the registered definitions already say what holds for such a caller
        for entry in result.get("tools") or ():
            name = entry.get("name") if isinstance(entry, dict) else None
            tool = self._tools.get_tool(name) if isinstance(name, str) else None
            stamp = stamp_of(tool.fn) if tool is not None else None
            if tool is None or stamp is None:
                continue
            policy = stamp.guard.policy
            merged = stamp.derivable(tool)  # else keyless calls run as for an unknown caller
            annotations = advertise_annotations(tool.annotations, policy, merged)
            if annotations is not None:
                entry["annotations"] = annotations.model_dump(
                    by_alias=True, mode="json", exclude_none=True
                )
            entry["_meta"] = {
                **(entry.get("_meta") or {}),
                wire.IDEMPOTENCY_META: policy.advertised(merged),
            }
        return result
