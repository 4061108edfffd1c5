"""The mark a guarded tool function carries: its guard, and what registration learned about it.

`@idempotent` and `install` put a `ToolStamp` on each wrapper they make; the registration hooks
(`sdk.py`) record on it what the author declared, and the listing middleware (`listing.py`) reads
it to tell each caller what holds. Its own module because all of them need it, and `sdk.py`
(which adds the listing middleware to a server) must not be needed by `listing.py` in return.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolResult

from ..._guard.advertise import derivable

if TYPE_CHECKING:
    from ..._guard.guard import Guard


class ToolCalls:
    """What every call of one registered tool hands the guard, worked out once per tool: a
    tool's annotations and what its author declared change only when it is registered."""

    __slots__ = ("annotations", "derivable", "error_result", "takeover", "tool")

    def __init__(
        self, stamp: ToolStamp, tool: Tool, render: Callable[[str, Exception], CallToolResult]
    ) -> None:
        self.tool = tool
        self.annotations = tool.annotations
        self.derivable = stamp.derivable(tool)
        policy = stamp.guard.policy
        self.takeover = policy.takeover_for(stamp.declared.get(tool.name, False))
        self.error_result: Callable[[Exception], CallToolResult] = functools.partial(
            render, tool.name
        )


#: Where a guarded wrapper keeps its `ToolStamp`.
STAMP_ATTR = "__mcp_once__"


@dataclass(slots=True)
class ToolStamp:
    """What a guarded wrapper carries for registration and calls."""

    guard: Guard
    #: The parameter the SDK passes the Context in (the author's, or `sdk.HIDDEN_CONTEXT`).
    context_param: str
    #: True when `context_param` was added by us and must not reach the author's function.
    hidden: bool
    #: Per registered tool name: did the author declare the tool idempotent by itself?
    declared: dict[str, bool] = field(default_factory=dict)
    #: Tool names never merged under a derived key (`install(underived=...)`).
    underived: frozenset[str] = frozenset()
    #: Per registered tool name, its `ToolCalls` (dropped whenever `declare` is called).
    calls: dict[str, ToolCalls] = field(default_factory=dict)

    def declare(self, name: str, idempotent: bool) -> None:
        """Record whether the author declared tool `name` idempotent by itself."""
        self.declared[name] = idempotent
        self.calls.pop(name, None)

    def calls_of(self, tool: Tool, render: Callable[[str, Exception], CallToolResult]) -> ToolCalls:
        """The per-tool constants of `tool`'s calls, `render` making a tool's exception the
        SDK's `isError` result (worked out again if the tool or its annotations were
        replaced)."""
        found = self.calls.get(tool.name)
        if found is None or found.tool is not tool or found.annotations is not tool.annotations:
            found = self.calls[tool.name] = ToolCalls(self, tool, render)
        return found

    def derivable(self, tool: Tool) -> bool:
        """Whether a keyless call of `tool` may be merged under a derived key."""
        return derivable(self.guard.policy, tool.annotations, tool.name in self.underived)


def stamp_of(fn: object) -> ToolStamp | None:
    stamp = getattr(fn, STAMP_ATTR, None)
    return stamp if isinstance(stamp, ToolStamp) else None
