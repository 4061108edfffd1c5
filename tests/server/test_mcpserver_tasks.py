"""Rule 23 on `MCPServer`: a tasks extension wrapped by `idempotent_tasks` creates one task per
key, every re-send gets it; a call the extension runs in the foreground is the tool's own guard's;
its body, fenced by the task id, runs once. Effects counted in `Effects`, tasks in the extension."""

from __future__ import annotations

from typing import Any

import pytest
from mcp import MCPError
from mcp.client import Client
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension
from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolRequestParams, CallToolResult, TextContent
from server_kit import Effects, meta
from task_wire import TASKS, ClientTask, TasksClient, create, new_task, producing_tasks

from idempotency import (
    MemoryKeyStore,
    RedisKeyStore,
    TaskCreated,
    decode_result,
    encode_result,
    idempotent,
    idempotent_tasks,
    mark_task_replay,
    wire,
)
from idempotency._guard.tasks import as_record

pytestmark = pytest.mark.anyio

ARGS = {"env": "prod"}


class SdkTasks(Extension):
    """A tasks extension for the SDK's `MCPServer`: `deploy` runs as a task for a client that
    declared the extension; every other call is handed on (the foreground)."""

    identifier = TASKS

    def __init__(self) -> None:
        self.created: list[str] = []

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if params.name != "deploy":
            return await call_next(ctx)
        self.created.append(f"s-{len(self.created) + 1}")
        return new_task(self.created[-1])


def status(answer: ClientTask | CallToolResult) -> str:
    return str((answer.meta or {})[wire.IDEMPOTENCY_META]["status"])


async def test_a_keyed_task_creation_on_mcpserver_makes_one_task() -> None:
    store, effects, backend = MemoryKeyStore(), Effects(), SdkTasks()
    tasks = idempotent_tasks(backend, store, server_name="shop")
    server: MCPServer[Any] = MCPServer("shop", extensions=[tasks])

    @server.tool()
    @idempotent(store)
    async def deploy(env: str) -> str:
        return await effects.charge(env, 1, gated=False)

    @server.tool()
    @idempotent(store)
    async def charge(env: str) -> str:
        return await effects.charge(env, 1, gated=False)

    with producing_tasks():
        async with Client(server, extensions=[TasksClient()]) as client:
            first = await create(client, "deploy", ARGS, meta("k-1"))
            again = await create(client, "deploy", ARGS, meta("k-1"))
            with pytest.raises(MCPError) as refused:
                await create(client, "deploy", {"env": "staging"}, meta("k-1"))
            # In the foreground (the extension hands it on): the tool's own guard, no deadlock.
            ran = [await create(client, "charge", ARGS, meta("k-2")) for _ in "12"]
    assert isinstance(first, ClientTask) and isinstance(again, ClientTask)
    assert backend.created == ["s-1"] and first.task_id == again.task_id == "s-1"
    assert [status(first), status(again)] == ["executed", "replayed"]
    assert refused.value.error.code == wire.KEY_REUSED
    assert [status(r) for r in ran] == ["executed", "replayed"] and effects.count == 1

    async def body() -> CallToolResult:
        text = await effects.charge("prod", 1, gated=False)
        return CallToolResult(content=[TextContent(type="text", text=text)])

    bodies = [await tasks.run_task_body("deploy", "s-1", ARGS, body) for _ in "12"]
    assert [status(b) for b in bodies] == ["executed", "replayed"] and effects.count == 2


async def _served(store: RedisKeyStore, tasks: Any, effects: Effects) -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("shop", extensions=[tasks])

    for name in ("deploy", "charge"):

        async def tool(env: str) -> str:
            return await effects.charge(env, 1, gated=False)

        tool.__name__ = name
        server.tool()(idempotent(store)(tool))
    return server


@pytest.mark.redis
@pytest.mark.parametrize(("task_tools", "foreground"), [(None, 4), (["deploy"], 2)])
async def test_a_declaring_call_the_extension_will_not_task_costs_a_plain_calls_round_trips(
    redis_url: str, redis_namespace: str, task_tools: list[str] | None, foreground: int
) -> None:
    """Store round trips (counted by the Redis client's own wire) per first execution, from a
    client that declared the tasks extension: a task creation is claimed and completed (2); a
    call of a tool outside `task_tools` is not claimed by the wrapper, only by the tool's own
    guard (2, as a plain call; without `task_tools`: claimed, given back, claimed again, 4)."""
    store = RedisKeyStore.from_url(redis_url, prefix=f"{redis_namespace}:")
    effects, backend = Effects(), SdkTasks()
    tasks = idempotent_tasks(backend, store, server_name="shop", task_tools=task_tools)
    trips: list[tuple[str, int]] = []
    try:
        with producing_tasks():
            server = await _served(store, tasks, effects)
            async with Client(server, extensions=[TasksClient()]) as client:
                await create(client, "charge", ARGS, meta("warm"))  # scripts loaded
                for tool, key in (("deploy", "k-1"), ("charge", "k-2"), ("charge", "k-2")):
                    before = store._traffic.writes
                    answer = await create(client, tool, ARGS, meta(key))
                    trips.append((status(answer), store._traffic.writes - before))
    finally:
        await store.aclose()
    assert trips == [("executed", 2), ("executed", foreground), ("replayed", 1)]
    assert backend.created == ["s-1"] and effects.count == 2  # warm-up and k-2, once


async def test_a_task_answered_for_a_tool_outside_task_tools_is_refused_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The extension tasks `deploy`, declared as never tasked: its creation ran unguarded, so
    the answer is an error, not the task, and the misdeclaration is logged."""
    store, effects, backend = MemoryKeyStore(), Effects(), SdkTasks()
    tasks = idempotent_tasks(backend, store, server_name="shop", task_tools=["charge"])
    server: MCPServer[Any] = MCPServer("shop", extensions=[tasks])

    @server.tool()
    async def deploy(env: str) -> str:
        return await effects.charge(env, 1, gated=False)

    with producing_tasks():
        async with Client(server, extensions=[TasksClient()]) as client:
            with pytest.raises(MCPError) as refused:
                await create(client, "deploy", ARGS, meta("k-1"))
    assert backend.created == ["s-1"] and effects.count == 0
    assert "task_tools" in caplog.text and "'deploy'" in caplog.text
    assert refused.value.error.code != wire.KEY_REUSED


@pytest.mark.parametrize("bad", ["deploy", b"deploy", [""], [3], 7])
def test_task_tools_must_be_a_collection_of_tool_names(bad: Any) -> None:
    with pytest.raises(TypeError, match="task_tools"):
        idempotent_tasks(SdkTasks(), MemoryKeyStore(), server_name="shop", task_tools=bad)


def test_a_kept_task_reads_back_as_the_task_with_the_marker_in_its_meta() -> None:
    """The record's form of a task (`io.github.mcp-once/task` in a stored result's `_meta`), the
    wire form a replay takes, and `mark_task_replay` for hosts that stamp a task themselves."""
    task = new_task("t-9").model_dump(by_alias=True, exclude_none=True)
    task["_meta"] = {"vendor/x": 1, wire.IDEMPOTENCY_META: {"status": "stale"}}
    kept = decode_result(encode_result(as_record(task), 1.0)).result
    assert kept.content == [] and (kept.meta or {})[wire.TASK_META]["taskId"] == "t-9"
    assert wire.IDEMPOTENCY_META not in (kept.meta or {})[wire.TASK_META]["_meta"]
    stamped = kept.model_copy(update={"meta": {**(kept.meta or {}), wire.IDEMPOTENCY_META: {}}})
    back = TaskCreated.of_record(stamped)
    assert back is not None and back.task_id == "t-9" and back.marker == {}
    assert back.root["_meta"]["vendor/x"] == 1 and back.root["resultType"] == "task"
    assert TaskCreated.of_record(CallToolResult(content=[])) is None
    marked = mark_task_replay(task, {"status": "replayed"})
    assert marked["_meta"] == {"vendor/x": 1, wire.IDEMPOTENCY_META: {"status": "replayed"}}
    assert task["_meta"][wire.IDEMPOTENCY_META] == {"status": "stale"}  # not changed in place
