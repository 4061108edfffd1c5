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
from fastmcp import Client as FastMCPClient
from fastmcp.client.transports import StreamableHttpTransport
from mcp import Client, MCPError
from mcp_types import (
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    ElicitResult,
    InputRequiredResult,
)
from proxy_kit import KEY, MARKER, announced, http_url, proxy_command
from redis_server import RedisServer

from idempotency import open_store, wire
from mcp_once.proxy import ProxyPolicy, Upstream, build_proxy
from mcp_once.proxy.middleware import UNGUARDED
from mcp_once.proxy.policy import ToolRule
from mcp_once.scenarios import ServerProcess
from orchestrator import (
    TASKS_EXTENSION,
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
            assert await one.cancel_task(created.task_id) is None
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


async def test_a_call_the_proxy_does_not_claim_goes_upstream_declaring_the_extension(
    tmp_path: Path,
) -> None:
    """A call to a tool the policy passes through, whose caller declared the tasks extension,
    goes upstream on the session that declares it too, so the upstream tasks it: the caller
    gets the upstream's own `CreateTaskResult` (no guard marker), nothing is stored for the
    call, and the task is the caller's to poll through the proxy (its id recorded as the
    caller's). The upstream checks `Mcp-Name` on the forwarded `tasks/get`."""
    store_url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    store = open_store(store_url)
    policy = ProxyPolicy((ToolRule("deploy", guard=False),))
    async with task_upstream(tmp_path) as (upstream, ledger):
        proxy = build_proxy(Upstream.http(upstream.url), store, policy=policy)
        async with proxy.opened(), RetryingSession(connect=front(proxy)) as rs:
            created = await rs.create_task("deploy", {"target": "eu"}, idempotency_key="pt-1")
            assert isinstance(created, TaskCreated), created
            assert MARKER not in (created.meta or {})  # the upstream's answer, as it came
            assert lines(ledger / "tasks") == [created.task_id]
            assert (await rs.get_task(created.task_id)).status == "completed"
            result = await rs.task_result(created.task_id)
            assert "deployed eu (#1)" in str(result.content)
    assert lines(ledger / "calls") == ["task pt-1"]  # the caller's own key, passed on
    assert await store.list_records(tool="deploy") == []


@pytest.mark.parametrize("path", ["plain", "declaring tasks"])
async def test_a_pass_through_after_a_handshake_upstream_restarts_is_sent_again(
    path: str, tmp_path: Path
) -> None:
    """A stateful upstream of the handshake era only (FastMCP's, `changing_server.py legacy`),
    SIGKILLed and started again on its port: it no longer knows the link's sessions and refuses
    the next request on one with HTTP 404, before running anything. A 2026-07-28 caller's call
    the proxy passes through goes once more on a new session and runs once, whether the
    caller declared the tasks extension (the link's task-declaring session, itself a handshake
    one against this upstream: `UpstreamLink.pass_task`) or not (on main the declaring caller
    got the 404's "Session not found"). The caller's client never re-sends (the SDK's own)."""
    ledger = tmp_path / "effects"
    script = str(Path(__file__).parent / "changing_server.py")
    upstream = ServerProcess(
        lambda port: [sys.executable, script, str(ledger), str(port), "legacy"]
    )
    await anyio.to_thread.run_sync(upstream.start)
    try:
        policy = ProxyPolicy((ToolRule("write", guard=False),))
        proxy = build_proxy(Upstream.http(upstream.url), open_store("memory://"), policy=policy)
        async with proxy.opened(), front(proxy, tasks=path != "plain")() as client:
            first = await client.call_tool("write", {"text": "a"})
            assert not first.is_error, first
            await anyio.to_thread.run_sync(upstream.kill)
            await anyio.to_thread.run_sync(upstream.start)
            for text in ("b", "c"):
                again = await client.call_tool("write", {"text": text})
                assert not again.is_error and f"wrote {text}" in str(again.content), again
    finally:
        upstream.kill()
    assert lines(ledger) == ["a", "b", "c"]


async def test_task_requests_need_the_declaration_and_a_matching_round(
    tmp_path: Path,
) -> None:
    """`tasks/get|update|cancel` from a caller that did not declare the extension are answered
    by the proxy -32021 (as a server answers them), never forwarded; a keyed task creation
    whose upstream asks first carries the caller's continuation (`inputResponses`,
    `requestState`) under the same key: the question is never stored (rule 8), the
    continuation creates the one task."""
    store_url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    async with task_upstream(tmp_path) as (upstream, ledger):
        proxy = build_proxy(Upstream.http(upstream.url), open_store(store_url))
        async with (
            proxy.opened(),
            RetryingSession(connect=front(proxy)) as rs,
            RetryingSession(connect=front(proxy, tasks=False)) as plain,
        ):
            asked = await rs.create_task(
                "approve", {"target": "eu"}, idempotency_key="ap-1", allow_input_required=True
            )
            assert isinstance(asked, InputRequiredResult), asked
            assert asked.input_requests is not None and "ok" in asked.input_requests
            assert lines(ledger / "tasks") == []
            created = await rs.create_task(
                "approve",
                {"target": "eu"},
                idempotency_key="ap-1",
                input_responses={"ok": ElicitResult(action="accept", content={})},
                request_state=asked.request_state,
                allow_input_required=True,
            )
            assert isinstance(created, TaskCreated), created
            assert (created.meta or {})[MARKER]["status"] == "executed"
            for refused in (
                plain.get_task(created.task_id),
                plain.update_task(created.task_id, {"ok": {"action": "accept"}}),
                plain.cancel_task(created.task_id),
            ):
                with pytest.raises(MCPError) as caught:
                    await refused
                assert caught.value.code == MISSING_REQUIRED_CLIENT_CAPABILITY
                assert caught.value.error.data == {
                    "requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}
                }
    assert lines(ledger / "tasks") == [created.task_id]
    assert len(lines(ledger / "effects")) == 1
    assert [c.split()[0] for c in lines(ledger / "calls")] == ["task", "task"]


def _caller(url: str, token: str) -> Callable[[], Any]:
    """A connect factory: a FastMCP client of the proxy at `url` over streamable HTTP, as the
    principal of `token`, declaring the tasks extension."""

    def connect() -> Any:
        headers = {"Authorization": f"Bearer {token}"}
        transport = StreamableHttpTransport(url, headers=headers)
        return FastMCPClient(transport, extensions=[TasksExtension()])

    return connect


async def test_a_task_is_given_only_to_the_principal_that_created_it_on_every_replica(
    tmp_path: Path,
) -> None:
    """Two `mcp-once proxy --listen` replicas on one store, each principal authenticated by
    its token: alice's task, created through the first, is alice's to poll, update and cancel
    through the second (the owner record is in the store, not in a process); bob, who knows
    its id, gets "Task ... not found" for each (as for a task that does not exist), and so
    does anyone for an id the proxy never handed out; nothing of bob's reaches the upstream
    (the task is still alice's, uncancelled)."""
    store_url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    tokens = tmp_path / "tokens"
    tokens.write_text("alice alice-token-0123456789abcdef\nbob bob-token-0123456789abcdef\n")
    tokens.chmod(0o600)
    alice, bob = "alice-token-0123456789abcdef", "bob-token-0123456789abcdef"
    async with task_upstream(tmp_path) as (upstream, ledger):
        args = ["--store", store_url, "--listen", "127.0.0.1:0", "--auth-tokens", str(tokens)]
        command = proxy_command(*args, "--upstream", upstream.url)
        with (
            announced(command, "mcp-once proxy at ") as first,
            announced(command, "mcp-once proxy at ") as second,
        ):
            one, two = http_url(first), http_url(second)
            async with (
                RetryingSession(connect=_caller(one, alice)) as alice_one,
                RetryingSession(connect=_caller(two, alice)) as alice_two,
                RetryingSession(connect=_caller(two, bob)) as bob_two,
            ):
                created = await alice_one.create_task(
                    "deploy", {"target": "eu"}, idempotency_key="own-1"
                )
                assert isinstance(created, TaskCreated), created
                task_id = created.task_id
                for attempt in (
                    bob_two.get_task(task_id),
                    bob_two.update_task(task_id, {"r": {"action": "accept"}}),
                    bob_two.cancel_task(task_id),
                    alice_two.get_task("never-handed-out"),
                ):
                    with pytest.raises(MCPError) as caught:
                        await attempt
                    assert caught.value.code == INVALID_PARAMS
                    assert "not found" in caught.value.error.message
                assert (await alice_two.get_task(task_id)).status == "completed"
                await alice_two.update_task(task_id, {"r": {"action": "accept"}})
                assert await alice_two.cancel_task(task_id) is None
    assert lines(ledger / "tasks") == [task_id]


async def test_a_task_request_whose_owner_cannot_be_read_is_retry_later(tmp_path: Path) -> None:
    """The owner record lives in the store: with the store (a real redis-server) stopped, a
    `tasks/get` of the caller's own task is -32013 (retry later), not forwarded and not
    guessed; with the store back, the same request answers."""
    with RedisServer(appendonly=True) as redis:
        async with task_upstream(tmp_path) as (upstream, _):
            proxy = build_proxy(Upstream.http(upstream.url), open_store(redis.url))
            async with proxy.opened(), RetryingSession(connect=front(proxy)) as rs:
                created = await rs.create_task("deploy", {"target": "eu"}, idempotency_key="r-1")
                assert isinstance(created, TaskCreated), created
                redis.stop()
                with pytest.raises(MCPError) as caught:
                    await rs.get_task(created.task_id)
                assert caught.value.code == wire.STORE_UNAVAILABLE
                redis.start()
                assert (await rs.get_task(created.task_id)).status == "completed"
