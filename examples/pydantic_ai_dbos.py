"""A durable pydantic-ai agent (DBOS) whose tool call charges once even if the process dies:
`uv run python examples/pydantic_ai_dbos.py --crash`, then the same without `--crash`.

The recipe is one line: `MCPToolset(RetryingClient(...), process_tool_call=keyed_tool_calls)`, as
without DBOS. Under `DBOSDurability` the model's responses are recorded DBOS steps and each MCP
call runs in a step of its own. The first run charges, then dies before DBOS records the tool
step. The second run's `DBOS.launch()` recovers the workflow: the model's response (and so its
`tool_call_id`) comes back from DBOS's record, the run id is replay-stable, so `keyed_tool_calls`
sends the first run's key and the server replays the first receipt instead of charging twice.

No LLM is needed: pydantic-ai's `FunctionModel` plays one. DBOS keeps its state in a SQLite file;
the MCP server is `examples/server.py --stdio` with its own SQLite key store.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import anyio
from dbos import DBOS, SetWorkflowID
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client
from pydantic_ai import Agent, RunContext
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.mcp import CallToolFunc, MCPToolset, ToolResult
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from orchestrator.fastmcp import RetryingClient, SDKStreamTransport
from orchestrator.pydantic_ai import keyed_tool_calls

SERVER = Path(__file__).with_name("server.py")
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--order", default="order-1")
parser.add_argument(
    "--crash", action="store_true", help="die after the charge, before DBOS records it"
)
parser.add_argument("--store", default="sqlite:///.mcp-once/keys.sqlite3")
parser.add_argument("--dbos", default="sqlite:///.mcp-once/dbos.sqlite3")
args = parser.parse_args()


def stand_in_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Calls `charge` once, then reports what the tool said."""
    if len(messages) == 1:
        call = {"order_id": args.order, "cents": 1200}
        return ModelResponse(parts=[ToolCallPart("charge", call, tool_call_id="call-1")])
    return ModelResponse(parts=[TextPart(f"charged: {messages[-1].parts[0].content}")])


async def crash_after_the_charge(
    ctx: RunContext[Any], call_tool: CallToolFunc, name: str, args_: dict[str, Any]
) -> ToolResult:
    """For the demonstration only: the recipe, then death before DBOS records the step."""
    result = await keyed_tool_calls(ctx, call_tool, name, args_)
    print(f"charged, then the process dies: {result}")
    os._exit(3)


params = StdioServerParameters(
    command=sys.executable, args=[str(SERVER), "--stdio", "--store", args.store]
)
toolset: MCPToolset[None] = MCPToolset(
    RetryingClient(SDKStreamTransport(lambda: stdio_client(params))),
    id="shop",  # names the toolset's DBOS steps
    process_tool_call=crash_after_the_charge if args.crash else keyed_tool_calls,
)
agent = Agent(
    FunctionModel(stand_in_model),
    name="cashier",  # names the agent's DBOS steps
    toolsets=[toolset],
    capabilities=[DBOSDurability()],
)


@DBOS.workflow()
async def checkout(prompt: str) -> str:
    return (await agent.run(prompt)).output


async def main() -> None:
    workflow_id = f"agent-checkout-{args.order}"
    if await DBOS.get_workflow_status_async(workflow_id) is not None:
        # Started before: DBOS.launch() has resumed it if it was interrupted. Wait for it.
        handle = await DBOS.retrieve_workflow_async(workflow_id)
    else:
        with SetWorkflowID(workflow_id):
            handle = await DBOS.start_workflow_async(checkout, f"Charge {args.order} 12.00")
    print(await handle.get_result())


if __name__ == "__main__":
    Path(".mcp-once").mkdir(exist_ok=True)
    DBOS(
        config={
            "name": "mcp-once-agent-example",
            "system_database_url": args.dbos,
            # Pinned: recovery after a code fix needs the crashed workflows' version.
            "application_version": "1",
        }
    )
    DBOS.launch()  # recovers this executor's pending workflows of application version "1"
    try:
        anyio.run(main)
    finally:
        DBOS.destroy()
