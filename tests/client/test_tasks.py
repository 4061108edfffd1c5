"""Task-augmented calls from the client (rule 23): `RetryingSession.create_task` sends the call's
key with `params.task`, a lost `CreateTaskResult` is maybe-executed (re-sent only through the
gate, under the same key), and the polls (`tasks/get`, `tasks/result`) are pure reads, re-sent at
will. The server is a real task-capable SDK server (tests/task_server.py) with an effect ledger;
the answers are lost on a real in-memory link (`_faults`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _faults import Faults, faulty_transport
from mcp import Client
from mcp_types import CallToolResult, ListToolsResult
from task_server import KEY_META, build

from orchestrator import OutcomeUnknown, RetryingSession, RetryPolicy, TaskCreated

pytestmark = pytest.mark.anyio


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def retrying(tmp_path: Path, faults: Faults, **options: Any) -> RetryingSession:
    """A session to a fresh task server (its ledger in `tmp_path`) on a link `faults` breaks."""
    server = build(tmp_path)
    return RetryingSession(connect=lambda: Client(faulty_transport(server, faults)), **options)


async def test_a_task_creation_carries_its_key_and_the_task_is_polled(tmp_path: Path) -> None:
    faults = Faults()
    async with retrying(tmp_path, faults) as rs:
        created = await rs.create_task(
            "deploy", {"target": "prod"}, ttl=60_000, idempotency_key="deploy-1"
        )
        assert isinstance(created, TaskCreated) and created.task.ttl == 60_000
        assert rs.last_report is not None and rs.last_report.outcome == "result"
        assert not rs.last_report.replayed
        status = await rs.get_task(created.task.task_id)
        assert status.task_id == created.task.task_id and status.status == "completed"
        result = await rs.task_result(created.task.task_id)
        assert isinstance(result, CallToolResult) and "deployed prod" in str(result.content)
    (tool, params), *polls = faults.requests
    assert [p for p, _ in polls] == ["tasks/get", "tasks/result"]
    assert tool == "deploy" and params["task"] == {"ttl": 60_000}
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
    """`tasks/get` and `tasks/result` of a non-idempotent tool's task: their lost answers (one
    dropped, one with the link cut) are re-sent, on a new session for the cut one: a poll
    changes nothing, so no gate applies."""
    faults = Faults(plan={"tasks/get": ["drop"], "tasks/result": ["kill"]})
    async with retrying(tmp_path, faults, policy=RetryPolicy(attempt_timeout=0.3)) as rs:
        created = await rs.create_task("release", {"target": "c"})
        assert isinstance(created, TaskCreated)
        status = await rs.get_task(created.task.task_id)
        assert status.status == "completed"
        result = await rs.task_result(created.task.task_id)
        assert "deployed c" in str(result.content)
        assert rs.connects == 2
    polls = [tool for tool, _ in faults.requests if tool.startswith("tasks/")]
    assert polls == ["tasks/get", "tasks/get", "tasks/result", "tasks/result"]
    assert len(lines(tmp_path / "effects")) == 1


async def test_bad_task_arguments_are_refused_before_sending(tmp_path: Path) -> None:
    faults = Faults()
    async with retrying(tmp_path, faults) as rs:
        with pytest.raises(ValueError, match="ttl must be a positive"):
            await rs.create_task("deploy", {"target": "a"}, ttl=0)
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
    call; both executions send the same two keys."""
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
            await rs.call_tool("release", {"target": "eu"})
    first, second, again_first, again_second = [p["_meta"][KEY_META] for _, p in faults.requests]
    assert first != second and (again_first, again_second) == (first, second)
    assert lines(tmp_path / "calls") == [f"task {first}", f"plain {second}"] * 2


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
        return Client(faulty_transport(server, faults))

    async with RetryingSession(connect=connect, policy=RetryPolicy(max_attempts=3)) as rs:
        created = await rs.create_task("release", {"target": "d"})
        assert isinstance(created, TaskCreated)
        assert (await rs.get_task(created.task.task_id)).status == "completed"
    assert refusals == [] and faults.kills == 1
