"""A durable pydantic-ai agent on Temporal whose MCP charge survives a worker crash.

    temporal server start-dev                      # a Temporal server on localhost:7233
    uv run mcp-once serve-example --port 8000      # the example MCP server (`charge`)
    uv run python examples/pydantic_ai_temporal.py --order o-1 --crash-after-charge   # dies
    uv run python examples/pydantic_ai_temporal.py --order o-1   # resumes: still one charge

(`MCP_URL` names another MCP server; `--temporal` another Temporal server.)

`TemporalDurability` runs the agent's loop as a workflow and its model requests and MCP tool
calls as activities; `keyed_tool_calls` sends each tool call with a key derived from the agent's
run id and the model's tool-call id. Both are stable when Temporal re-runs the activity after a
crash (the run id is drawn from the workflow's deterministic randomness, the tool-call id comes
from the model response Temporal recorded), so the server replays its stored answer instead of
charging again. No LLM is needed: `FunctionModel` plays one (put your model there instead).

Residual windows, by Temporal's design: a reset, Continue-As-New, or starting a workflow id whose
run already closed makes a new run (new run id): its calls get new keys and run again.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import uuid
from datetime import timedelta
from typing import Any

from temporalio import workflow

# The workflow class below lives in this module, which Temporal's sandbox re-imports: pass the
# libraries through instead of importing them afresh per workflow.
with workflow.unsafe.imports_passed_through():
    import anyio
    from fastmcp import Client as FastMCPClient
    from pydantic_ai import Agent, RunContext
    from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin, TemporalDurability
    from pydantic_ai.mcp import CallToolFunc, MCPToolset, ToolResult
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from temporalio.client import Client
    from temporalio.common import WorkflowIDConflictPolicy
    from temporalio.worker import Worker
    from temporalio.workflow import ActivityConfig

    from orchestrator import RetryPolicy
    from orchestrator.fastmcp import RetryingClient
    from orchestrator.pydantic_ai import keyed_tool_calls

URL = os.environ.get("MCP_URL", "http://127.0.0.1:8000/mcp")
TASK_QUEUE = "mcp-once-pydantic-ai"


def stand_in_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Charges the order named in the prompt, then reports what the tool said."""
    if len(messages) == 1:
        order = re.findall(r"Charge (\S+)", str(messages[0].parts[-1].content))[0]
        args = {"order_id": order, "cents": 1200}
        # Like a real model, a fresh tool-call id per response: Temporal records the response.
        call = ToolCallPart("charge", args, tool_call_id=f"call_{uuid.uuid4().hex[:12]}")
        return ModelResponse(parts=[call])
    return ModelResponse(parts=[TextPart(f"charged: {messages[-1].parts[0].content}")])


CRASH_AFTER_CHARGE = False  # set by --crash-after-charge, for the demonstration only


async def charge_keyed(
    ctx: RunContext[Any], call_tool: CallToolFunc, name: str, args: dict[str, Any]
) -> ToolResult:
    """`keyed_tool_calls`, and (for the demonstration) a worker that dies after the answer."""
    result = await keyed_tool_calls(ctx, call_tool, name, args)
    if CRASH_AFTER_CHARGE:
        print("worker killed after the charge, before Temporal recorded it: run me again")
        os._exit(1)  # no cleanup, as a crash: Temporal will run this activity again
    return result


# Built at module level, outside the workflow (pydantic-ai registers its activities from it).
toolset = MCPToolset(
    RetryingClient(URL, policy=RetryPolicy(attempt_timeout=5.0, deadline=30.0)),
    id="shop",  # durable toolsets need a stable id: it names their activities
    process_tool_call=charge_keyed,
)
agent = Agent(
    FunctionModel(stand_in_model),
    name="cashier",
    toolsets=[toolset],
    capabilities=[
        TemporalDurability(
            # A short heartbeat timeout: Temporal notices a dead worker in seconds, not minutes.
            activity_config=ActivityConfig(
                start_to_close_timeout=timedelta(seconds=60), heartbeat_timeout=timedelta(seconds=2)
            )
        )
    ],
)


@workflow.defn
class ChargeWorkflow:
    @workflow.run
    async def run(self, prompt: str) -> str:
        result = await agent.run(prompt)
        return result.output


async def main(address: str, order: str) -> None:
    client = await Client.connect(address, plugins=[PydanticAIPlugin()])
    worker = Worker(
        client,
        task_queue=TASK_QUEUE,
        workflows=[ChargeWorkflow],
        plugins=[AgentPlugin(agent)],
        # After a crash the workflow's next task first waits on the dead worker's sticky queue:
        # keep that short so the restarted worker resumes it at once.
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
    )
    async with worker:
        # One workflow id per order: running the command again attaches to the crashed run.
        handle = await client.start_workflow(
            ChargeWorkflow.run,
            f"Charge {order} 12.00",
            id=f"charge-{order}",
            task_queue=TASK_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        print(await handle.result())
    async with FastMCPClient(URL) as shop:
        charges = await shop.call_tool("list_charges", {"order_id": order})
    print(f"charges for {order}: {len((charges.structured_content or {})['result'])}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--temporal", default="localhost:7233", help="Temporal server address")
    parser.add_argument("--order", default=f"order-{uuid.uuid4().hex[:8]}")
    parser.add_argument("--crash-after-charge", action="store_true")
    options = parser.parse_args()
    CRASH_AFTER_CHARGE = options.crash_after_charge
    anyio.run(main, options.temporal, options.order)
    # Temporal's client leaves Rust threads behind that can abort the interpreter's teardown
    # (SIGABRT, 'PyGILState_Release', temporalio/sdk-python#300; Temporal has no call that
    # stops them): with the output flushed there is nothing left to tear down.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
