"""The scenario engine behind the chaos suite, the soak script and `mcp-once demo`.

    report = await run_scenario(Scenario(transport="stdio", calls=300, seed=3), "mcp-once", tmp)
    assert report.ok, report.problems        # duplicates == lost_results == gate_violations == 0
    print(report.summary())

It uses both libraries, which is why it lives above them: `build_server` makes the workload
server with `idempotency` (a payment, a naturally idempotent write, a read, an unguarded
notification), each effect written by the tool itself to a `Ledger`; `run_workload` drives it
through `orchestrator.RetryingSession` ("mcp-once") or a naive tenacity loop ("naive") over an
`Endpoint` (memory, stdio, HTTP; restartable), with the link broken by `orchestrator.chaos`;
`check` reads the ledger and the call reports into a `Report`. `open_replicas` runs several HTTP
replicas on one store behind a balancer that can freeze or kill one of them; `strays` tells
whether what a run left half-done belongs to a struck replica. `run_pipelines` kills an agent
process running a scripted pipeline at seeded points and restarts it until done, with fresh keys
and under `orchestrator.Run` (`_pipeline`, `_pipeline_agent`, `_zygote`).
`python -m mcp_once.scenarios.soak --seeds 50` runs it for longer.
"""

from mcp_once.scenarios._endpoints import (
    Endpoint,
    Era,
    HttpEndpoint,
    MemoryEndpoint,
    ServerProcess,
    StdioEndpoint,
    TransportName,
    server_command,
)
from mcp_once.scenarios._invariants import Report, check
from mcp_once.scenarios._ledger import Effect, Ledger
from mcp_once.scenarios._pipeline import AGENT as PIPELINE_AGENT
from mcp_once.scenarios._pipeline import PipelineTotals, run_pipelines
from mcp_once.scenarios._replicas import Replicas, Strays, open_replicas, strays
from mcp_once.scenarios._shop import ShopEffects, build_server, marks
from mcp_once.scenarios._suite import Scenario, default_plan, open_endpoint, run_scenario
from mcp_once.scenarios._workload import (
    CallRecord,
    CallSpec,
    Mode,
    RunResult,
    connect_factory,
    default_policy,
    plan_calls,
    run_workload,
)
from mcp_once.scenarios._zygote import Zygote

__all__ = [
    "PIPELINE_AGENT",
    "CallRecord",
    "CallSpec",
    "Effect",
    "Endpoint",
    "Era",
    "HttpEndpoint",
    "Ledger",
    "MemoryEndpoint",
    "Mode",
    "PipelineTotals",
    "Replicas",
    "Report",
    "RunResult",
    "Scenario",
    "ServerProcess",
    "ShopEffects",
    "StdioEndpoint",
    "Strays",
    "TransportName",
    "Zygote",
    "build_server",
    "check",
    "connect_factory",
    "default_plan",
    "default_policy",
    "marks",
    "open_endpoint",
    "open_replicas",
    "plan_calls",
    "run_pipelines",
    "run_scenario",
    "run_workload",
    "server_command",
    "strays",
]
