"""Process- and store-level faults: a server killed or frozen mid-tool, Redis restarted or gone.

Each test strikes at a known point (the tool announces itself mid-execution with a progress
notification carrying its pid) and then checks the ledger: the effect happened at most once,
the caller got either the effect's own result or an explicit outcome, and the record can be
reconciled.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx2
import pytest
from mcp import Client
from mcp_types import CallToolResult, TextContent
from redis_server import RedisServer, redis_server_binary  # tests/ is on sys.path (conftest)

from idempotency import RecordState, SQLiteKeyStore, encode_result
from mcp_once.scenarios import (
    Endpoint,
    Ledger,
    Scenario,
    ServerProcess,
    check,
    connect_factory,
    default_plan,
    default_policy,
    open_endpoint,
    open_replicas,
    run_scenario,
    run_workload,
    server_command,
    strays,
)
from orchestrator import (
    CallReport,
    RetryingSession,
    RetryPolicy,
    ServerOutcomeUnknown,
    streamable_http_transport,
)

pytestmark = [pytest.mark.chaos, pytest.mark.anyio]

SOON = 30.0
HOLD = 30.0
LEASE = 1.0

needs_redis_server = pytest.mark.skipif(
    redis_server_binary() is None, reason="redis-server is not on PATH"
)


def text(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def policy(attempt_timeout: float) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=3,
        attempt_timeout=attempt_timeout,
        deadline=60,
        budget=None,
        wait_initial=0.01,
        wait_max=0.05,
        connect_timeout=SOON,
    )


async def call_and_strike(
    rs: RetryingSession,
    tool: str,
    arguments: dict[str, Any],
    strike: Callable[[int], Awaitable[None]],
    key: str | None = None,
) -> tuple[CallToolResult | None, CallReport | None, Exception | None]:
    """Call `tool`; once its first attempt is mid-tool, `strike(pid of that server)`."""
    pids: list[int] = []
    running = anyio.Event()

    async def progress(done: float, total: float | None, message: str | None) -> None:
        if not pids and message:
            pids.append(int(message.split()[0]))
            running.set()

    outcome: list[Any] = [None, None, None]
    with anyio.fail_after(SOON * 2):
        async with anyio.create_task_group() as tg:

            async def striker() -> None:
                await running.wait()
                await strike(pids[0])

            tg.start_soon(striker)
            try:
                outcome[0], outcome[1] = await rs.call_tool_with_report(
                    tool, arguments, progress_callback=progress, idempotency_key=key
                )
            except Exception as exc:
                outcome[2] = exc
            tg.cancel_scope.cancel()
    assert running.is_set(), "the first attempt never reached the tool"
    return outcome[0], outcome[1], outcome[2]


async def ledger_event(ledger: Ledger, kind: str, pid: int) -> None:
    """Wait (bounded) until process `pid` wrote event `kind`: another process's progress."""
    with anyio.fail_after(SOON):
        # Another process writes it: a bounded poll of the shared file is the only signal.
        while not any(p == pid for _, _, p in ledger.events(kind)):  # noqa: ASYNC110
            await anyio.sleep(0.05)


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path.resolve()}"


@asynccontextmanager
async def held_server(
    transport: str, ledger: Ledger, keys: Path
) -> AsyncIterator[tuple[Endpoint, RetryingSession]]:
    """A guarded server whose first attempts hold mid-tool, and a session to it."""
    async with (
        open_endpoint(
            transport,  # type: ignore[arg-type]
            "modern",
            ledger,
            sqlite_url(keys),
            lease=LEASE,
            wait=5.0,
            hold=HOLD,
        ) as endpoint,
        RetryingSession(connect=connect_factory(endpoint), policy=policy(10)) as rs,
    ):
        yield endpoint, rs


# -- kill -9 mid-tool -------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_kill_mid_payment_leaves_one_effect_and_an_explicit_unknown(
    tmp_path: Path, transport: str
) -> None:
    """The server dies after the payment, before its record is stored. The retry (a new
    process) must not pay again: the lease runs out and the record turns UNKNOWN (-32012), the
    caller gets ServerOutcomeUnknown, and the operator settles it; the settled result replays."""
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    keys = tmp_path / "keys.sqlite3"
    arguments = {"call_id": "kill-pay", "account": "acct-a", "cents": 1234}
    async with held_server(transport, ledger, keys) as (endpoint, rs):

        async def kill(pid: int) -> None:
            await endpoint.restart()

        result, _, error = await call_and_strike(rs, "pay", arguments, kill)
        assert result is None and isinstance(error, ServerOutcomeUnknown)
        assert error.code == -32012
        assert error.report is not None
        assert [a.failure for a in error.report.attempts] == ["maybe_executed", "permanent"]
        effects = ledger.by_call()["kill-pay"]
        assert len(effects) == 1  # paid once, before the kill; never again

        # Reconcile: the record is UNKNOWN; the operator settles it with the ledger's truth.
        store = SQLiteKeyStore(keys)
        try:
            unknown = await store.list_records(state=RecordState.UNKNOWN)
            assert len(unknown) == 1
            # The tool has an output schema ({"result": str}): a settled result must carry
            # the structured form too, or the SDK refuses to return it on replay.
            truth = effects[0].result
            settled = CallToolResult(
                content=[TextContent(type="text", text=truth)],
                structured_content={"result": truth},
            )
            assert await store.settle(
                unknown[0].key, result=encode_result(settled, time.time()), retention=600
            )
        finally:
            await store.aclose()
        replay, report = await rs.call_tool_with_report("pay", arguments, idempotency_key=error.key)
        assert report.replayed and text(replay) == effects[0].result, replay
    assert len(ledger.by_call()["kill-pay"]) == 1
    print(f"[kill -9 {transport}] pay: effects=1 outcome=ServerOutcomeUnknown, settled, replayed")


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_kill_mid_write_is_taken_over_and_completes(tmp_path: Path, transport: str) -> None:
    """A naturally idempotent tool: after the lease runs out, the retry takes the record over
    and runs it again (harmless by its nature), and the caller gets that run's result."""
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    arguments = {"call_id": "kill-set", "name": "colour", "value": 7}
    async with held_server(transport, ledger, tmp_path / "keys.sqlite3") as (endpoint, rs):

        async def kill(pid: int) -> None:
            await endpoint.restart()

        result, report, error = await call_and_strike(rs, "set_value", arguments, kill)
    assert error is None and result is not None and report is not None
    assert [a.failure for a in report.attempts] == ["maybe_executed", None]
    effects = ledger.by_call()["kill-set"]
    assert len(effects) == 2 and effects[0].pid != effects[1].pid
    assert text(result) == effects[1].result and not report.replayed
    print(f"[kill -9 {transport}] set_value: effects=2 (takeover) result=the second run's")


# -- SIGSTOP past the lease, a second replica sharing Redis --------------------------------------


class Router(httpx2.AsyncBaseTransport):
    """A client-side load balancer: every request goes to the current replica's port."""

    def __init__(self, target: ServerProcess) -> None:
        self.target = target
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.url = request.url.copy_with(port=self.target.port)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


@asynccontextmanager
async def replicas(ledger: Ledger, store_url: str) -> AsyncIterator[tuple[ServerProcess, ...]]:
    made = tuple(
        ServerProcess(
            lambda port, name=name: server_command(  # type: ignore[misc]
                "http", ledger, store_url, port=port, lease=LEASE, wait=5.0, hold=HOLD
            ),
            log=ledger.path.with_suffix(f".{name}.log"),
        )
        for name in ("a", "b")
    )
    try:
        for process in made:
            await anyio.to_thread.run_sync(process.start)
        yield made
    finally:
        for process in made:
            await anyio.to_thread.run_sync(process.stop)


@pytest.mark.redis
@pytest.mark.parametrize(("tool", "taken_over"), [("pay", False), ("set_value", True)])
async def test_frozen_replica_past_its_lease(
    tmp_path: Path, redis_url: str, tool: str, taken_over: bool
) -> None:
    """Replica A is frozen (SIGSTOP) mid-tool; the retry reaches replica B (same Redis) after
    A's lease ran out. Payment: UNKNOWN, never a second charge. Write: B takes over and runs it.
    Then A wakes up: its renewal finds its claim gone, it is cancelled and changes nothing."""
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    call_id = f"freeze-{tool}"
    arguments: dict[str, Any] = (
        {"call_id": call_id, "account": "acct-b", "cents": 500}
        if tool == "pay"
        else {"call_id": call_id, "name": "mode", "value": 3}
    )
    async with replicas(ledger, redis_url) as (a, b):
        a_pid, b_pid = a.pid, b.pid
        router = Router(a)

        def connect() -> Client:
            return Client(streamable_http_transport(a.url, inner=router))

        async with RetryingSession(connect=connect, policy=policy(2.5)) as rs:

            async def freeze(pid: int) -> None:
                assert pid == a_pid
                a.pause()
                router.target = b

            result, report, error = await call_and_strike(rs, tool, arguments, freeze)
            a.resume()
            await ledger_event(ledger, "finished", pid=a_pid or 0)  # A woke up and was cancelled
            router.target = b
            again: Exception | None = None
            try:
                replay, replay_report = await rs.call_tool_with_report(
                    tool,
                    arguments,
                    idempotency_key=(report or error).key,  # type: ignore[union-attr]
                )
            except ServerOutcomeUnknown as exc:
                again = exc
    effects = ledger.by_call()[call_id]
    if taken_over:
        assert error is None and result is not None and report is not None
        assert len(effects) == 2 and effects[0].pid == a_pid and effects[1].pid == b_pid
        assert text(result) == effects[1].result
        assert again is None and replay_report.replayed and text(replay) == effects[1].result
    else:
        assert isinstance(error, ServerOutcomeUnknown) and error.code == -32012
        assert len(effects) == 1 and effects[0].pid == a_pid
        assert isinstance(again, ServerOutcomeUnknown)  # the stale worker changed nothing
    print(f"[SIGSTOP {tool}] effects={len(effects)} taken_over={taken_over}")


# -- leases under slow tools -----------------------------------------------------------------


async def test_slow_tool_keeps_its_lease_and_the_retry_replays(tmp_path: Path) -> None:
    """The tool runs four times longer than its lease; renewals keep the claim. The client's
    first attempt times out at 1.5 s, its retry waits on the server for the running one and
    replays its result at 2 s. No takeover, one effect."""
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    arguments = {"call_id": "slow-pay", "account": "acct-c", "cents": 42}
    async with (
        open_endpoint(
            "memory",
            "modern",
            ledger,
            sqlite_url(tmp_path / "keys.sqlite3"),
            lease=0.5,
            wait=10.0,
            hold=2.0,
        ) as endpoint,
        RetryingSession(connect=connect_factory(endpoint), policy=policy(1.5)) as rs,
    ):

        async def nothing(pid: int) -> None:
            return None

        result, report, error = await call_and_strike(rs, "pay", arguments, nothing)
    assert error is None and result is not None and report is not None
    assert report.attempts[0].failure == "maybe_executed" and report.replayed
    effects = ledger.by_call()["slow-pay"]
    assert len(effects) == 1 and text(result) == effects[0].result


# -- Redis restarted (AOF) and Redis unreachable mid-run ---------------------------------------


@needs_redis_server
async def test_redis_restart_mid_run_keeps_every_record(tmp_path: Path) -> None:
    """redis-server (appendonly, fsync always) is killed -9 and restarted while calls run:
    calls that meet it get STORE_UNAVAILABLE and are retried, and every result stored before
    the crash still replays after it."""
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    with RedisServer(appendonly=True) as redis:
        async with open_endpoint("memory", "modern", ledger, redis.url, lease=3.0) as endpoint:

            def crash_and_restart() -> None:
                redis.kill()  # SIGKILL: only what AOF (fsync always) acknowledged survives
                redis.start()

            async def restart() -> None:
                await anyio.to_thread.run_sync(crash_and_restart)

            run = await run_workload(
                endpoint,
                mode="mcp-once",
                ledger=ledger,
                plan=default_plan(scale=0.5),
                seed=21,
                calls=150,
                policy=default_policy(attempt_timeout=0.3),
                concurrency=4,
                actions={50: restart},
            )
            run.extra_faults["redis_restart"] = 1
            report = check(run)
            # Durability: results stored before the restart replay after it.
            before = [r for r in run.records[:45] if r.outcome == "result" and r.tool == "pay"]
            assert before
            executions = len(ledger.effects())
            async with RetryingSession(connect=connect_factory(endpoint)) as rs:
                for record in before:
                    replay, replay_report = await rs.call_tool_with_report(
                        "pay", dict(record.spec.arguments), idempotency_key=record.key
                    )
                    assert replay_report.replayed and text(replay) == record.result
    print(report.summary(), report.attempt_failures)
    assert report.ok and report.problems == [] and report.unexplained == 0
    assert len(ledger.effects()) == executions  # the replays above ran nothing


@needs_redis_server
async def test_store_unreachable_for_a_while(tmp_path: Path) -> None:
    """Redis is gone for calls 40-69: guarded tools are refused with STORE_UNAVAILABLE (never
    run unprotected), retried, and end NotExecuted at worst; nothing is duplicated."""
    with RedisServer(appendonly=True) as redis:

        async def down() -> None:
            await anyio.to_thread.run_sync(redis.stop)

        async def up() -> None:
            await anyio.to_thread.run_sync(redis.start)

        scenario = Scenario(
            transport="memory",
            calls=120,
            seed=5,
            store_url=redis.url,
            plan=default_plan(scale=0.5),
            policy=default_policy(attempt_timeout=0.3),
            lease=3.0,
        )
        report = await run_scenario(scenario, "mcp-once", tmp_path, actions={40: down, 70: up})
    report.faults["store_outage"] = 1
    print(report.summary(), report.attempt_failures)
    assert report.attempt_failures.get("store_unavailable", 0) > 0
    assert report.not_executed > 0 and report.reconciled > 0
    assert report.ok and report.problems == [] and report.unexplained == 0


# -- two replicas on one Redis: Redis gone during completions, then a frozen worker -------------

REPLICA_LEASE = 3.0
#: Redis is down this long (a third of the lease) while tools are finishing.
OUTAGE = 1.0
#: Each first attempt of a payment or a write holds this long after its effect, so that faults
#: find tools mid-run and their completions in the outage.
TOOL_TIME = 0.2


async def mid_tool(ledger: Ledger, pid: int | None = None) -> None:
    """Until a tool (on process `pid`, or any) is in the middle of its run: a new `started`."""
    await ledger.next_event("started", pid=pid, timeout=SOON)


def log_lines(ledger: Ledger, replica: int, text: str) -> int:
    log = ledger.path.with_suffix(f".replica-{replica}.log")
    return sum(text in line for line in log.read_text(errors="replace").splitlines())


@needs_redis_server
@pytest.mark.slow
async def test_replicas_with_a_store_outage_during_completions_and_a_frozen_worker(
    tmp_path: Path,
) -> None:
    """Two HTTP replicas on one Redis (AOF). As tools are finishing, Redis is killed for a third
    of the lease and restarted: completions keep their claim and retry, so nothing is given up.
    Later replica 0 is frozen (SIGSTOP) mid-tool for longer than its lease and taken out of
    rotation, then thawed. Checked: no duplicate, no lost result; every record left UNKNOWN, or
    IN_PROGRESS with nobody running (it turns UNKNOWN at the next retry), and every tool run
    twice, belongs to a key the frozen replica had seen — none to a worker that stayed alive."""
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    with RedisServer(appendonly=True) as redis:
        async with open_replicas(
            ledger, redis.url, lease=REPLICA_LEASE, wait=10.0, hold=TOOL_TIME
        ) as replicas:
            frozen_pid = replicas.pids()[0]

            async def redis_outage() -> None:
                await mid_tool(ledger)
                await anyio.to_thread.run_sync(redis.kill)
                await anyio.sleep(OUTAGE)  # the fault's own length
                await anyio.to_thread.run_sync(redis.start)

            async def freeze() -> None:
                await mid_tool(ledger, frozen_pid)
                await replicas.freeze(0)
                await anyio.sleep(REPLICA_LEASE + 1)  # the pause outlasts the lease
                await replicas.thaw(0)

            run = await run_workload(
                replicas,
                mode="mcp-once",
                ledger=ledger,
                plan=default_plan(scale=0.5),
                seed=11,
                calls=120,
                policy=default_policy(attempt_timeout=1.0),
                concurrency=4,
                actions={20: redis_outage, 70: freeze},
            )
            run.extra_faults.update(redis_outage=1, frozen_replica=1)
            report = check(run)
            # After the run nothing runs: an IN_PROGRESS record is an orphan.
            left = await strays(replicas, run, redis.url)
    retried = [log_lines(ledger, n, "could not store the result") for n in (0, 1)]
    given_up = [log_lines(ledger, n, "gave up storing the result") for n in (0, 1)]
    print(report.summary(), report.attempt_failures)
    print(
        f"[replicas] records left UNKNOWN/IN_PROGRESS: {len(left.orphans)} (keys the frozen"
        f" replica saw: {len(left.orphans) - len(left.orphans_alive)}, live workers':"
        f" {len(left.orphans_alive)}); tools run twice: {len(left.twice)} (live workers':"
        f" {len(left.twice_alive)}); completion retries logged per replica: {retried};"
        f" results given up: {given_up}"
    )
    assert report.ok and report.problems == [] and report.unexplained == 0
    assert left.orphans_alive == [] and left.twice_alive == []
    assert sum(retried) > 0  # the outage did meet completions, and they were retried
    assert given_up[1] == 0  # the replica that was never frozen gave no result up
