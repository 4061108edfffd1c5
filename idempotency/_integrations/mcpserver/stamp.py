"""The mark a guarded tool function carries: its guard, and what registration learned about it.

`@idempotent` and `install` put a `ToolStamp` on each wrapper they make; the registration hooks
(`sdk.py`) record on it what the author declared, and the listing middleware (`listing.py`) reads
it to tell each caller what holds. Its own module because all of them need it, and `sdk.py`
(which adds the listing middleware to a server) must not be needed by `listing.py` in return.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mcp.server.mcpserver.tools import Tool

from ..._guard.advertise import derivable

if TYPE_CHECKING:
    from ..._guard.guard import Guard

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

    def derivable(self, tool: Tool) -> bool:
        """Whether a keyless call of `tool` may be merged under a derived key."""
        return derivable(self.guard.policy, tool.annotations, tool.name in self.underived)


def stamp_of(fn: object) -> ToolStamp | None:
    stamp = getattr(fn, STAMP_ATTR, None)
    return stamp if isinstance(stamp, ToolStamp) else None
