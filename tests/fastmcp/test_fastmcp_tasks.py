"""Rule 23 on FastMCP: a keyed task-augmented call creates one task, its body runs once, and a
re-send gets the same task. Served by `task_kit.InProcessTasks` (the extension's seams, bodies in
a task group) under `IdempotencyMiddleware`; effects counted in `Effects`, tasks in the backend."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client, FastMCP
from fastmcp.tools.base import ToolResult
from mcp import MCPError
from mcp.client import Client as LowLevelClient
from mcp.server import Server
from mcp_types import CallToolRequestParams, CallToolResult, ListToolsResult, TextContent
from server_kit import Effects, meta
from task_kit import InProcessTasks
from task_wire import TTL_MS, ClientTask, TasksClient, create, new_task, producing_tasks

from idempotency import (
    InDoubt,
    MemoryKeyStore,
    OutcomeLost,
    Reconciled,
    RecordState,
    RedisKeyStore,
    idempotent_call_tool,
    open_store,
    reconcile_unknown,
    wire,
)
from idempotency.fastmcp import IdempotencyMiddleware, run_task_body, stored_task_result

pytestmark = pytest.mark.anyio

ARGS = {"env": "prod"}
WORKER = Path(__file__).with_name("task_body_worker.py")


def works(
    store: MemoryKeyStore, effects: Effects, tasks: InProcessTasks, **options: Any
) -> FastMCP[Any]:
    server: FastMCP[Any] = FastMCP("works")
    server.add_middleware(IdempotencyMiddleware(store, **options))
    server.add_extension(tasks)

    @server.tool(task=True)
    async def deploy(env: str) -> str:
        return await effects.charge(env, 1, gated=False)

    return server


def task_of(answer: object) -> ClientTask:
    assert isinstance(answer, ClientTask), answer
    return answer


@pytest.mark.parametrize("keyed", [True, False], ids=["client-key", "derived-key"])
async def test_a_lost_task_creation_resent_gets_the_same_task(keyed: bool) -> None:
    """With a client key, or keyless (rule 15: the caller gave up on the first answer, so its
    identical re-send is merged under the derived key)."""
    store, effects, gate = MemoryKeyStore(), Effects(), anyio.Event()
    tasks = InProcessTasks(create_gate=gate)
    server = works(store, effects, tasks)
    key = meta("d-1") if keyed else None
    async with Client(server, extensions=[TasksClient()]) as client:
        # The first answer is lost: the client times out while the task is being created.
        with pytest.raises(MCPError):
            await create(client, "deploy", ARGS, key, timeout=0.2)
        gate.set()
        in_flight = task_of(await create(client, "deploy", ARGS, key))
        state = await tasks.work(server, in_flight.task_id)
        if keyed:  # a keyless repeat after a delivered answer is a new intent (rule 15)
            after = task_of(await create(client, "deploy", ARGS, key))
            assert after.task_id == in_flight.task_id
            assert (after.meta or {})[wire.IDEMPOTENCY_META]["status"] == "replayed"
    assert tasks.created == 1 and effects.count == 1
    assert in_flight.task_id == next(iter(tasks.tasks))
    marker = (in_flight.meta or {})[wire.IDEMPOTENCY_META]
    assert marker["status"] == "replayed"
    assert marker["keySource"] == ("client" if keyed else "derived")
    assert state.status == "completed"


async def test_a_task_creation_answers_executed_then_other_arguments_are_refused() -> None:
    """And the record outlives the task: kept for the task's TTL (an hour) though the store's
    retention is a minute."""
    store, effects = MemoryKeyStore(), Effects()
    tasks = InProcessTasks()
    server = works(store, effects, tasks, retention=60)
    async with Client(server, extensions=[TasksClient()]) as client:
        first = task_of(await create(client, "deploy", ARGS, meta("d-2")))
        with pytest.raises(MCPError) as refused:
            await create(client, "deploy", {"env": "staging"}, meta("d-2"))
    assert (first.meta or {})[wire.IDEMPOTENCY_META]["status"] == "executed"
    assert refused.value.error.code == wire.KEY_REUSED
    assert tasks.created == 1
    (record,) = await store.list_records()
    assert record.state is RecordState.COMPLETED
    assert record.expires_at is not None and record.completed_at is not None
    assert record.expires_at - record.completed_at >= TTL_MS / 1000


async def test_a_redelivered_body_does_not_run_again_and_its_result_is_kept() -> None:
    store, effects = MemoryKeyStore(), Effects()
    tasks = InProcessTasks()
    server = works(store, effects, tasks)
    async with Client(server, extensions=[TasksClient()]) as client:
        task = task_of(await create(client, "deploy", ARGS, meta("d-3")))
        state = await tasks.work(server, task.task_id)
        first = state.result
        await tasks.work(server, task.task_id)  # the queue delivers the same task again
    assert effects.count == 1
    assert first is not None and state.result is not None
    assert state.result.content == first.content
    assert (state.result.meta or {})[wire.IDEMPOTENCY_META]["status"] == "replayed"
    # Another replica (a new server object on the same store) reads the task's final result.
    replica = works(store, Effects(), InProcessTasks())
    tool = await replica.get_tool("deploy")
    assert tool is not None
    kept = await stored_task_result(replica, tool, task.task_id)
    assert kept is not None and kept.content == first.content


@pytest.mark.redis
async def test_a_task_body_whose_process_killed_mid_run_is_not_run_again(
    tmp_path: Path, redis_url: str, redis_namespace: str
) -> None:
    """The worker running a task's body is SIGKILLed after its effect; the redelivery (a second
    worker process) finds the record UNKNOWN: OUTCOME_UNKNOWN, and no second effect; a third,
    with the tool's reconciler, answers what the reconciler says happened."""
    url = f"{redis_url}{'&' if '?' in redis_url else '?'}prefix={redis_namespace}:"
    ledger = tmp_path / "ledger.txt"
    argv = [sys.executable, str(WORKER), url, str(ledger), "task-7"]
    async with await anyio.open_process([*argv, "hang"]) as first:
        assert first.stdout is not None
        seen = b""
        with anyio.fail_after(120):  # a process start on a loaded machine
            while b"\n" not in seen:
                seen += await first.stdout.receive()
        assert seen.strip() == b"effect"
        first.send_signal(signal.SIGKILL)
        await first.wait()
    second = await anyio.run_process([*argv, "finish"], check=False)
    assert second.stdout.decode().strip() == f"error {wire.OUTCOME_UNKNOWN}", second
    assert ledger.read_text().splitlines() == ["task-7"]
    opened = open_store(url)
    try:
        unknown = await opened.list_records(state=RecordState.UNKNOWN)
    finally:
        await opened.aclose()
    assert len(unknown) == 1 and unknown[0].tool == "deploy#task-body"
    # The tool's reconciler (named by the tool) settles its body's record: no run, its answer.
    third = await anyio.run_process([*argv, "reconcile"], check=False)
    assert third.stdout.decode().split() == ["done", "replayed", "reconciled"], third
    assert ledger.read_text().splitlines() == ["task-7"]


async def test_the_low_level_handler_keeps_the_task_it_answered_with() -> None:
    """`idempotent_call_tool`: a handler answering with a task has it kept as the key's answer;
    its backend fences the body with `GuardedCallTool.run_task_body`."""
    created: list[str] = []
    effects = Effects()

    async def call_tool(ctx: Any, params: CallToolRequestParams) -> Any:
        created.append(f"t-{len(created) + 1}")
        return new_task(created[-1])

    store = MemoryKeyStore()
    guarded = idempotent_call_tool(store, call_tool, server_name="lo")
    server = Server("lo", on_call_tool=guarded)
    with producing_tasks():
        async with LowLevelClient(server, extensions=[TasksClient()]) as client:
            first = task_of(await create(client, "deploy", ARGS, meta("l-1")))
            again = task_of(await create(client, "deploy", ARGS, meta("l-1")))

    async def body() -> CallToolResult:
        return CallToolResult(
            content=[TextContent(type="text", text=await effects.charge("x", 1, gated=False))]
        )

    ran = [await guarded.run_task_body("deploy", first.task_id, ARGS, body) for _ in "12"]
    assert created == ["t-1"] and first.task_id == again.task_id == "t-1"
    statuses = [(r.meta or {})[wire.IDEMPOTENCY_META]["status"] for r in (first, again, *ran)]
    assert statuses == ["executed", "replayed", "executed", "replayed"]
    assert effects.count == 1


async def test_an_operator_reconciles_a_task_body_in_doubt_with_its_tools_reconciler() -> None:
    """A body whose downstream call broke (`OutcomeLost`) leaves its record UNKNOWN at once;
    `reconcile_unknown` asks the tool's reconciler (named by the tool), and the task's stored
    result is then what the reconciler said happened."""
    store = MemoryKeyStore()
    asked: list[str] = []

    def happened(doubt: InDoubt) -> Reconciled:
        asked.append(doubt.tool)
        return Reconciled.happened("deployed prod (per the system of record)")

    server: FastMCP[Any] = FastMCP("works")
    server.add_middleware(IdempotencyMiddleware(store, reconcile={"deploy": happened}))

    @server.tool(task=True)
    async def deploy(env: str) -> str:
        raise OutcomeLost("the deployment service's connection broke mid-call")

    tool = await server.get_tool("deploy")
    assert tool is not None

    async def body() -> ToolResult:
        return await tool.run(ARGS)

    with pytest.raises(MCPError) as lost:
        await run_task_body(server, tool, "task-8", ARGS, body)
    assert lost.value.error.code == wire.OUTCOME_UNKNOWN
    (done,) = await reconcile_unknown(server, store)
    assert (done.tool, done.answer, done.applied) == ("deploy#task-body", "happened", True)
    assert asked == ["deploy#task-body"]
    kept = await stored_task_result(server, tool, "task-8")
    assert kept is not None and "per the system of record" in str(kept.content)


@pytest.mark.redis
async def test_no_entry_point_claims_a_declaring_call_twice(
    redis_url: str, redis_namespace: str
) -> None:
    """Store round trips per first execution from a client that declared the tasks extension
    (counted on the Redis client's own wire): 2, a task creation or a call run in the
    foreground, through `IdempotencyMiddleware` (the task extension answers below its one claim)
    and through the low-level handler (one guard around the handler, whatever it answers)."""
    store = RedisKeyStore.from_url(redis_url, prefix=f"{redis_namespace}:")
    effects, tasks = Effects(), InProcessTasks()
    server: FastMCP[Any] = FastMCP("works")
    server.add_middleware(IdempotencyMiddleware(store))
    server.add_extension(tasks)

    @server.tool(task=True)
    async def deploy(env: str) -> str:
        return await effects.charge(env, 1, gated=False)

    @server.tool()
    async def charge(env: str) -> str:
        return await effects.charge(env, 1, gated=False)

    async def call_tool(ctx: Any, params: CallToolRequestParams) -> Any:
        if params.name == "deploy":
            return new_task("t-1")
        return CallToolResult(content=[TextContent(type="text", text="charged")])

    async def list_tools(ctx: Any, params: Any) -> ListToolsResult:
        return ListToolsResult(tools=[])  # the client lists tools to check a plain result

    guarded = idempotent_call_tool(store, call_tool, server_name="lo")
    low = Server("lo", on_call_tool=guarded, on_list_tools=list_tools)
    trips: list[tuple[str, str, int]] = []
    try:
        with producing_tasks():
            async with (
                Client(server, extensions=[TasksClient()]) as fast,
                LowLevelClient(low, extensions=[TasksClient()]) as lowlevel,
            ):
                for where, client in (("fastmcp", fast), ("lowlevel", lowlevel)):
                    await create(client, "charge", ARGS, meta(f"{where}-warm"))  # scripts loaded
                    for tool in ("deploy", "charge"):
                        before = store._traffic.writes
                        answer = await create(client, tool, ARGS, meta(f"{where}-{tool}"))
                        kind = "task" if isinstance(answer, ClientTask) else "call"
                        trips.append((where, kind, store._traffic.writes - before))
    finally:
        await store.aclose()
    assert trips == [
        (where, kind, 2) for where in ("fastmcp", "lowlevel") for kind in ("task", "call")
    ]
    assert tasks.created == 1 and effects.count == 2  # the warm-up and the foreground call
