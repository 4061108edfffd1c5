"""The worker process of the "OpenAI Agents x Temporal" crash test (#22).

A Temporal worker with `temporalio.contrib.openai_agents`' plugin: the workflow runs an Agents
SDK agent whose model is scripted (`ScriptedModel`, run by the plugin as an activity, here on the
worker: no network) and whose MCP server is `temporal_mcp_server("shop")`, each call an activity
on this worker through the plugin's `mcp_servers={"shop": ...}` factory. The seam of the crash
points is that factory's server (`CrashingShop`): the activity calls its `call_tool`, so
`crash_point("before")` dies before the request is sent and `crash_point("after")` after the
server answered and before the activity reports it to Temporal.

Keyed runs (`Order.keyed`) pass `temporal_tool_meta` as the workflow-side `tool_meta_resolver`;
the baseline passes none, so the worker-side `RetryingMCPServerStreamableHttp` mints a fresh key
per activity attempt (what mcp-once alone, without the workflow's identity, can do).

Every answer the worker got from the server is appended to `--calls` (JSON lines: the replay
marker's `status` and `key`, and the text), so the test sees what a re-run was told.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

# The plugin passes `agents`, `openai`, `mcp` and `mcp_types` through the workflow sandbox;
# mcp-once must be passed through too (its package imports anyio, which the sandbox cannot
# re-import), as the example and the module doc say.
from agents import Agent, Runner
from temporalio import workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.contrib.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
from temporalio.contrib.openai_agents.workflow import temporal_mcp_server
from temporalio.worker import Worker
from temporalio.workflow import ActivityConfig

with workflow.unsafe.imports_passed_through():
    from crash_point import crash_point
    from mcp_types import CallToolResult
    from openai_agents_temporal import ScriptedModel

    from idempotency import wire
    from orchestrator.openai_agents import RetryingMCPServerStreamableHttp, temporal_tool_meta

#: One MCP activity attempt: longer than the shop's hold (1.5 s), short enough that a crashed
#: attempt's re-run starts soon (Temporal learns of the crash by this timeout only).
ATTEMPT = timedelta(seconds=3)
TOOL_CALL_ID = "call-pay-1"


@dataclass
class Order:
    call_id: str
    keyed: bool


@workflow.defn
class PayAgent:
    """One agent run: the model calls `pay` once, then answers with what the tool said."""

    @workflow.run
    async def run(self, order: Order) -> str:
        shop = temporal_mcp_server(
            "shop",
            activity_config=ActivityConfig(
                start_to_close_timeout=ATTEMPT,
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(milliseconds=100), backoff_coefficient=1.0
                ),
            ),
            tool_meta_resolver=temporal_tool_meta if order.keyed else None,
        )
        agent = Agent(name="payer", instructions="Pay the order.", mcp_servers=[shop])
        pay = {"call_id": order.call_id, "account": "acme", "cents": 500}
        result = await Runner.run(agent, json.dumps({"tool": "pay", "arguments": pay}))
        return str(result.final_output)


class CrashingShop(RetryingMCPServerStreamableHttp):
    """The worker's server for the shop: dies at the crash points around the request, and
    journals every answer (to the file in `calls`)."""

    calls: Path

    async def call_tool(
        self, tool_name: str, arguments: dict[str, Any] | None, meta: dict[str, Any] | None = None
    ) -> CallToolResult:
        crash_point("before")
        result = await super().call_tool(tool_name, arguments, meta)
        marker = (result.meta or {}).get(wire.IDEMPOTENCY_META) or {}
        text = " ".join(part.text for part in result.content if part.type == "text")
        line = {"status": marker.get("status"), "key": marker.get("key"), "text": text}
        with self.calls.open("a") as journal:
            journal.write(json.dumps(line) + "\n")
        crash_point("after")
        return result


def standby(go: Path) -> None:
    """Wait, imports done, until the test says the crashed worker is dead (it writes `go`)."""
    deadline = time.monotonic() + 60
    while not go.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"never told to take over ({go})")
        # Another process writes the file: a bounded poll is the only signal.
        time.sleep(0.02)


async def main(address: str, task_queue: str, shop_url: str, calls: Path) -> None:
    def shop() -> CrashingShop:
        server = CrashingShop({"url": shop_url}, name="shop", client_session_timeout_seconds=5)
        server.calls = calls
        return server

    plugin = OpenAIAgentsPlugin(
        model_params=ModelActivityParameters(start_to_close_timeout=timedelta(seconds=10)),
        model_provider=ScriptedModel.provider(tool_call_id=TOOL_CALL_ID),
        mcp_servers={"shop": shop},
    )
    client = await Client.connect(address, plugins=[plugin])
    # No sticky cache: the restarted worker gets the next workflow task at once, not after the
    # dead worker's sticky queue times out.
    worker = Worker(client, task_queue=task_queue, workflows=[PayAgent], max_cached_workflows=0)
    print("worker up", flush=True)
    await worker.run()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--shop", required=True)
    parser.add_argument("--calls", type=Path, required=True)
    # The restarted worker, started (and importing the SDKs, seconds on a small machine) while
    # the first one runs: it polls Temporal only once the first one is dead.
    parser.add_argument("--standby", type=Path, help="poll no task before this file exists")
    args = parser.parse_args()
    if args.standby is not None:
        standby(args.standby)
    asyncio.run(main(args.address, args.task_queue, args.shop, args.calls))
