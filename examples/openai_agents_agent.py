"""An OpenAI Agents SDK agent with safe retries: `uv run python examples/openai_agents_agent.py`.

`RetryingMCPServerStdio` is the SDK's `MCPServerStdio` (same arguments, plus `policy=`): tool
calls are retried by mcp-once under a key derived from the model's tool-call id, never by the
SDK's blind loop, and a call whose outcome cannot be known reaches the model as an error that
says "do not repeat". No LLM is needed to run this: a scripted `Model` stands in (use your model
instead). The chaos link loses the answer to the first `charge`; the agent still gets one receipt.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
from agents import Agent, RunConfig, Runner
from agents.items import ModelResponse, TResponseStreamEvent
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from orchestrator import RetryPolicy
from orchestrator.chaos import Chaos, Fault, FaultPlan
from orchestrator.openai_agents import RetryingMCPServerStdio

SERVER = Path(__file__).with_name("server.py")


class StandInModel(Model):
    """Calls `charge` once, then reports what the tool said."""

    def __init__(self, order: str) -> None:
        self.order = order

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        outputs = [
            item["output"]
            for item in kwargs.get("input", args[1] if len(args) > 1 else [])
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        if not outputs:
            arguments = json.dumps({"order_id": self.order, "cents": 1500})
            call = ResponseFunctionToolCall(
                type="function_call", call_id="call-1", name="charge", arguments=arguments
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        said = (
            outputs[0] if isinstance(outputs[0], str) else " ".join(p["text"] for p in outputs[0])
        )
        reply = f"charged: {' '.join(said.split())}"
        text = ResponseOutputText(type="output_text", text=reply, annotations=[])
        message = ResponseOutputMessage(
            type="message", id="msg-1", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError


class LosesFirstCharge(RetryingMCPServerStdio):
    """For the demonstration only: the connection loses the answer to the first `charge`."""

    chaos = Chaos(FaultPlan(schedule={1: Fault.LOST_ACK}, tools={"charge"}), seed=1)

    def create_streams(self) -> AbstractAsyncContextManager[Any]:
        return self.chaos.wrap(super().create_streams())


async def main(store: str) -> None:
    order = f"order-{uuid.uuid4().hex[:8]}"
    params = {"command": sys.executable, "args": [str(SERVER), "--stdio", "--store", store]}
    # In your code: RetryingMCPServerStdio(params, ...) or RetryingMCPServerStreamableHttp(...).
    async with LosesFirstCharge(
        params, client_session_timeout_seconds=2.0, policy=RetryPolicy(deadline=30.0)
    ) as server:
        agent = Agent(name="shop", mcp_servers=[server], model=StandInModel(order))
        result = await Runner.run(
            agent, f"Charge {order}", run_config=RunConfig(tracing_disabled=True)
        )
        print(result.final_output)
        charges = await server.call_tool("list_charges", {"order_id": order})
        print(f"charges for {order}: {len((charges.structured_content or {})['result'])}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="sqlite:///.mcp-once/keys.sqlite3")
    anyio.run(main, parser.parse_args().store)
