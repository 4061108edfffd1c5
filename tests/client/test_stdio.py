"""A stdio server process killed mid-call: the wrapper reconnects (a new process) and finishes."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from orchestrator import RetryingSession, RetryPolicy

ROOT = Path(__file__).resolve().parents[2]
SERVER = StdioServerParameters(
    command=sys.executable,
    args=[str(Path(__file__).with_name("_stdio_server.py"))],
    env={"PYTHONPATH": str(ROOT)},
)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_killed_stdio_server_is_replaced_and_the_call_completes() -> None:
    connects = 0

    def connect() -> Client:
        nonlocal connects
        connects += 1
        return Client(SERVER)

    running = anyio.Event()
    first: list[str] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        first.extend((message or "").split())
        running.set()

    async with RetryingSession(connect=connect, policy=RetryPolicy(deadline=60)) as rs:

        async def kill_when_running() -> None:
            await running.wait()
            os.kill(int(first[0]), signal.SIGKILL)

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_when_running)
            result, report = await rs.call_tool_with_report(
                "slow_first", progress_callback=progress
            )
    killed_pid, first_key = int(first[0]), first[1]
    answer = result.structured_content
    assert answer is not None and answer["pid"] != killed_pid
    assert answer["key"] == first_key == report.key and answer["attempt"] == 2
    assert [(a.failure, a.code, a.generation) for a in report.attempts] == [
        ("maybe_executed", -32000, 1),
        (None, None, 2),
    ]
    assert connects == 2 and report.connects == 2
