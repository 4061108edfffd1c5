"""An agent pipeline journalled by a `Run` that creates a task through an in-process proxy
(its records on a store file shared with the next agent) and then polls it.

    python task_agent.py STORE_URL UPSTREAM_URL JOURNAL OUT [--kill]

Appends to OUT the task id it got ("task ID"), then, unless `--kill` (SIGKILLed right after the
task's creation, before polling), the task's result ("done TEXT"). A restarted agent of the same
run resumes the run's first position under its key, so the proxy answers with the same task.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
from mcp import Client

from idempotency import open_store
from mcp_once.proxy import Upstream, build_proxy
from orchestrator import RetryingSession, Run, SQLiteJournal, TaskCreated, TasksExtension
from orchestrator.chaos import in_memory_transport


def _say(out: Path, line: str) -> None:
    with out.open("a") as sink:
        sink.write(line + "\n")
        sink.flush()
        os.fsync(sink.fileno())


async def main(store_url: str, upstream_url: str, journal: str, out: Path, kill: bool) -> None:
    proxy = build_proxy(Upstream.http(upstream_url), open_store(store_url))
    async with (
        proxy.opened(),
        Run("nightly-deploy", journal=SQLiteJournal(journal)) as run,
        RetryingSession(
            connect=lambda: Client(
                in_memory_transport(proxy._mcp_server), extensions=[TasksExtension()]
            ),
            run=run,
        ) as session,
    ):
        created = await session.create_task("deploy", {"target": "prod"})
        assert isinstance(created, TaskCreated)
        _say(out, f"task {created.task_id}")
        if kill:
            os.kill(os.getpid(), signal.SIGKILL)
        status = await session.get_task(created.task_id)
        result = await session.task_result(created.task_id)
        _say(out, f"done {status.status} {result.content[0].text}")  # type: ignore[union-attr]


if __name__ == "__main__":
    store, upstream, journal, out = sys.argv[1:5]
    anyio.run(main, store, upstream, journal, Path(out), "--kill" in sys.argv[5:])
