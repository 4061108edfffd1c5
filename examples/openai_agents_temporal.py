"""An OpenAI Agents SDK agent on Temporal whose MCP tool calls run once, even across a crash.

    temporal server start-dev        # or any Temporal server
    uv run --project tests/envs/openai-agents-temporal python examples/openai_agents_temporal.py

Needs `temporalio[openai-agents]` (its plugin, `temporalio.contrib.openai_agents`, pins
openai-agents 0.22) beside `mcp-once[openai-agents]`, which allows 0.22 to 0.24.

Why a resolver in the workflow: Temporal runs each MCP call as an activity, and re-runs it when
the worker dies before reporting it, *after* the server may have charged. Only the workflow knows
the model's tool-call id, so only a workflow-side `tool_meta_resolver` can give the call a key
that the re-run repeats: `temporal_tool_meta` derives it from the workflow run and that id.
The worker's `RetryingMCPServerStdio` sends it, and the guarded server replays the stored answer
to the re-run instead of charging again. No LLM is needed to run this: `ScriptedModel` stands in
(the plugin runs it as an activity, like a real model).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

# The plugin lets `agents` through the workflow sandbox. Pass mcp-once through as well: its
# package imports anyio, which the sandbox cannot import afresh. (The resolver itself is safe in
# workflow code: no I/O, clock or randomness.)
from agents import Agent, Runner
from temporalio import workflow
from temporalio.client import Client
from temporalio.contrib.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
from temporalio.contrib.openai_agents.workflow import temporal_mcp_server
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from agents import ModelProvider
    from agents.items import ModelResponse, TResponseStreamEvent
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    from orchestrator.openai_agents import RetryingMCPServerStdio, temporal_tool_meta

SERVER = Path(__file__).with_name("server.py")


@workflow.defn
class ChargeAgent:
    """The agent run, as workflow code: everything here must be deterministic."""

    @workflow.run
    async def run(self, task: str) -> str:
        # The server's calls run as activities on the worker (the factory named "shop" below);
        # the resolver runs here, where the tool-call id is known.
        shop = temporal_mcp_server("shop", tool_meta_resolver=temporal_tool_meta)
        agent = Agent(name="shop", instructions="Charge the order.", mcp_servers=[shop])
        result = await Runner.run(agent, task)
        return str(result.final_output)


class ScriptedModel(Model):
    """Stands in for an LLM: calls the tool the task names (`{"tool": ..., "arguments": ...}`)
    under a fixed tool-call id, then answers with what the tool said. Stateless: a worker that
    picks the run up after a crash answers the same."""

    def __init__(self, tool_call_id: str = "call-1") -> None:
        self.tool_call_id = tool_call_id

    @classmethod
    def provider(cls, tool_call_id: str = "call-1") -> ModelProvider:
        model = cls(tool_call_id)

        class Provider(ModelProvider):
            def get_model(self, model_name: str | None) -> Model:
                return model

        return Provider()

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        items = kwargs.get("input", args[1] if len(args) > 1 else [])
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items
        said = [
            item["output"]
            for item in items
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        if not said:
            task = json.loads(next(item["content"] for item in items if item.get("role") == "user"))
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id=self.tool_call_id,
                name=task["tool"],
                arguments=json.dumps(task["arguments"]),
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        output = said[0] if isinstance(said[0], str) else " ".join(p["text"] for p in said[0])
        reply = f"charged: {' '.join(output.split())}"
        text = ResponseOutputText(type="output_text", text=reply, annotations=[])
        message = ResponseOutputMessage(
            type="message", id="msg-1", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError


async def main(address: str, store: str) -> None:
    order = f"order-{uuid.uuid4().hex[:8]}"
    params = {"command": sys.executable, "args": [str(SERVER), "--stdio", "--store", store]}
    plugin = OpenAIAgentsPlugin(
        model_params=ModelActivityParameters(start_to_close_timeout=timedelta(seconds=30)),
        model_provider=ScriptedModel.provider(),  # in your code: leave out (OpenAI's models)
        # The worker side: the server each MCP activity calls (mcp-once's drop-in for the SDK's).
        mcp_servers={"shop": lambda: RetryingMCPServerStdio(params, name="shop")},
    )
    client = await Client.connect(address, plugins=[plugin])
    queue = f"charge-{order}"
    async with Worker(client, task_queue=queue, workflows=[ChargeAgent]):
        task = json.dumps({"tool": "charge", "arguments": {"order_id": order, "cents": 1500}})
        print(await client.execute_workflow(ChargeAgent.run, task, id=order, task_queue=queue))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--temporal", default="127.0.0.1:7233", help="the Temporal server")
    parser.add_argument("--store", default="sqlite:///.mcp-once/keys.sqlite3")
    args = parser.parse_args()
    asyncio.run(main(args.temporal, args.store))
    # Temporal's client leaves Rust threads behind that can abort the interpreter's teardown
    # (SIGABRT, 'PyGILState_Release', temporalio/sdk-python#300; Temporal has no call that
    # stops them): with the output flushed there is nothing left to tear down.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
