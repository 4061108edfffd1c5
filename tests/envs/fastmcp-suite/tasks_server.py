"""The server of `tasks_check.py`'s redelivery checks, run as a process of its own: a guarded
`task=True` tool served over streamable HTTP with the real `TasksExtension`, whose Docket worker
runs in this process, on the check's redis-server.

    python tasks_server.py PORT      # env: TASKS_CHECK_REDIS, _DOCKET, _LEDGER, _KILL
    python -m fastmcp_tasks.worker_cli worker tasks_server.py   # a worker process of its own

The replicas check runs it as a frontend only (`TASKS_CHECK_CONCURRENCY=0`: its Docket worker
takes no execution, the worker process above runs the bodies), logging each request it answers
to `TASKS_CHECK_ARRIVALS` (the replica's own log: which replica a request reached).
The proxy check runs it with `TASKS_CHECK_PLAIN=1`: without mcp-once (no `IdempotencyMiddleware`,
`idempotency` not even imported), a user's unguarded task server that `mcp-once proxy` fronts.

The tool appends to an fsynced ledger (the effect the check counts, with the pid that ran it).
`TASKS_CHECK_KILL` makes this process SIGKILL itself at an exact point of the first run: `effect`
right after the ledger line (mid-body: the body's record stays IN_PROGRESS), `completed` once the
body returned, as Docket goes to mark the execution completed (the fence has stored the body's
result by then; Docket has not acknowledged the execution). Docket then redelivers it to the next
worker.
That first run starts only once `TASKS_CHECK_GO` exists (the check got its task): the creation's
own answer is never what the kill cuts off.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import timedelta
from typing import Any

import anyio
from fastmcp import FastMCP
from fastmcp.server.middleware import Middleware, MiddlewareContext

URL = os.environ["TASKS_CHECK_REDIS"]
LEDGER = os.environ["TASKS_CHECK_LEDGER"]
KILL = os.environ.get("TASKS_CHECK_KILL", "")
ARRIVALS = os.environ.get("TASKS_CHECK_ARRIVALS", "")
PLAIN = os.environ.get("TASKS_CHECK_PLAIN") == "1"
#: Shorter than Docket's redelivery timeout (3 s): a dead run's lease has run out when its
#: execution is redelivered, so the next run finds the record UNKNOWN rather than held.
LEASE = 1.0


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


if KILL == "completed":
    from docket.execution import Execution

    async def die_before_completing(self: Execution, *args: Any, **kwargs: Any) -> None:
        die()

    Execution.mark_as_completed = die_before_completing  # type: ignore[method-assign]


def record(effect: str, path: str = LEDGER) -> None:
    with open(path, "a", encoding="utf-8") as ledger:
        ledger.write(effect + "\n")
        ledger.flush()
        os.fsync(ledger.fileno())


class Arrivals(Middleware):
    """Logs each request this replica answers: its method, and for `tools/call` the task it
    answered with (outermost, so it sees the guard's answer)."""

    async def on_request(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
        answer = await call_next(context)
        entry: dict[str, Any] = {"method": context.method, "pid": os.getpid()}
        if context.method == "tools/call":
            entry["task"] = getattr(answer, "task_id", None)
        record(json.dumps(entry), ARRIVALS)
        return answer


server: FastMCP[Any] = FastMCP("works")
if ARRIVALS:
    server.add_middleware(Arrivals())
if not PLAIN:
    from idempotency import open_store
    from idempotency.fastmcp import IdempotencyMiddleware

    server.add_middleware(IdempotencyMiddleware(open_store(f"{URL}?prefix=keys:"), lease=LEASE))
# Imported after the middleware is built, on purpose: the body fence must not depend on the order
# in which an application imports the two (it patches fastmcp_tasks when that is imported).
from fastmcp_tasks import TasksExtension  # noqa: E402

server.add_extension(
    TasksExtension(
        url=URL,
        name=os.environ["TASKS_CHECK_DOCKET"],
        redelivery_timeout=timedelta(seconds=3),
        minimum_check_interval=timedelta(milliseconds=100),
        concurrency=int(os.environ.get("TASKS_CHECK_CONCURRENCY", "10")),
    )
)

if PLAIN and any(type(m).__name__ == "IdempotencyMiddleware" for m in server.middleware):
    raise SystemExit("TASKS_CHECK_PLAIN: this server must not be guarded (MCP_ONCE_GUARD set?)")


@server.tool(task=True)
async def deploy(env: str) -> str:
    if KILL:
        go = anyio.Path(os.environ["TASKS_CHECK_GO"])
        while not await go.exists():  # noqa: ASYNC110 (another process creates it)
            await anyio.sleep(0.02)
    record(f"{env} {os.getpid()}")
    if KILL == "effect":
        die()
    return f"deployed {env}"


if __name__ == "__main__":
    server.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False)
