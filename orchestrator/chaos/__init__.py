"""Fault injection for MCP client transports: lost acks, drops, delays, duplicates, dead links.

    chaos = Chaos(FaultPlan(lost_ack=0.2, schedule={3: Fault.CLOSE_AFTER_WRITE}), seed=7)
    async with Client(chaos.wrap(transport)) as client:
        ...
    chaos.faults, chaos.fault_counts(), chaos.report()

A test tool: it sits between a client session and any SDK transport (stdio, streamable HTTP,
in-memory) and breaks the requests a seeded plan picks, recording each fault without tool
arguments or results, so a run replays exactly from its seed and plan.

On top of it, the engine behind the chaos suite, the soak script and `mcp-once demo`:

    report = await run_scenario(Scenario(transport="stdio", calls=300, seed=3), "mcp-once", tmp)
    assert report.ok, report.problems        # duplicates == lost_results == gate_violations == 0
    print(report.summary())

`build_server` makes the workload server (a payment, a naturally idempotent write, a read, an
unguarded notification), each effect written by the tool itself to a `Ledger`; `run_workload`
drives it through `RetryingSession` ("mcp-once") or a naive tenacity loop ("naive") over an
`Endpoint` (memory, stdio, HTTP; restartable); `check` reads the ledger and the call reports
into a `Report`. `python -m orchestrator.chaos.soak --seeds 50` runs it for longer.
"""

from orchestrator.chaos._chaos import Chaos
from orchestrator.chaos._endpoints import (
    Endpoint,
    Era,
    HttpEndpoint,
    MemoryEndpoint,
    ServerProcess,
    StdioEndpoint,
    TransportName,
    server_command,
)
from orchestrator.chaos._invariants import Report, check
from orchestrator.chaos._ledger import Effect, Ledger
from orchestrator.chaos._memory import in_memory_transport
from orchestrator.chaos._plan import Fault, FaultPlan
from orchestrator.chaos._record import FaultRecord
from orchestrator.chaos._shop import build_server
from orchestrator.chaos._suite import Scenario, default_plan, open_endpoint, run_scenario
from orchestrator.chaos._transport import ChaosTransport
from orchestrator.chaos._workload import (
    CallRecord,
    CallSpec,
    Mode,
    RunResult,
    connect_factory,
    default_policy,
    plan_calls,
    run_workload,
)

__all__ = [
    "CallRecord",
    "CallSpec",
    "Chaos",
    "ChaosTransport",
    "Effect",
    "Endpoint",
    "Era",
    "Fault",
    "FaultPlan",
    "FaultRecord",
    "HttpEndpoint",
    "Ledger",
    "MemoryEndpoint",
    "Mode",
    "Report",
    "RunResult",
    "Scenario",
    "ServerProcess",
    "StdioEndpoint",
    "TransportName",
    "build_server",
    "check",
    "connect_factory",
    "default_plan",
    "default_policy",
    "in_memory_transport",
    "open_endpoint",
    "plan_calls",
    "run_scenario",
    "run_workload",
    "server_command",
]
