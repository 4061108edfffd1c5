"""Tasks through the gateway (several upstreams on one front, rule 23, SEP-2663): a keyed
task-augmented call of `<server>_<tool>` creates one task on that upstream, guarded as through a
single proxy of it, and the front hands the task out as `<server>_<taskId>`, the id its
`tasks/get`, `tasks/update` and `tasks/cancel` are routed by (`mcp_once/proxy/task_routes.py`):
on every replica, with nothing stored but the record. The upstreams are real task-capable SDK
servers over streamable HTTP (tests/task_server.py), each counting calls, effects and tasks in
its own fsynced ledger; the caller is `RetryingSession` on a real in-memory 2026-07-28 wire
whose answer is lost (`orchestrator.chaos`)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from fastmcp import Client as FastMCPClient
from mcp import Client, MCPError
from mcp_types import METHOD_NOT_FOUND
from proxy_kit import MARKER, NodeServers, proxy_command
from test_proxy_tasks import front, lines, task_upstream

from idempotency import open_store, wire
from mcp_once.proxy import OnceGateway, Upstream, build_gateway, build_proxy
from mcp_once.scenarios import ServerProcess
from mcp_once.scenarios._process import free_port
from orchestrator import (
    TASKS_EXTENSION,
    RetryingSession,
    RetryPolicy,
    TaskCreated,
    TasksExtension,
    ToolCallError,
    streamable_http_transport,
)
from orchestrator.chaos import Chaos, Fault, FaultPlan

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

CHANGING = Path(__file__).parent / "changing_server.py"


@asynccontextmanager
async def two_upstreams(
    tmp_path: Path,
) -> AsyncIterator[tuple[list[Upstream], Path, Path]]:
    """Two task-capable HTTP upstreams, `a` and `b`, and their ledgers."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with (
        task_upstream(tmp_path / "a") as (a, ledger_a),
        task_upstream(tmp_path / "b") as (b, ledger_b),
    ):
        upstreams = [Upstream.http(a.url, name="a"), Upstream.http(b.url, name="b")]
        yield upstreams, ledger_a, ledger_b


async def test_a_lost_create_task_result_resent_through_the_gateway_gets_the_same_task(
    tmp_path: Path,
) -> None:
    """The caller's first `CreateTaskResult` from `a_deploy` is lost after the gateway stored
    it; the client re-sends under the same key: one upstream call, one effect, one task, on `a`
    only, and the re-send's id is `a_<a's task id>`, marked as a replay. The task is polled
    through the front (routed to `a`, the result inlined). The record holds `a`'s own
    `CreateTaskResult`: a single proxy of `a` on the same store replays it with `a`'s own id,
    which that proxy's front polls with."""
    store_url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    async with two_upstreams(tmp_path) as (upstreams, ledger_a, ledger_b):
        gateway = build_gateway(upstreams, open_store(store_url))
        chaos = Chaos(FaultPlan(schedule={1: Fault.LOST_ACK}))
        policy = RetryPolicy(attempt_timeout=2)
        async with (
            gateway.opened(),
            RetryingSession(connect=front(gateway, chaos), policy=policy) as rs,
        ):
            created = await rs.create_task("a_deploy", {"target": "prod"})
            assert isinstance(created, TaskCreated)
            report = rs.last_report
            assert report is not None and report.replayed and len(report.attempts) == 2
            assert (created.meta or {})[MARKER]["status"] == "replayed"
            [own] = lines(ledger_a / "tasks")
            assert created.task_id == f"a_{own}"
            assert (await rs.get_task(created.task_id)).status == "completed"
            result = await rs.task_result(created.task_id)
            assert "deployed prod (#1)" in str(result.content)
            key = (created.meta or {})[MARKER]["key"]
        single = build_proxy(upstreams[0], open_store(store_url))
        async with single.opened(), RetryingSession(connect=front(single)) as direct:
            again = await direct.create_task("deploy", {"target": "prod"}, idempotency_key=key)
            assert isinstance(again, TaskCreated)
            assert again.task_id == own and (again.meta or {})[MARKER]["status"] == "replayed"
            assert (await direct.get_task(own)).status == "completed"
    [call] = lines(ledger_a / "calls")
    assert call.startswith("task mcp-once:")  # the record's upstream key, never the caller's
    assert len(lines(ledger_a / "effects")) == 1 and len(lines(ledger_a / "tasks")) == 1
    assert lines(ledger_b / "calls") == []


async def test_a_second_replica_gets_the_same_task_and_routes_its_requests(
    tmp_path: Path,
) -> None:
    """Two gateways on one store in front of the same two upstreams: the key's task created
    through the first is the second's answer (same front id, a replay); the key with other
    arguments is -32011, and so is a re-send that does not declare the extension, naming the
    task by its front id. `tasks/get`, `tasks/update` and `tasks/cancel` through either replica
    reach the upstream that created the task (`b`'s task polled through the first replica); an id
    that names no upstream, or nothing after the prefix, is -32602 from the front, and an id
    its upstream does not know is that upstream's -32602."""
    store_url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    async with two_upstreams(tmp_path) as (upstreams, ledger_a, ledger_b):
        first = build_gateway(upstreams, open_store(store_url))
        second = build_gateway(upstreams, open_store(store_url))
        async with (
            first.opened(),
            second.opened(),
            RetryingSession(connect=front(first)) as one,
            RetryingSession(connect=front(second)) as two,
            RetryingSession(connect=front(second, tasks=False)) as plain,
        ):
            created = await one.create_task("a_release", {"target": "eu"}, idempotency_key="r-1")
            assert isinstance(created, TaskCreated)
            assert (created.meta or {})[MARKER]["status"] == "executed"
            assert created.task_id == f"a_{lines(ledger_a / 'tasks')[0]}"
            again = await two.create_task("a_release", {"target": "eu"}, idempotency_key="r-1")
            assert isinstance(again, TaskCreated) and again.task_id == created.task_id
            assert (again.meta or {})[MARKER]["status"] == "replayed"
            with pytest.raises(ToolCallError) as caught:
                await two.create_task("a_release", {"target": "us"}, idempotency_key="r-1")
            assert caught.value.code == wire.KEY_REUSED
            with pytest.raises(ToolCallError) as refused:
                await plain.call_tool("a_release", {"target": "eu"}, idempotency_key="r-1")
            assert refused.value.code == wire.KEY_REUSED
            assert refused.value.data["taskId"] == created.task_id
            assert repr(created.task_id) in str(refused.value)
            # The same client key on `b` is b's own record and task.
            on_b = await two.create_task("b_release", {"target": "eu"}, idempotency_key="r-1")
            assert isinstance(on_b, TaskCreated)
            assert on_b.task_id == f"b_{lines(ledger_b / 'tasks')[0]}"
            assert (await one.get_task(on_b.task_id)).task_id == on_b.task_id
            state = await two.get_task(created.task_id)
            assert state.status == "completed" and state.task_id == created.task_id
            await two.update_task(created.task_id, {"r-1": {"action": "accept"}})
            assert await one.cancel_task(created.task_id) is None
            own_b = on_b.task_id.removeprefix("b_")
            for unknown in (f"c_{own_b}", "a_", own_b):
                with pytest.raises(MCPError) as missing:
                    await one.get_task(unknown)
                assert missing.value.error.code == wire.INVALID_PARAMS
                assert missing.value.error.message == f"Task {unknown} not found"
            with pytest.raises(MCPError) as forgotten:
                await two.cancel_task(f"b_{created.task_id}")  # `a`'s task is not b's
            assert forgotten.value.error.code == wire.INVALID_PARAMS
    assert len(lines(ledger_a / "effects")) == 1 and len(lines(ledger_a / "tasks")) == 1
    assert len(lines(ledger_b / "effects")) == 1 and len(lines(ledger_b / "tasks")) == 1
    assert len(lines(ledger_a / "calls")) == 1 and len(lines(ledger_b / "calls")) == 1


async def advertised(gateway: OnceGateway) -> bool:
    """Whether the opened gateway's front advertises the tasks extension."""
    async with FastMCPClient(gateway) as client:
        capabilities = client.server_capabilities
        assert capabilities is not None
        return TASKS_EXTENSION in (capabilities.extensions or {})


async def test_the_front_advertises_tasks_only_when_an_upstream_may_task(
    node_servers: NodeServers, tmp_path: Path
) -> None:
    """The front serves the tasks extension when an upstream advertised it as the gateway
    started (one task upstream among others, or alone: then nothing is prefixed and its ids are
    the upstream's own, as a single proxy hands them out), or when an HTTP upstream could not be
    reached yet (it may, once back). A gateway of upstreams that do not advertise it (an HTTP
    server without tasks, a stdio one: its calls are plain calls) does not, and its front
    answers `tasks/get` as any server without the extension: Method not found."""
    store = open_store(f"sqlite:///{tmp_path / 'keys.sqlite3'}")
    (tmp_path / "plain").mkdir()
    stdio = Upstream.stdio(sys.executable, str(CHANGING), str(tmp_path / "c.ledger"), name="c")
    plain_http = ServerProcess(
        lambda port: node_servers.ledger(tmp_path / "plain", "--port", str(port)),
        log=tmp_path / "plain.log",
    )
    await anyio.to_thread.run_sync(plain_http.start)
    try:
        async with task_upstream(tmp_path) as (upstream, ledger):
            tasking = Upstream.http(upstream.url, name="t")
            plain = Upstream.http(plain_http.url, name="p")
            alone = build_gateway([Upstream.http(upstream.url)], store)
            async with alone.opened(), RetryingSession(connect=front(alone)) as rs:
                assert await advertised(alone)
                created = await rs.create_task("deploy", {"target": "eu"}, idempotency_key="k")
                assert isinstance(created, TaskCreated)
                assert [created.task_id] == lines(ledger / "tasks")
                assert (await rs.get_task(created.task_id)).status == "completed"
            mixed = build_gateway([plain, stdio, tasking], store)
            async with mixed.opened():
                assert await advertised(mixed)
            without = build_gateway([plain, stdio], store)
            async with (
                without.opened(),
                RetryingSession(connect=front(without)) as rs,
            ):
                assert not await advertised(without)
                with pytest.raises(MCPError) as caught:
                    await rs.get_task("p_1")
                assert caught.value.error.code == METHOD_NOT_FOUND
            down = Upstream.http(f"http://127.0.0.1:{free_port()}/mcp", name="down")
            later = build_gateway([plain, down], store)
            async with later.opened():
                assert await advertised(later)
    finally:
        plain_http.kill()


async def test_two_gateway_processes_over_http_hand_out_and_route_one_task(
    tmp_path: Path,
) -> None:
    """Two `mcp-once proxy --listen --config FILE` processes on one store (the gateway's
    replicas as deployed, each its own links), the config naming both task upstreams by URL,
    callers on streamable HTTP: the task created through the first is the second's replay (the
    same front id), and the second polls and cancels it, routed to `a`: one task, one effect."""
    store_url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    async with two_upstreams(tmp_path) as (upstreams, ledger_a, ledger_b):
        config = tmp_path / "gateway.json"
        servers = {u.name: {"url": u.url} for u in upstreams}
        config.write_text(json.dumps({"mcpServers": servers}))

        def replica(port: int) -> list[str]:
            listen = ["--listen", f"127.0.0.1:{port}", "--store", store_url]
            state = f"XDG_STATE_HOME={tmp_path / 'state'}"
            return ["env", state, *proxy_command(*listen, "--config", str(config))]

        replicas = [ServerProcess(replica, log=tmp_path / f"replica-{n}.log") for n in "12"]
        try:
            for process in replicas:
                await anyio.to_thread.run_sync(process.start)

            def over_http(url: str) -> Callable[[], Client]:
                extensions = [TasksExtension()]
                return lambda: Client(streamable_http_transport(url), extensions=extensions)

            async with (
                RetryingSession(connect=over_http(replicas[0].url)) as one,
                RetryingSession(connect=over_http(replicas[1].url)) as two,
            ):
                created = await one.create_task("a_deploy", {"target": "eu"}, idempotency_key="h")
                again = await two.create_task("a_deploy", {"target": "eu"}, idempotency_key="h")
                assert isinstance(created, TaskCreated) and isinstance(again, TaskCreated)
                assert created.task_id == again.task_id == f"a_{lines(ledger_a / 'tasks')[0]}"
                assert (again.meta or {})[MARKER]["status"] == "replayed"
                assert (await two.get_task(created.task_id)).status == "completed"
                assert await two.cancel_task(created.task_id) is None
        finally:
            for process in replicas:
                process.kill()
    assert len(lines(ledger_a / "effects")) == 1 and len(lines(ledger_a / "tasks")) == 1
    assert lines(ledger_b / "calls") == []
