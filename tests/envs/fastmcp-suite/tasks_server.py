"""The server of `tasks_check.py`'s redelivery checks, run as a process of its own: a guarded
`task=True` tool served over streamable HTTP with the real `TasksExtension`, whose Docket worker
runs in this process, on the check's redis-server.

    python tasks_server.py PORT      # env: TASKS_CHECK_REDIS, _DOCKET, _LEDGER, _KILL

The tool appends to an fsynced ledger (the effect the check counts). `TASKS_CHECK_KILL` makes this
process SIGKILL itself at an exact point of the first run: `effect` right after the ledger line
(mid-body: the body's record stays IN_PROGRESS), `completed` once the body returned, as Docket
goes to mark the execution completed (the fence has stored the body's result by then; Docket has
not acknowledged the execution). Docket then redelivers it to the next worker.
That first run starts only once `TASKS_CHECK_GO` exists (the check got its task): the creation's
own answer is never what the kill cuts off.
"""

from __future__ import annotations

import os
import signal
import sys
from datetime import timedelta
from typing import Any

import anyio
from fastmcp import FastMCP

from idempotency import open_store
from idempotency.fastmcp import IdempotencyMiddleware

URL = os.environ["TASKS_CHECK_REDIS"]
LEDGER = os.environ["TASKS_CHECK_LEDGER"]
KILL = os.environ.get("TASKS_CHECK_KILL", "")
#: Shorter than Docket's redelivery timeout (3 s): a dead run's lease has run out when its
#: execution is redelivered, so the next run finds the record UNKNOWN rather than held.
LEASE = 1.0


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


store = open_store(f"{URL}?prefix=keys:")
if KILL == "completed":
    from docket.execution import Execution

    async def die_before_completing(self: Execution, *args: Any, **kwargs: Any) -> None:
        die()

    Execution.mark_as_completed = die_before_completing  # type: ignore[method-assign]

server: FastMCP[Any] = FastMCP("works")
server.add_middleware(IdempotencyMiddleware(store, lease=LEASE))
# Imported after the middleware is built, on purpose: the body fence must not depend on the order
# in which an application imports the two (it patches fastmcp_tasks when that is imported).
from fastmcp_tasks import TasksExtension  # noqa: E402

server.add_extension(
    TasksExtension(
        url=URL,
        name=os.environ["TASKS_CHECK_DOCKET"],
        redelivery_timeout=timedelta(seconds=3),
        minimum_check_interval=timedelta(milliseconds=100),
    )
)


def record(effect: str) -> None:
    with open(LEDGER, "a", encoding="utf-8") as ledger:
        ledger.write(effect + "\n")
        ledger.flush()
        os.fsync(ledger.fileno())


@server.tool(task=True)
async def deploy(env: str) -> str:
    if KILL:
        go = anyio.Path(os.environ["TASKS_CHECK_GO"])
        while not await go.exists():  # noqa: ASYNC110 (another process creates it)
            await anyio.sleep(0.02)
    record(env)
    if KILL == "effect":
        die()
    return f"deployed {env}"


if __name__ == "__main__":
    server.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False)
