"""Fault injection for MCP client transports: lost acks, drops, delays, duplicates, dead links.

    chaos = Chaos(FaultPlan(lost_ack=0.2, schedule={3: Fault.CLOSE_AFTER_WRITE}), seed=7)
    async with Client(chaos.wrap(transport)) as client:
        ...
    chaos.faults, chaos.fault_counts(), chaos.report()

A test tool: it sits between a client session and any SDK transport (stdio, streamable HTTP,
in-memory) and breaks the requests a seeded plan picks, recording each fault without tool
arguments or results, so a run replays exactly from its seed and plan. It needs no server of
ours: point it at your own. The scenario engine built on it (the shop server, the effect ledger,
the invariant checker, the soak) uses the server library too, so it lives above both libraries,
in `mcp_once.scenarios`.
"""

from orchestrator.chaos._chaos import Chaos, ChaosTransport
from orchestrator.chaos._memory import in_memory_transport
from orchestrator.chaos._plan import Fault, FaultPlan
from orchestrator.chaos._record import FaultRecord

__all__ = [
    "Chaos",
    "ChaosTransport",
    "Fault",
    "FaultPlan",
    "FaultRecord",
    "in_memory_transport",
]
