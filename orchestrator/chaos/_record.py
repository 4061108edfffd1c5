"""What was broken: one record per injected fault, free of tool arguments and results."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.chaos._plan import Fault

__all__ = ["FaultRecord", "count_by_kind"]


@dataclass(frozen=True)
class FaultRecord:
    """One injected fault.

    Records of two runs with the same seed and plan compare equal: `time` is left out of
    equality because it is the only field that depends on the machine rather than the plan.
    """

    index: int
    """1-based ordinal of the matching request (across every connection of one `Chaos`)."""
    kind: Fault
    method: str
    request_id: str | int
    """The JSON-RPC id the client gave the request."""
    tool: str | None
    """The tool name for `tools/call`, else None. Arguments are never recorded."""
    connection: int
    """1-based number of the `Chaos.wrap` transport that carried the request."""
    delay_seconds: float | None = None
    """How long a delay fault held the message back; None for other kinds."""
    time: float = field(default=0.0, compare=False)
    """`anyio.current_time()` when the fault was decided (the event loop's monotonic clock)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form for reports."""
        return {
            "index": self.index,
            "kind": self.kind.value,
            "method": self.method,
            "request_id": self.request_id,
            "tool": self.tool,
            "connection": self.connection,
            "delay_seconds": self.delay_seconds,
            "time": self.time,
        }


def count_by_kind(records: Iterable[FaultRecord]) -> dict[Fault, int]:
    """Faults per kind, every kind present (zeros included) so reports line up column by column."""
    counts = dict.fromkeys(Fault, 0)
    for record in records:
        counts[record.kind] += 1
    return counts
