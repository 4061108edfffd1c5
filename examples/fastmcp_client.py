"""FastMCP's client with safe retries: `uv run python examples/fastmcp_client.py [--store URL]`.

`RetryingClient` is a `fastmcp.Client` (same arguments, plus `policy=`). Here it talks to
`examples/server.py --stdio` through the chaos link, which loses the answer to the first
`charge`: the charge runs, its answer never comes, the client retries with the same key, and the
server replays the stored receipt instead of charging again.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

import anyio
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client

from idempotency import wire
from orchestrator import RetryPolicy
from orchestrator.chaos import Chaos, Fault, FaultPlan
from orchestrator.fastmcp import RetryingClient, SDKStreamTransport

SERVER = Path(__file__).with_name("server.py")


async def main(store: str) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=[str(SERVER), "--stdio", "--store", store]
    )
    # For the demonstration only: lose the answer to the first `charge`.
    chaos = Chaos(FaultPlan(schedule={1: Fault.LOST_ACK}, tools={"charge"}), seed=1)
    transport = SDKStreamTransport(lambda: chaos.wrap(stdio_client(params)))
    # In your code: RetryingClient("http://127.0.0.1:8000/mcp", policy=...) or any transport.
    policy = RetryPolicy(attempt_timeout=2.0, deadline=30.0)
    async with RetryingClient(transport, policy=policy) as client:
        order = f"order-{uuid.uuid4().hex[:8]}"
        result = await client.call_tool("charge", {"order_id": order, "cents": 900})
        status = (result.meta or {})[wire.IDEMPOTENCY_META]["status"]
        print(f"charge (first answer lost): {status} {result.structured_content}")
        charges = await client.call_tool("list_charges", {"order_id": order})
        print(f"charges for {order}: {len((charges.structured_content or {})['result'])}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="sqlite:///.mcp-once/keys.sqlite3")
    anyio.run(main, parser.parse_args().store)
