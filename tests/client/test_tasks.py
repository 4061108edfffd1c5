"""Task-augmented calls from the client (rule 23, SEP-2663): `RetryingSession.create_task` sends
the call's key on a session declaring the tasks extension (`TasksExtension`: the request's
capabilities), reads the flat `CreateTaskResult`, a lost one is maybe-executed (re-sent only
through the gate, under the same key), and the polls (`tasks/get`, with the result inlined once
the task is done) are pure reads, re-sent at will. The server is a real task-capable SDK server
(tests/task_server.py) with an effect ledger; the answers are lost on a real in-memory link
(`_faults`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _faults import Faults, faulty_transport
from mcp import Client, MCPError
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CallToolResult, ListToolsResult
from task_server import KEY_META, build
from task_wire import producing_tasks

from orchestrator import (
    TASKS_EXTENSION,
    OutcomeUnknown,
    RetryingSession,
    RetryPolicy,
    TaskCreated,
    TasksExtension,
    TaskState,
)
from orchestrator._tasks import TASK_ANSWER

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _producing() -> Iterator[None]:
    with producing_tasks():  # the server half of a claimed result (tests/task_wire.py)
        yield


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def retrying(tmp_path: Path, faults: Faults, **options: Any) -> RetryingSession:
    """A session to a fresh task server (its ledger in `tmp_path`) on a link `faults` breaks."""
    server = build(tmp_path)
    return RetryingSession(connect=lambda: tasks_client(server, faults), **options)


def tasks_client(server: Any, faults: Faults) -> Client:
    """The SDK's client declaring the tasks extension, on a link `faults` breaks."""
    return Client(faulty_transport(server, faults), extensions=[TasksExtension()])


async def test_a_task_creation_carries_its_key_and_the_task_is_polled(tmp_path: Path) -> None:
    faults = Faults()
    async with retrying(tmp_path, faults) as rs:
        created = await rs.create_task("deploy", {"target": "prod"}, idempotency_key="deploy-1")
        assert isinstance(created, TaskCreated) and created.result_type == "task"
        assert created.ttl_ms == 3_600_000 and created.created_at is not None
        assert rs.last_report is not None and rs.last_report.outcome == "result"
        assert not rs.last_report.replayed
        status = await rs.get_task(created.task_id)
        assert status.task_id == created.task_id and status.status == "completed"
        assert "deployed prod" in str(status.outcome().content)
        result = await rs.task_result(created.task_id)
        assert isinstance(result, CallToolResult) and "deployed prod" in str(result.content)
    (tool, params), *polls = faults.requests
    assert [p for p, _ in polls] == ["tasks/get", "tasks/get"]
    assert tool == "deploy" and "task" not in params  # SEP-2663: no params.task
    assert TASKS_EXTENSION in params["_meta"][CLIENT_CAPABILITIES_META_KEY]["extensions"]
    assert params["_meta"][KEY_META] == "deploy-1"
    assert lines(tmp_path / "calls") == ["task deploy-1"]
    assert len(lines(tmp_path / "effects")) == 1


async def test_a_lost_task_creation_is_resent_under_its_key_only_through_the_gate(
    tmp_path: Path,
) -> None:
    """`deploy` is `idempotentHint`: its lost `CreateTaskResult` is re-sent, same key (the
    unguarded server makes a second task: only a guard makes the re-send a replay, see
    tests/proxy/test_proxy_tasks.py). `release` is not: its lost answer is `OutcomeUnknown`
    after one request, never a second task."""
    faults = Faults(plan={"deploy": ["drop"], "release": ["drop"]})
    async with retrying(tmp_path, faults, policy=RetryPolicy(attempt_timeout=0.3)) as rs:
        created = await rs.create_task("deploy", {"target": "a"}, idempotency_key="k-deploy")
        assert isinstance(created, TaskCreated)
        assert rs.last_report is not None and len(rs.last_report.attempts) == 2
        assert rs.last_report.attempts[0].failure == "maybe_executed"
        with pytest.raises(OutcomeUnknown) as caught:
            await rs.create_task("release", {"target": "b"}, idempotency_key="k-release")
        assert caught.value.key == "k-release" and caught.value.reason == "not_idempotent"
    assert lines(tmp_path / "calls") == ["task k-deploy", "task k-deploy", "task k-release"]


async def test_task_polls_are_resent_at_will(tmp_path: Path) -> None:
    """`tasks/get` of a non-idempotent tool's task: its lost answers (one dropped, one with the
    link cut) are re-sent, on a new session for the cut one: a poll changes nothing, so no gate
    applies."""
    faults = Faults(plan={"tasks/get": ["drop", None, "kill"]})
    async with retrying(tmp_path, faults, policy=RetryPolicy(attempt_timeout=0.3)) as rs:
        created = await rs.create_task("release", {"target": "c"})
        assert isinstance(created, TaskCreated)
        status = await rs.get_task(created.task_id)
        assert status.status == "completed"
        result = await rs.task_result(created.task_id)
        assert "deployed c" in str(result.content)
        assert rs.connects == 2
    polls = [tool for tool, _ in faults.requests if tool.startswith("tasks/")]
    assert polls == ["tasks/get"] * 4
    assert len(lines(tmp_path / "effects")) == 1


async def test_bad_task_arguments_are_refused_before_sending(tmp_path: Path) -> None:
    faults = Faults()
    async with retrying(tmp_path, faults) as rs:
        with pytest.raises(ValueError, match="task_id must be a non-empty"):
            await rs.cancel_task("")
        with pytest.raises(TypeError, match="input_responses must be a mapping"):
            await rs.update_task("t-1", [])  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="task_id must be a non-empty"):
            await rs.get_task("")
        with pytest.raises(ValueError, match="task_id must be a non-empty"):
            await rs.task_result(None)
    assert faults.requests == []


class _Attempt:
    """An engine's per-attempt context object (DBOS's step status, Temporal's activity info):
    a fresh one per execution of a step, so the call ordinals restart with it."""

    def __init__(self, **fields: object) -> None:
        self.__dict__.update(fields)


@pytest.mark.parametrize("engine", ["dbos", "temporal"])
async def test_engine_adapters_key_a_task_creation_by_step_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """The DBOS and Temporal key sources key a task creation as a plain call: by the step's
    identity and the call's ordinal in the step's execution, so a re-run of the step (a recovered
    workflow, a retried activity) re-sends the first run's key, which a guard answers with the
    first run's task. Each execution's first call here is a task creation and its second a plain
    `call_tool` (on a session declaring the extension the server tasks it too, and
    `TasksExtension` polls it to its result); both executions send the same two keys."""
    import orchestrator.dbos
    import orchestrator.temporal

    if engine == "dbos":
        key_source = orchestrator.dbos.step_key

        def execute() -> None:
            status = _Attempt(current_attempt=None)
            dbos = _Attempt(workflow_id="wf-7", step_id=3, step_status=status)
            monkeypatch.setattr(orchestrator.dbos, "DBOS", dbos)
    else:
        key_source = orchestrator.temporal.activity_key

        def execute() -> None:
            info = _Attempt(
                namespace="default",
                workflow_id="wf-7",
                workflow_run_id="run-1",
                activity_id="3",
                activity_run_id=None,
            )
            monkeypatch.setattr(orchestrator.temporal, "_current_info", lambda _: info)

    faults = Faults()
    async with retrying(tmp_path, faults, key_source=key_source) as rs:
        for _ in range(2):
            execute()
            created = await rs.create_task("release", {"target": "eu"})
            assert isinstance(created, TaskCreated)
            plain = await rs.call_tool("release", {"target": "eu"})
            assert "deployed eu" in str(plain.content)
    calls = [p["_meta"][KEY_META] for tool, p in faults.requests if tool == "release"]
    first, second, again_first, again_second = calls
    assert first != second and (again_first, again_second) == (first, second)
    assert lines(tmp_path / "calls") == [f"task {first}", f"task {second}"] * 2


class _PlainSession:
    """A `ToolSession` of a user's own, written before tasks: no `send_task_request`."""

    async def call_tool(self, *args: Any, **kwargs: Any) -> CallToolResult:
        raise AssertionError("nothing is sent")

    async def list_tools_page(self, cursor: str | None) -> ListToolsResult:
        return ListToolsResult(tools=[])

    def closed(self) -> bool:
        return False

    def watch_list_changed(self, on_change: Any) -> bool:
        return False


async def test_a_session_that_cannot_send_tasks_is_refused_before_sending() -> None:
    rs = RetryingSession(_PlainSession())
    with pytest.raises(TypeError, match=r"implement orchestrator\.TaskSession"):
        await rs.create_task("deploy", {"target": "a"})
    with pytest.raises(TypeError, match=r"implement orchestrator\.TaskSession"):
        await rs.get_task("t-1")


async def test_a_poll_is_resent_past_a_reconnect_that_failed(tmp_path: Path) -> None:
    """The link dies under a `tasks/get` and the first reconnect is refused: nothing was sent
    then, so the poll goes on to the next session."""
    server = build(tmp_path)
    faults = Faults(plan={"tasks/get": ["kill"]})
    refusals = [ConnectionRefusedError("refused once")]

    def connect() -> Client:
        if faults.kills and refusals:
            raise refusals.pop()
        return tasks_client(server, faults)

    async with RetryingSession(connect=connect, policy=RetryPolicy(max_attempts=3)) as rs:
        created = await rs.create_task("release", {"target": "d"})
        assert isinstance(created, TaskCreated)
        assert (await rs.get_task(created.task_id)).status == "completed"
    assert refusals == [] and faults.kills == 1


def test_the_task_answers_read_the_real_wire_shapes() -> None:
    """SEP-2663's flat `CreateTaskResult` is a `TaskCreated` (extra fields kept, the guard's
    marker in `_meta`); a plain result is a `CallToolResult`; `tasks/get`'s outcome is the
    inlined result, or the inlined error raised, and a task with neither has no outcome."""
    created = TASK_ANSWER.validate_python(
        {
            "resultType": "task",
            "taskId": "t-1",
            "status": "working",
            "createdAt": "2026-07-28T00:00:00Z",
            "lastUpdatedAt": "2026-07-28T00:00:00Z",
            "ttlMs": 60_000,
            "pollIntervalMs": 500,
            "vendor": 1,
            "_meta": {"io.github.mcp-once/idempotency": {"status": "replayed"}},
        }
    )
    assert isinstance(created, TaskCreated) and created.task_id == "t-1"
    assert created.poll_interval_ms == 500 and created.model_extra == {"vendor": 1}
    plain = TASK_ANSWER.validate_python({"content": [{"type": "text", "text": "x"}]})
    assert isinstance(plain, CallToolResult)
    done = TaskState.model_validate(
        {"taskId": "t-1", "status": "completed", "result": {"content": [], "isError": False}}
    )
    assert done.terminal and done.outcome().content == []
    failed = TaskState.model_validate(
        {"taskId": "t-1", "status": "failed", "error": {"code": -32603, "message": "boom"}}
    )
    with pytest.raises(MCPError) as caught:
        failed.outcome()
    assert caught.value.error.code == -32603
    with pytest.raises(ValueError, match="has no result"):
        TaskState.model_validate({"taskId": "t-1", "status": "cancelled"}).outcome()


async def test_a_task_update_or_cancel_is_sent_once(tmp_path: Path) -> None:
    """`tasks/update` and `tasks/cancel` change the task: a lost answer is raised as it came
    after one request, never re-sent (unlike a poll)."""
    faults = Faults(plan={"tasks/update": ["drop"], "tasks/cancel": ["drop"]})
    async with retrying(tmp_path, faults, policy=RetryPolicy(attempt_timeout=0.3)) as rs:
        created = await rs.create_task("deploy", {"target": "x"})
        assert isinstance(created, TaskCreated)
        with pytest.raises(MCPError, match="'tasks/update' timed out"):
            await rs.update_task(created.task_id, {"r-1": {"action": "accept"}})
        with pytest.raises(MCPError, match="'tasks/cancel' timed out"):
            await rs.cancel_task(created.task_id)
    sent = [method for method, _ in faults.requests if method.startswith("tasks/")]
    assert sent == ["tasks/update", "tasks/cancel"]
