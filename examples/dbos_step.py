"""A DBOS step that charges through MCP, once even if the process dies mid-step:
`uv run python examples/dbos_step.py --crash`, then `uv run python examples/dbos_step.py`.

The first run charges, then dies before DBOS records the step (as a kill would). The second run's
`DBOS.launch()` recovers the workflow and runs the step again; the step's calls are keyed by
`step_key` (workflow id, step id, order of the call in the step), so the server recognises the
re-run's charge and replays the first receipt instead of charging twice. With a random key
(`RetryingSession(client)` alone) the second run would charge again.

DBOS here keeps its state in a SQLite file (no Postgres); the MCP server is
`examples/server.py --stdio` with its own SQLite key store. `application_version` is pinned:
`DBOS.launch()` recovers only workflows of its own version, and the default version is a hash of
the workflow code, so a code fix deployed after a crash would strand the crashed workflow.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import anyio
from dbos import DBOS, SetWorkflowID
from mcp import Client, StdioServerParameters

from orchestrator import RetryingSession
from orchestrator.dbos import step_key

SERVER = Path(__file__).with_name("server.py")
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--order", default="order-1")
parser.add_argument(
    "--crash", action="store_true", help="die after the charge, before DBOS records it"
)
parser.add_argument("--store", default="sqlite:///.mcp-once/keys.sqlite3")
parser.add_argument("--dbos", default="sqlite:///.mcp-once/dbos.sqlite3")
args = parser.parse_args()


@DBOS.step()
async def charge(order_id: str) -> dict[str, Any]:
    params = StdioServerParameters(
        command=sys.executable, args=[str(SERVER), "--stdio", "--store", args.store]
    )
    async with Client(params) as client:
        # The key of each call comes from this step: the same on every run of it.
        session = RetryingSession(client, key_source=step_key)
        result, report = await session.call_tool_with_report(
            "charge", {"order_id": order_id, "cents": 1250}
        )
    print(f"charge: {'replayed' if report.replayed else 'executed'} {result.structured_content}")
    if args.crash:
        os._exit(3)  # for the demonstration: die before DBOS records this step's result
    return dict(result.structured_content or {})


@DBOS.workflow()
async def checkout(order_id: str) -> dict[str, Any]:
    return await charge(order_id)


async def main() -> None:
    workflow_id = f"checkout-{args.order}"
    if await DBOS.get_workflow_status_async(workflow_id) is not None:
        # Started before: DBOS.launch() has resumed it if it was interrupted. Wait for it.
        handle = await DBOS.retrieve_workflow_async(workflow_id)
    else:
        with SetWorkflowID(workflow_id):
            handle = await DBOS.start_workflow_async(checkout, args.order)
    print(f"workflow {workflow_id}: {await handle.get_result()}")


if __name__ == "__main__":
    Path(".mcp-once").mkdir(exist_ok=True)
    DBOS(
        config={
            "name": "mcp-once-example",
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
