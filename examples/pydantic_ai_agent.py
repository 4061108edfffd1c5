"""A pydantic-ai agent with safe retries: `uv run python examples/pydantic_ai_agent.py`.

`MCPToolset(RetryingClient(...), process_tool_call=keyed_tool_calls)`: tool calls are retried by
mcp-once under a key derived from the run and the model's tool-call id, and a call whose outcome
cannot be known reaches the model as a failed result that says "do not repeat". No LLM is needed
to run this: pydantic-ai's `FunctionModel` plays one (put your model there instead). The chaos
link loses the answer to the first `charge`; the agent still gets the one receipt.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

import anyio
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from orchestrator import RetryPolicy
from orchestrator.chaos import Chaos, Fault, FaultPlan
from orchestrator.fastmcp import RetryingClient, SDKStreamTransport
from orchestrator.pydantic_ai import keyed_tool_calls

SERVER = Path(__file__).with_name("server.py")


def stand_in_model(order: str) -> FunctionModel:
    """Calls `charge` once, then reports what the tool said."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            args = {"order_id": order, "cents": 1200}
            return ModelResponse(parts=[ToolCallPart("charge", args, tool_call_id="call-1")])
        return ModelResponse(parts=[TextPart(f"charged: {messages[-1].parts[0].content}")])

    return FunctionModel(respond)


async def main(store: str) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=[str(SERVER), "--stdio", "--store", store]
    )
    # For the demonstration only: lose the answer to the first `charge`.
    chaos = Chaos(FaultPlan(schedule={1: Fault.LOST_ACK}, tools={"charge"}), seed=1)
    client = RetryingClient(
        SDKStreamTransport(lambda: chaos.wrap(stdio_client(params))),
        policy=RetryPolicy(attempt_timeout=2.0, deadline=30.0),
    )
    order = f"order-{uuid.uuid4().hex[:8]}"
    toolset = MCPToolset(client, process_tool_call=keyed_tool_calls)
    agent = Agent(stand_in_model(order), toolsets=[toolset])
    async with client:  # one connection (one server process) for the run and the check
        result = await agent.run(f"Charge {order} 12.00")
        print(result.output)
        charges = await client.call_tool("list_charges", {"order_id": order})
    print(f"charges for {order}: {len((charges.structured_content or {})['result'])}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="sqlite:///.mcp-once/keys.sqlite3")
    anyio.run(main, parser.parse_args().store)
