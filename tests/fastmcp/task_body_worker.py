"""A task worker process: runs one task's body of a guarded FastMCP server, as a queue worker
would (outside any request), through `idempotency.fastmcp.run_task_body`.

    python task_body_worker.py STORE_URL LEDGER TASK_ID hang|finish|reconcile

The body appends the task id to LEDGER (the effect, fsynced), prints `effect`, then hangs (to be
SIGKILLed) or returns. Prints `done STATUS` (the marker's status, and `reconciled` when a
reconciler answered) or `error CODE` (the guard's answer) at the end. `reconcile`: the guard has
a reconciler for `deploy`, which says the effect happened (its ledger line is there).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
from fastmcp import FastMCP
from fastmcp.tools.base import ToolResult
from mcp import MCPError

from idempotency import InDoubt, Reconciled, open_store, wire
from idempotency.fastmcp import IdempotencyMiddleware, run_task_body


def _effect(ledger: str, task_id: str) -> None:
    """The effect: one line in the ledger, on disk before anyone is told."""
    with open(ledger, "a") as f:
        f.write(task_id + "\n")
        f.flush()
        os.fsync(f.fileno())


async def main(url: str, ledger: str, task_id: str, mode: str) -> None:
    store = open_store(url)
    server: FastMCP[Any] = FastMCP("works")

    def happened(doubt: InDoubt) -> Reconciled:
        with open(ledger) as f:
            done = task_id in f.read().split()
        return Reconciled.happened(f"deployed ({doubt.tool})") if done else Reconciled.unknown()

    options: dict[str, Any] = {"reconcile": {"deploy": happened}} if mode == "reconcile" else {}
    server.add_middleware(IdempotencyMiddleware(store, lease=2.0, **options))

    @server.tool(task=True)
    async def deploy(env: str) -> str:
        _effect(ledger, task_id)
        print("effect", flush=True)
        if mode == "hang":
            await anyio.sleep_forever()
        return f"deployed {env}"

    tool = await server.get_tool("deploy")
    assert tool is not None
    arguments = {"env": "prod"}

    async def body() -> ToolResult:
        return await tool.run(arguments)

    try:
        result = await run_task_body(server, tool, task_id, arguments, body)
    except MCPError as exc:
        print(f"error {exc.error.code}", flush=True)
    else:
        marker = (result.meta or {})[wire.IDEMPOTENCY_META]
        print(
            "done", marker["status"], "reconciled" if marker.get("reconciled") else "", flush=True
        )
    finally:
        await store.aclose()


if __name__ == "__main__":
    url, ledger, task_id, mode = sys.argv[1:5]
    anyio.run(main, url, ledger, task_id, mode)
