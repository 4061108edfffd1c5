"""The worker process of the pydantic-ai × Temporal crash test (`test_temporal_pydantic_ai.py`).

A pydantic-ai agent made durable by `TemporalDurability`: its model requests and its MCP tool
calls run as Temporal activities of this worker, its loop as the workflow `PayWorkflow`. The model
is scripted (`FunctionModel`, no network): it calls the shop's `pay` once, under a tool-call id
it mints at random as a real model does (so the id is stable across a crash only because
Temporal recorded the model's answer), then answers with what the tool returned.

The MCP toolset's hook is `keyed_tool_calls` (`MODE=keyed`) or a plain call with no key of the
run (`MODE=bare`: the same harness without the adapter; `RetryingClient` mints a random key per
call, as any client would), wrapped between the crash points `before` and `after`. Every answer
the client got is appended to `ANSWERS` (one JSON line: key, replayed, text), so the test can
tell a replay (the server's marker in the result's `_meta`) from a fresh run.

Run as a script; the environment (see `crash_kit.worker_env`) names the server, the task queue,
the shop and the crash window. The workflow class lives in `__main__`, which Temporal's sandbox
re-imports: everything the agent needs is imported passed through, and built once, here.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import json
    import os
    import re
    import uuid
    from datetime import timedelta
    from typing import Any

    import anyio
    import mcp.types as mcp_types
    from crash_point import crash_point, standby
    from pydantic_ai import Agent, RunContext
    from pydantic_ai.durable_exec.temporal import (
        AgentPlugin,
        PydanticAIPlugin,
        TemporalDurability,
    )
    from pydantic_ai.mcp import CallToolFunc, MCPToolset, ToolResult
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from temporalio.client import Client
    from temporalio.common import RetryPolicy as TemporalRetry
    from temporalio.worker import Worker
    from temporalio.workflow import ActivityConfig

    from idempotency import wire
    from orchestrator import RetryPolicy
    from orchestrator.fastmcp import RetryingClient
    from orchestrator.pydantic_ai import keyed_tool_calls

#: Heartbeat timeout of the agent's activities: how soon Temporal notices a dead worker and
#: retries its activity elsewhere (pydantic-ai's activities beat every half of it).
HEARTBEAT = timedelta(seconds=1)
PROMPT = re.compile(r"pay (\S+)")


def scripted_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Pay the call id named in the prompt once, then answer with what the tool returned."""
    last = messages[-1]
    assert isinstance(last, ModelRequest)
    for part in last.parts:
        if isinstance(part, ToolReturnPart):
            return ModelResponse(parts=[TextPart(str(part.content))])
    prompt = next(part for part in last.parts if isinstance(part, UserPromptPart))
    match = PROMPT.search(str(prompt.content))
    assert match is not None, prompt.content
    args = {"call_id": match.group(1), "account": "acct", "cents": 100}
    # A real model mints a fresh id per response: only Temporal's history keeps it stable.
    call = ToolCallPart("pay", args, tool_call_id=f"call_{uuid.uuid4().hex}")
    return ModelResponse(parts=[call])


class ObservedClient(RetryingClient):
    """`RetryingClient`, noting each answer's key and the server's replay marker in `ANSWERS`."""

    async def call_tool_mcp(
        self,
        name: str,
        arguments: dict[str, Any],
        progress_handler: Any = None,
        timeout: Any = None,
        meta: dict[str, Any] | None = None,
    ) -> mcp_types.CallToolResult:
        result = await super().call_tool_mcp(name, arguments, progress_handler, timeout, meta)
        record = (result.meta or {}).get(wire.IDEMPOTENCY_META) or {}
        line = {
            "tool": name,
            "replayed": record.get("status") == "replayed",
            # The key the hook sent (None without the adapter: the client minted one).
            "key": (meta or {}).get(wire.KEY_META),
            "text": "".join(
                block.text for block in result.content if isinstance(block, mcp_types.TextContent)
            ),
        }
        note(line)
        return result


def note(line: dict[str, Any]) -> None:
    """Append one answer to `ANSWERS` (one small write, done before anything else happens)."""
    with open(os.environ["ANSWERS"], "a") as out:
        out.write(json.dumps(line) + "\n")


async def keyed(
    ctx: RunContext[Any], call_tool: CallToolFunc, name: str, args: dict[str, Any]
) -> ToolResult:
    """The adapter under test, between the crash points."""
    crash_point("before")
    result = await keyed_tool_calls(ctx, call_tool, name, args)
    crash_point("after")
    return result


async def bare(
    ctx: RunContext[Any], call_tool: CallToolFunc, name: str, args: dict[str, Any]
) -> ToolResult:
    """The same harness without the adapter: no key of the run is sent."""
    crash_point("before")
    result = await call_tool(name, args)
    crash_point("after")
    return result


client = ObservedClient(
    os.environ["SHOP_URL"], policy=RetryPolicy(attempt_timeout=10.0, deadline=30.0)
)
toolset = MCPToolset(
    client, id="shop", process_tool_call=keyed if os.environ["MODE"] == "keyed" else bare
)
agent = Agent(
    FunctionModel(scripted_model),
    name="payer",
    toolsets=[toolset],
    capabilities=[
        TemporalDurability(
            activity_config=ActivityConfig(
                start_to_close_timeout=timedelta(seconds=30),
                heartbeat_timeout=HEARTBEAT,
                retry_policy=TemporalRetry(
                    initial_interval=timedelta(milliseconds=100), maximum_attempts=5
                ),
            )
        )
    ],
)


@workflow.defn
class PayWorkflow:
    @workflow.run
    async def run(self, prompt: str) -> str:
        result = await agent.run(prompt)
        return result.output


async def main() -> None:
    temporal = await Client.connect(os.environ["TEMPORAL_ADDRESS"], plugins=[PydanticAIPlugin()])
    worker = Worker(
        temporal,
        task_queue=os.environ["TASK_QUEUE"],
        workflows=[PayWorkflow],
        plugins=[AgentPlugin(agent)],
        # No workflow cache: every workflow task replays the history from the start, so each
        # step of the run exercises what a restarted worker does (and no sticky queue of a
        # dead worker delays the restarted one).
        max_cached_workflows=0,
    )
    print("worker ready", flush=True)
    await worker.run()


if __name__ == "__main__":
    standby()  # a replacement started early waits here, imports done, until released
    anyio.run(main)
