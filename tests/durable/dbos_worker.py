"""The worker process of the DBOS crash tests (`test_dbos_crash.py`): one DBOS workflow that
pays once through the shop, dying in the test's crash window (`crash_point`).

    python dbos_worker.py session|agent

`session`: a `@DBOS.step` calls `pay` through `RetryingSession(client, key_source=step_key)`.
`agent`: a pydantic-ai agent under `DBOSDurability` (a scripted `FunctionModel`) calls `pay`
through `MCPToolset(RetryingClient(url), process_tool_call=keyed_tool_calls)`, whose tool calls
DBOSDurability runs as DBOS steps.
With `MCP_ONCE_ADAPTER=0` the same worker runs without the adapter (no `key_source`, no
`keyed_tool_calls`): each run mints its own key, which is what the tests show duplicates with.

The first worker starts the workflow under a fixed id. A restarted worker (the crash mark
exists) does not start anything: `DBOS.launch()` recovers the pending workflow (same
`executor_id`, the pinned `application_version`), and the worker only waits for its result.
With `MCP_ONCE_AGAIN=1` it then starts the finished workflow id again (`SetWorkflowID`). The
results go to `MCP_ONCE_OUT` (JSON: `recovered`, and `again`); every execution of the paying
code appends lines to `MCP_ONCE_STEPS` (see `log_step`). Each leg imports only what it uses:
worker start-up is most of these tests' cost.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types
from crash_point import crash_point, crashed
from dbos import DBOS, SetWorkflowID

from idempotency import wire
from orchestrator import RetryPolicy

URL = os.environ["MCP_ONCE_SHOP_URL"]
CALL_ID = os.environ["MCP_ONCE_CALL_ID"]
WORKFLOW_ID = os.environ["MCP_ONCE_WORKFLOW_ID"]
ADAPTER = os.environ.get("MCP_ONCE_ADAPTER", "1") == "1"
STEPS = Path(os.environ["MCP_ONCE_STEPS"])
OUT = Path(os.environ["MCP_ONCE_OUT"])
#: Longer than the shop's hold: a re-run that finds the first run's claim waits it out.
POLICY = RetryPolicy(max_attempts=5, attempt_timeout=10.0, deadline=40.0)
PAY = {"call_id": CALL_ID, "account": "acct", "cents": 100}

Workflow = Callable[[], Awaitable[str]]


def log_step(event: str, replayed: bool | None = None) -> None:
    """Two lines per execution of the paying code, at its start and after the call returned:
    what recovery re-ran, under which ids, and whether the server replayed."""
    line = {
        "event": event,
        "pid": os.getpid(),
        "workflow_id": DBOS.workflow_id,
        "step_id": DBOS.step_id,
        "replayed": replayed,
        "at": time.time(),
    }
    with STEPS.open("a") as out:
        out.write(json.dumps(line) + "\n")


def replayed(result: mcp_types.CallToolResult) -> bool:
    """The server's replay marker (`idempotency.wire`) in the result's `_meta`."""
    record = (result.meta or {}).get(wire.IDEMPOTENCY_META)
    return isinstance(record, dict) and record.get("status") == "replayed"


def session_leg() -> Workflow:
    """A DBOS step calling through `RetryingSession(client, key_source=step_key)`."""
    from mcp import Client

    from orchestrator import RetryingSession, streamable_http_transport
    from orchestrator.dbos import step_key

    @DBOS.step()
    async def pay_step() -> str:
        log_step("start")
        async with Client(streamable_http_transport(URL)) as client:
            source = step_key if ADAPTER else None
            session = RetryingSession(client, policy=POLICY, key_source=source)
            crash_point("before")
            result = await session.call_tool("pay", PAY)
            crash_point("after")
        log_step("end", replayed(result))
        text = result.content[0]
        assert isinstance(text, mcp_types.TextContent)
        return text.text

    @DBOS.workflow()
    async def pay_workflow() -> str:
        return await pay_step()

    return pay_workflow


def agent_leg() -> Workflow:
    """pydantic-ai's `DBOSDurability`, the MCP toolset's `process_tool_call` `keyed_tool_calls`."""
    from pydantic_ai import Agent, RunContext
    from pydantic_ai.durable_exec.dbos import DBOSDurability
    from pydantic_ai.mcp import CallToolFunc, MCPToolset, ToolResult
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from orchestrator.fastmcp import RetryingClient
    from orchestrator.pydantic_ai import keyed_tool_calls

    class ShopClient(RetryingClient):
        """`RetryingClient`, noting whether the server replayed (pydantic-ai's mapping of the
        result for the model drops `_meta`)."""

        last_replayed = False

        async def call_tool_mcp(self, *args: Any, **kwargs: Any) -> mcp_types.CallToolResult:
            result = await super().call_tool_mcp(*args, **kwargs)
            ShopClient.last_replayed = replayed(result)
            return result

    async def pay_hook(
        ctx: RunContext[Any], call_tool: CallToolFunc, name: str, args: dict[str, Any]
    ) -> ToolResult:
        """The toolset's `process_tool_call`, inside the DBOS step DBOSDurability runs it in:
        `keyed_tool_calls` (or a plain call without the adapter) between the crash points."""
        log_step("start")
        crash_point("before")
        if ADAPTER:
            result = await keyed_tool_calls(ctx, call_tool, name, args)
        else:
            result = await call_tool(name, args)
        crash_point("after")
        log_step("end", ShopClient.last_replayed)
        return result

    def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        """The model: pay once, then answer with what the tool returned."""
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("pay", PAY, tool_call_id="call-pay")])
        return ModelResponse(parts=[TextPart(str(messages[-1].parts[0].content))])

    toolset: MCPToolset[None] = MCPToolset(
        ShopClient(URL, policy=POLICY), id="shop", process_tool_call=pay_hook
    )
    agent = Agent(
        FunctionModel(scripted), name="payer", toolsets=[toolset], capabilities=[DBOSDurability()]
    )

    @DBOS.workflow()
    async def agent_workflow() -> str:
        return (await agent.run("pay")).output

    return agent_workflow


async def main(workflow: Workflow) -> dict[str, Any]:
    if crashed():
        # Recovered by DBOS.launch(): the worker only waits for the outcome.
        handle = await DBOS.retrieve_workflow_async(WORKFLOW_ID)
    else:
        with SetWorkflowID(WORKFLOW_ID):
            handle = await DBOS.start_workflow_async(workflow)
    # A bounded poll of DBOS's own record (the recovery runs in DBOS's threads).
    outcome: dict[str, Any] = {"recovered": await handle.get_result(polling_interval_sec=0.1)}
    if os.environ.get("MCP_ONCE_AGAIN") == "1":
        with SetWorkflowID(WORKFLOW_ID):
            again = await DBOS.start_workflow_async(workflow)
        outcome["again"] = await again.get_result(polling_interval_sec=0.1)
    return outcome


if __name__ == "__main__":
    workflow = {"session": session_leg, "agent": agent_leg}[sys.argv[1]]()
    DBOS(
        config={
            "name": "mcp-once-crash",
            "system_database_url": f"sqlite:///{os.environ['MCP_ONCE_DBOS_DB']}",
            # Pinned: launch() recovers only workflows of its own application version.
            "application_version": "crash-test-1",
        }
    )
    DBOS.launch()
    try:
        OUT.write_text(json.dumps(anyio.run(main, workflow)))
    finally:
        DBOS.destroy()
