"""A keyed task-augmented call through the proxy goes upstream once (rule 23): the upstream's
task is the record's answer, so a re-send of the key (its `CreateTaskResult` lost, or through
another replica on the same store) gets the same task id, marked as a replay, and the upstream
creates no second task. Everything is on the real SEP-2663 wire (the caller and the proxy declare
the tasks extension per request, the upstream answers with a flat `CreateTaskResult`, the task is
polled with `tasks/get`). The upstream is a real task-capable SDK server over streamable HTTP
(tests/task_server.py) that counts calls, effects and tasks in its fsynced ledger; the caller is
the client library's `RetryingSession` on a real in-memory wire whose answer is lost
(`orchestrator.chaos`)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from proxy_kit import KEY, MARKER

from idempotency import open_store, wire
from mcp_once.proxy import Upstream, build_proxy
from mcp_once.proxy.middleware import UNGUARDED
from mcp_once.scenarios import ServerProcess
from orchestrator import (
    RetryingSession,
    RetryPolicy,
    ServerOutcomeUnknown,
    TaskCreated,
    TasksExtension,
    ToolCallError,
)
from orchestrator.chaos import Chaos, Fault, FaultPlan, in_memory_transport

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

TASK_SERVER = Path(__file__).parents[1] / "task_server.py"


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@asynccontextmanager
async def task_upstream(tmp_path: Path) -> AsyncIterator[tuple[ServerProcess, Path]]:
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    upstream = ServerProcess(
        lambda port: [sys.executable, str(TASK_SERVER), str(ledger), str(port)],
        log=tmp_path / "upstream.log",
    )
    await anyio.to_thread.run_sync(upstream.start)
    try:
        yield upstream, ledger
    finally:
        upstream.kill()


def front(proxy: Any, chaos: Chaos | None = None, *, tasks: bool = True) -> Callable[[], Client]:
    """A connect factory: the SDK's client of the in-process proxy on a real 2026-07-28 wire,
    declaring the tasks extension (unless `tasks` is False)."""

    def connect() -> Client:
        transport = in_memory_transport(proxy._mcp_server)
        extensions = [TasksExtension()] if tasks else None
        return Client(
            chaos.wrap(transport) if chaos is not None else transport, extensions=extensions
        )

    return connect


async def test_a_lost_create_task_result_resent_through_the_proxy_gets_the_same_task(
    tmp_path: Path,
) -> None:
    """The caller's first `CreateTaskResult` is lost after the proxy stored it; the client
    re-sends under the same key (`deploy` is idempotentHint): one upstream call, one effect,
    one task, and the re-send's task id is the upstream's, marked as a replay. The task is
    then polled through the proxy (`tasks/get` forwarded, the result inlined)."""
    store_url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    async with task_upstream(tmp_path) as (upstream, ledger):
        proxy = build_proxy(Upstream.http(upstream.url), open_store(store_url))
        chaos = Chaos(FaultPlan(schedule={1: Fault.LOST_ACK}))
        async with (
            proxy.opened(),
            RetryingSession(
                connect=front(proxy, chaos), policy=RetryPolicy(attempt_timeout=2)
            ) as rs,
        ):
            created = await rs.create_task("deploy", {"target": "prod"})
            assert isinstance(created, TaskCreated)
            report = rs.last_report
            assert report is not None and report.replayed and len(report.attempts) == 2
            assert (created.meta or {})[MARKER]["status"] == "replayed"
            assert lines(ledger / "tasks") == [created.task_id]
            status = await rs.get_task(created.task_id)
            assert status.status == "completed"
            result = await rs.task_result(created.task_id)
            assert "deployed prod (#1)" in str(result.content)
            tools = await rs.refresh_tools()
            listed = next(t for t in tools if t.name == "deploy")
            assert (listed.meta or {})[wire.PROXY_META] == {
                name: list(values) for name, values in UNGUARDED.items()
            }
    [call] = lines(ledger / "calls")
    assert call.startswith("task mcp-once:")  # the record's upstream key, never the caller's
    assert len(lines(ledger / "effects")) == 1 and len(lines(ledger / "tasks")) == 1


async def test_another_replica_gets_the_same_task_and_other_arguments_are_refused(
    tmp_path: Path,
) -> None:
    """Two proxies on one store in front of one upstream: the key's task created through the
    first is the answer of the second (same id, a replay); the key with other arguments is
    -32011, and so is a re-send of the key that does not declare the tasks extension (its answer
    is a task, which that caller cannot read), naming the task. The task's requests
    (`tasks/get`, `tasks/update`, `tasks/cancel`) are forwarded to the upstream."""
    store_url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    async with task_upstream(tmp_path) as (upstream, ledger):
        first = build_proxy(Upstream.http(upstream.url), open_store(store_url))
        second = build_proxy(Upstream.http(upstream.url), open_store(store_url))
        async with (
            first.opened(),
            second.opened(),
            RetryingSession(connect=front(first)) as one,
            RetryingSession(connect=front(second)) as two,
            RetryingSession(connect=front(second, tasks=False)) as plain,
        ):
            created = await one.create_task("release", {"target": "eu"}, idempotency_key="rel-1")
            assert isinstance(created, TaskCreated)
            assert (created.meta or {})[MARKER]["status"] == "executed"
            again = await two.create_task("release", {"target": "eu"}, idempotency_key="rel-1")
            assert isinstance(again, TaskCreated)
            assert again.task_id == created.task_id
            assert (again.meta or {})[MARKER]["status"] == "replayed"
            with pytest.raises(ToolCallError) as caught:
                await two.create_task("release", {"target": "us"}, idempotency_key="rel-1")
            assert caught.value.code == wire.KEY_REUSED
            with pytest.raises(ToolCallError) as refused:
                await plain.call_tool("release", {"target": "eu"}, idempotency_key="rel-1")
            assert refused.value.code == wire.KEY_REUSED
            assert refused.value.data["taskId"] == created.task_id
            assert (await two.get_task(created.task_id)).status == "completed"
            await two.update_task(created.task_id, {"r-1": {"action": "accept"}})
            assert (await one.cancel_task(created.task_id)).task_id == created.task_id
    assert len(lines(ledger / "effects")) == 1 and len(lines(ledger / "tasks")) == 1


AGENT = Path(__file__).parent / "task_agent.py"


async def test_a_run_killed_after_creating_a_task_polls_the_same_task_when_restarted(
    tmp_path: Path,
) -> None:
    """A `Run`-journalled agent (tests/proxy/task_agent.py) creates a task through the proxy and
    is SIGKILLed before polling it; restarted, it resumes the run's position under the same key,
    gets the same task (a replay) and polls it: one task, one effect upstream."""
    store_url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    journal, out = tmp_path / "journal.sqlite3", tmp_path / "agent.out"
    async with task_upstream(tmp_path) as (upstream, ledger):
        agent = [sys.executable, str(AGENT), store_url, upstream.url, str(journal), str(out)]
        with anyio.fail_after(120):
            killed = await anyio.run_process([*agent, "--kill"], check=False)
            assert killed.returncode == -9, killed.stderr.decode()[-2000:]
            [created] = lines(out)
            resumed = await anyio.run_process(agent, check=False)
            assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    assert lines(out) == [created, created, "done completed deployed prod (#1)"]
    assert lines(ledger / "tasks") == [created.removeprefix("task ")]
    assert len(lines(ledger / "effects")) == 1 and len(lines(ledger / "calls")) == 1


async def test_an_upstream_killed_while_creating_a_task_leaves_the_record_unknown(
    tmp_path: Path,
) -> None:
    """The upstream dies after the task's effect, before its `CreateTaskResult`: maybe executed,
    so the record turns UNKNOWN and the caller gets -32012; a re-send of the key once the
    upstream is back gets -32012 again, never a second task or effect."""
    store_url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    async with task_upstream(tmp_path) as (upstream, ledger):
        proxy = build_proxy(Upstream.http(upstream.url), open_store(store_url))
        arguments = {"target": "eu", "crash": True}
        async with proxy.opened(), RetryingSession(connect=front(proxy)) as rs:
            with pytest.raises(ServerOutcomeUnknown):
                await rs.create_task("release", arguments, idempotency_key="crash-1")
            await anyio.to_thread.run_sync(upstream.start)
            with pytest.raises(ServerOutcomeUnknown):
                await rs.create_task("release", arguments, idempotency_key="crash-1")
    assert len(lines(ledger / "calls")) == 1 and len(lines(ledger / "effects")) == 1
    assert lines(ledger / "tasks") == []  # it died before recording its task


async def test_a_legacy_era_caller_cannot_ask_for_a_task_and_gets_a_plain_call(
    tmp_path: Path,
) -> None:
    """Tasks are 2026-07-28 only: a 2025-11-25 caller's requests carry no capabilities (its
    client declares the extension, the SDK drops it), so the proxy sends its call upstream plain,
    on a session that does not declare the extension: the tool's result, stored and replayed."""
    from fastmcp import Client as FastMCPClient

    store_url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    async with task_upstream(tmp_path) as (upstream, ledger):
        proxy = build_proxy(Upstream.http(upstream.url), open_store(store_url))
        extensions = [TasksExtension()]
        async with (
            proxy.opened(),
            FastMCPClient(proxy, mode="legacy", extensions=extensions) as legacy,
        ):
            answers = [
                await legacy.call_tool_mcp("deploy", {"target": "eu"}, meta={KEY: "old-1"})
                for _ in "12"
            ]
    assert [(a.meta or {})[MARKER]["status"] for a in answers] == ["executed", "replayed"]
    assert "deployed eu (#1)" in str(answers[1].content)
    [call] = lines(ledger / "calls")
    assert call.startswith("plain mcp-once:") and lines(ledger / "tasks") == []
