"""Guarded tools in real server processes: stdio, processes racing on one Redis, a process killed
mid-tool, a process paused past its lease. Effects are counted in a SQLite ledger the tool writes
(it survives SIGKILL); the test synchronises through helper tools, never by sleeping. Waiting for
a 1 s lease to run out is inherent and happens inside the server's own bounded wait."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import MCPError
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import CallToolResult
from server_kit import answer, body, marker, meta, record_key

from idempotency import (
    RecordState,
    RedisKeyStore,
    SQLiteKeyStore,
    decode_result,
    in_doubt_records,
    wire,
)
from mcp_once._cli import _common, _grace, main

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from fenced_write import FencedTable  # the README's example provider

pytestmark = pytest.mark.anyio

SCRIPT = Path(__file__).with_name("effect_server.py")
#: Process start-up (Python + the SDK) on a loaded 2-core machine can take a few seconds.
STARTUP_BOUND = 120.0


def server_params(
    store: str,
    ledger: Path,
    *,
    gated: bool = False,
    lease: float = 30.0,
    wait: float = 10.0,
    prefix: str | None = None,
    provider: Path | None = None,
    metrics: bool = False,
) -> StdioServerParameters:
    args = [str(SCRIPT), "--store", store, "--ledger", str(ledger)]
    args += ["--lease", str(lease), "--wait", str(wait)]
    if gated:
        args.append("--gated")
    if prefix is not None:
        args += ["--redis-prefix", prefix]
    if provider is not None:
        args += ["--provider", str(provider)]
    if metrics:
        args.append("--metrics")
    # The child gets a minimal environment; the venv's interpreter finds the package itself.
    return StdioServerParameters(command=sys.executable, args=args, env={"PYTHONUNBUFFERED": "1"})


def ledger_rows(path: Path, order: str) -> dict[str, list[int]]:
    """pids per phase for one order."""
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT phase, pid FROM effects WHERE order_id = ? ORDER BY id", (order,)
        ).fetchall()
    found: dict[str, list[int]] = {"started": [], "done": []}
    for phase, pid in rows:
        found[phase].append(pid)
    return found


async def pid_of(client: Client, started: int = 1) -> int:
    result = await client.call_tool("wait_started", {"count": started})
    assert result.structured_content is not None
    return int(result.structured_content["result"])


@asynccontextmanager
async def doomed(params: StdioServerParameters) -> AsyncIterator[Client]:
    """A client of a process the test will kill: its connection error on exit is expected."""
    try:
        async with Client(params) as client:
            yield client
    except Exception as exc:  # the transport of a killed child fails on close
        if not _only_connection_errors(exc):
            raise


@asynccontextmanager
async def frozen_mid_call(
    client: Client, tool: str, args: dict[str, Any], key: str
) -> AsyncIterator[tuple[int, list[CallToolResult]]]:
    """Call `tool` through `client`; once it has started in that server process, freeze the
    process (SIGSTOP). Yields its pid and the list the call's late answer will land in. When the
    block ends the process is resumed (SIGCONT), its gate opened, and the late answer awaited."""
    late: list[CallToolResult] = []
    async with anyio.create_task_group() as tg:

        async def call() -> None:
            late.append(await client.call_tool(tool, args, meta=meta(key)))

        tg.start_soon(call)
        pid = await pid_of(client)
        os.kill(pid, signal.SIGSTOP)
        try:
            yield pid, late
        finally:
            os.kill(pid, signal.SIGCONT)
        await client.call_tool("open_gate")


async def killed_mid_call(params: StdioServerParameters, order: str, key: str) -> int:
    """Call `effect(order)` under `key` on a (gated) server process started with `params`, and
    SIGKILL the process once the tool started there. Its pid."""
    async with doomed(params) as a, anyio.create_task_group() as tg:

        async def doomed_call() -> None:
            with pytest.raises(MCPError):
                await a.call_tool("effect", {"order": order}, meta=meta(key))

        tg.start_soon(doomed_call)
        pid = await pid_of(a)
        os.kill(pid, signal.SIGKILL)
    return pid


def _only_connection_errors(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_connection_errors(e) for e in exc.exceptions)
    return isinstance(
        exc, MCPError | OSError | anyio.BrokenResourceError | anyio.ClosedResourceError
    )


async def test_stdio_lost_ack(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    params = server_params(str(tmp_path / "keys.db"), ledger, gated=True)
    lost: list[CallToolResult] = []
    with anyio.fail_after(STARTUP_BOUND):
        async with Client(params) as client:
            async with anyio.create_task_group() as tg:
                scopes: list[anyio.CancelScope] = []

                async def first() -> None:
                    with anyio.CancelScope() as abandon:
                        scopes.append(abandon)
                        lost.append(
                            await client.call_tool("effect", {"order": "A"}, meta=meta("s-1"))
                        )

                tg.start_soon(first)
                pid = await pid_of(client)
                scopes[0].cancel()  # the client gives up: notifications/cancelled goes out
            await client.call_tool("open_gate")
            retry = await client.call_tool("effect", {"order": "A"}, meta=meta("s-1"))
            again = await client.call_tool("effect", {"order": "A"}, meta=meta("s-1"))
    assert lost == []
    assert ledger_rows(ledger, "A") == {"started": [pid], "done": [pid]}
    assert marker(retry)["status"] == "replayed"
    assert body(retry)["content"][0]["text"] == f"order A: execution 1 by process {pid}"
    assert answer(again) == answer(retry)


@pytest.mark.redis
async def test_two_processes_share_redis_and_race_on_one_key(
    tmp_path: Path, redis_url: str, redis_namespace: str
) -> None:
    ledger = tmp_path / "ledger.db"
    params = server_params(redis_url, ledger, gated=True, prefix=redis_namespace)
    results: dict[str, CallToolResult] = {}
    with anyio.fail_after(STARTUP_BOUND):
        async with Client(params) as a, Client(params) as b, anyio.create_task_group() as calls:

            async def call(name: str, client: Client) -> None:
                results[name] = await client.call_tool(
                    "effect", {"order": "R"}, meta=meta("race-1")
                )

            calls.start_soon(call, "a", a)
            calls.start_soon(call, "b", b)
            # Whichever process won the claim reports that its tool started.
            async with anyio.create_task_group() as first_to_start:

                async def watch(client: Client) -> None:
                    await pid_of(client)
                    first_to_start.cancel_scope.cancel()

                first_to_start.start_soon(watch, a)
                first_to_start.start_soon(watch, b)
            await a.call_tool("open_gate")
            await b.call_tool("open_gate")
    rows = ledger_rows(ledger, "R")
    assert len(rows["started"]) == 1
    assert rows["done"] == rows["started"]
    assert answer(results["a"]) == answer(results["b"])
    assert sorted(marker(r)["status"] for r in results.values()) == ["executed", "replayed"]


async def test_process_killed_mid_tool(tmp_path: Path) -> None:
    """SIGKILL while two tools run. After the 1 s lease: the default policy answers
    OUTCOME_UNKNOWN; the naturally idempotent tool is taken over and runs exactly once more."""
    ledger = tmp_path / "ledger.db"
    keys = str(tmp_path / "keys.db")
    victim = server_params(keys, ledger, gated=True, lease=1.0, wait=10.0)
    survivor = server_params(keys, ledger, lease=1.0, wait=10.0)
    with anyio.fail_after(STARTUP_BOUND):
        async with Client(survivor) as b:
            async with doomed(victim) as a, anyio.create_task_group() as tg:

                async def doomed_call(tool: str, order: str) -> None:
                    with pytest.raises(MCPError):
                        await a.call_tool(tool, {"order": order}, meta=meta(f"kill-{order}"))

                tg.start_soon(doomed_call, "effect", "K1")
                tg.start_soon(doomed_call, "reentrant_effect", "K2")
                victim_pid = await pid_of(a, started=2)
                os.kill(victim_pid, signal.SIGKILL)
            with pytest.raises(MCPError) as unknown:
                await b.call_tool("effect", {"order": "K1"}, meta=meta("kill-K1"))
            taken = await b.call_tool("reentrant_effect", {"order": "K2"}, meta=meta("kill-K2"))
            replay = await b.call_tool("reentrant_effect", {"order": "K2"}, meta=meta("kill-K2"))
    assert unknown.value.code == wire.OUTCOME_UNKNOWN
    assert unknown.value.error.data == {"key": "kill-K1"}
    assert ledger_rows(ledger, "K1") == {"started": [victim_pid], "done": []}
    rows = ledger_rows(ledger, "K2")
    assert rows["started"][0] == victim_pid
    assert len(rows["started"]) == 2
    assert len(rows["done"]) == 1
    survivor_pid = rows["done"][0]
    assert survivor_pid != victim_pid
    assert marker(taken)["status"] == "executed"
    assert marker(taken)["attempts"] == 2
    assert body(taken)["content"][0]["text"] == f"order K2: execution 1 by process {survivor_pid}"
    assert marker(replay)["status"] == "replayed"
    assert answer(replay) == answer(taken)


@pytest.mark.redis
async def test_paused_worker_changes_nothing(
    tmp_path: Path, redis_url: str, redis_namespace: str
) -> None:
    """SIGSTOP a worker past its 1 s lease; another replica takes the (naturally idempotent)
    tool over and answers. After SIGCONT the paused worker's late finish changes nothing: every
    client, its own included, sees the new owner's result."""
    ledger = tmp_path / "ledger.db"
    paused = server_params(
        redis_url, ledger, gated=True, lease=1.0, wait=10.0, prefix=redis_namespace
    )
    other = server_params(redis_url, ledger, lease=1.0, wait=10.0, prefix=redis_namespace)
    args: dict[str, Any] = {"order": "P"}
    with anyio.fail_after(STARTUP_BOUND):
        async with Client(paused) as a, Client(other) as b:
            frozen = frozen_mid_call(a, "reentrant_effect", args, "pause-1")
            async with frozen as (paused_pid, late):
                taken = await b.call_tool("reentrant_effect", args, meta=meta("pause-1"))
            replay_a = await a.call_tool("reentrant_effect", args, meta=meta("pause-1"))
            replay_b = await b.call_tool("reentrant_effect", args, meta=meta("pause-1"))
    new_owner = ledger_rows(ledger, "P")["started"][1]
    assert new_owner != paused_pid
    assert body(taken)["content"][0]["text"] == f"order P: execution 1 by process {new_owner}"
    assert marker(taken)["status"] == "executed"
    # The paused worker's own client got the new owner's answer, not its own.
    assert [body(r) for r in late] == [body(taken)]
    assert answer(replay_a) == answer(taken)
    assert answer(replay_b) == answer(taken)
    store = RedisKeyStore.from_url(redis_url, prefix=redis_namespace)
    try:
        record = await store.get(record_key("effects", "reentrant_effect", "pause-1"))
    finally:
        await store.aclose()
    assert record is not None and record.result is not None
    assert body(decode_result(record.result).result) == body(taken)


@pytest.mark.redis
async def test_a_paused_workers_late_write_is_refused_by_its_fence(
    tmp_path: Path,
    redis_url: str,
    redis_namespace: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue #11's double charge, replayed with the fence. Worker A is frozen (SIGSTOP) inside
    the blocking step that writes to the provider. Its lease runs out; the retry on worker B
    finds the record UNKNOWN. The operator follows the README: `keys settle --failed` is refused
    within the grace period (A may be paused, not dead); `--force` settles; the next retry runs
    on B with fence 2 and writes. Then A resumes and finishes its step with fence 1: the
    provider refuses it. One write stands; A's own caller gets B's answer."""
    ledger, provider = tmp_path / "ledger.db", tmp_path / "provider.db"
    common: dict[str, Any] = {"lease": 1.0, "wait": 10.0, "prefix": redis_namespace}
    paused = server_params(redis_url, ledger, gated=True, provider=provider, **common)
    other = server_params(redis_url, ledger, provider=provider, **common)
    monkeypatch.setattr(
        _common, "open_store", lambda url: RedisKeyStore.from_url(url, prefix=redis_namespace)
    )
    settle = ["keys", "settle", "--client-key", "fence-1", "--tool", "fenced_effect"]
    settle += ["--server", "effects", "--failed", "--store", redis_url]

    async def operator(*extra: str) -> int:
        def run() -> int:
            try:
                return main([*settle, *extra])
            except SystemExit as exc:
                return int(exc.code or 0)

        return await anyio.to_thread.run_sync(run)

    args: dict[str, Any] = {"order": "F"}
    with anyio.fail_after(STARTUP_BOUND):
        async with Client(paused) as a, Client(other) as b:
            # On leaving the block A resumes and its blocking step goes on, with fence 1.
            async with frozen_mid_call(a, "fenced_effect", args, "fence-1") as (paused_pid, late):
                with pytest.raises(MCPError) as unknown:
                    await b.call_tool("fenced_effect", args, meta=meta("fence-1"))
                capsys.readouterr()
                refused = await operator()
                refusal = capsys.readouterr().err
                forced = await operator("--force")
                charged = await b.call_tool("fenced_effect", args, meta=meta("fence-1"))
            replay = await b.call_tool("fenced_effect", args, meta=meta("fence-1"))
    assert unknown.value.code == wire.OUTCOME_UNKNOWN
    assert refused == 1 and "refusing to settle" in refusal and "fence 1" in refusal
    assert forced == 0
    b_pid = ledger_rows(ledger, "F")["started"][1]
    assert b_pid != paused_pid
    assert body(charged)["content"] == [
        {"type": "text", "text": f"order F: written with fence 2 by process {b_pid}"}
    ]
    record = record_key("effects", "fenced_effect", "fence-1")
    table = FencedTable(provider)
    assert table.writes() == [(record, 2, "F", b_pid)]
    assert table.refusals() == [(record, 1, "F", paused_pid)]  # the stale write, refused
    assert [body(r) for r in late] == [body(charged)]  # A's caller got the record's answer
    assert answer(replay) == answer(charged)
    store = RedisKeyStore.from_url(redis_url, prefix=redis_namespace)
    try:
        stored = await store.get(record)
    finally:
        await store.aclose()
    assert stored is not None and stored.state is RecordState.COMPLETED and stored.fence == 2


async def test_a_killed_workers_record_is_settled_without_a_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 38: a guarded server SIGKILLed mid-call leaves its record IN_PROGRESS. Once its
    lease ran out, `keys list --state unknown` lists it (as unknown, since when), `keys settle
    --failed` is refused within the grace period and done with `--force`, with no client
    retrying first; the next call runs the tool once. Time passes by moving the clocks of the
    CLI and of the store it opens (the store's own claim decides that the lease ran out)."""
    ledger, keys = tmp_path / "ledger.db", tmp_path / "keys.db"
    victim = server_params(str(keys), ledger, gated=True, lease=30.0)
    later = {"by": 0.0}

    def clock() -> float:
        return time.time() + later["by"]

    monkeypatch.setattr(_grace, "clock", clock)
    monkeypatch.setattr(_common, "open_store", lambda url: SQLiteKeyStore(keys, clock=clock))
    record = record_key("effects", "effect", "kill-S1")

    async def operator(*argv: str) -> tuple[int, str, str]:
        def run() -> int:
            try:
                return main([*argv, "--store", str(keys)])
            except SystemExit as exc:
                return int(exc.code or 0)

        capsys.readouterr()
        code = await anyio.to_thread.run_sync(run)
        out, err = capsys.readouterr()
        return code, out, err

    with anyio.fail_after(STARTUP_BOUND):
        victim_pid = await killed_mid_call(victim, "S1", "kill-S1")
    _, running, _ = await operator("keys", "list", "--json")
    _, none_yet, _ = await operator("keys", "list", "--state", "unknown", "--json")
    later["by"] = 60.0  # the 30 s lease ran out 30 s ago: within the 90 s grace
    _, listed, _ = await operator("keys", "list", "--state", "unknown", "--json")
    refused, _, refusal = await operator("keys", "settle", record, "--failed")
    _, still, _ = await operator("keys", "show", record, "--json")
    forced, settled, _ = await operator("keys", "settle", record, "--failed", "--force")
    survivor = server_params(str(keys), ledger, lease=30.0)
    async with Client(survivor) as b:
        rerun = await b.call_tool("effect", {"order": "S1"}, meta=meta("kill-S1"))
        replay = await b.call_tool("effect", {"order": "S1"}, meta=meta("kill-S1"))
    assert [(r["key"], r["state"]) for r in json.loads(running)] == [(record, "in_progress")]
    assert json.loads(none_yet) == []
    [row] = json.loads(listed)
    assert (row["key"], row["state"], row["storedState"]) == (record, "unknown", "in_progress")
    assert row["leaseRanOutAt"] is not None and row["leaseRanOutAt"] == row["leaseDeadline"]
    assert refused == 1 and "refusing to settle" in refusal and "Nothing was changed" in refusal
    assert json.loads(still)["storedState"] == "in_progress"  # the refusal changed nothing
    assert forced == 0 and f"settled {record}: released" in settled
    rows = ledger_rows(ledger, "S1")
    assert rows["started"][0] == victim_pid and len(rows["started"]) == 2
    assert len(rows["done"]) == 1 and rows["done"][0] != victim_pid
    assert marker(rerun)["status"] == "executed" and marker(replay)["status"] == "replayed"


@pytest.mark.slow  # two server processes, one killed, and a lease waited out
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def test_a_killed_workers_orphan_stays_in_doubt_without_expiry_and_is_counted(
    kind: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 48 (rule 25): a worker SIGKILLed mid-charge, and no client retries. Its record is
    IN_PROGRESS under a lease that ran out: `keys list --state unknown` lists it with no expiry
    (it used to say 24 h out, and then it vanished), it is still there once every expiry the
    store knows has passed, and another replica's gauge `mcp_once_records_in_doubt` counts it.
    The effect ran once and nothing ran it again."""
    ledger = tmp_path / "ledger.db"
    prefix: str | None = None
    if kind == "redis":
        store_url, prefix = request.getfixturevalue("redis_url"), f"{uuid.uuid4().hex[:8]}:"
        monkeypatch.setattr(
            _common, "open_store", lambda url: RedisKeyStore.from_url(url, prefix=prefix)
        )
    else:
        store_url = str(tmp_path / "keys.db")
    victim = server_params(store_url, ledger, gated=True, lease=1.0, prefix=prefix)
    replica = server_params(store_url, ledger, lease=1.0, prefix=prefix, metrics=True)
    orphan = record_key("effects", "effect", "kill-O1")
    with anyio.fail_after(STARTUP_BOUND):
        async with Client(replica) as b:
            victim_pid = await killed_mid_call(victim, "O1", "kill-O1")
            # The replica serves other calls (its first protected call starts its count); nobody
            # retries the killed one. The gauge reaches 1 once the victim's 1 s lease ran out.
            await b.call_tool("effect", {"order": "O2"}, meta=meta("other-O2"))
            counted = await b.call_tool("in_doubt_gauge", {"at_least": 1})
    assert counted.structured_content == {"result": 1}

    def operator(*argv: str) -> str:
        capsys.readouterr()
        assert main([*argv, "--store", store_url]) == 0
        return capsys.readouterr().out

    [row] = json.loads(await anyio.to_thread.run_sync(
        operator, "keys", "list", "--state", "unknown", "--json"
    ))  # fmt: skip
    assert (row["key"], row["state"], row["storedState"]) == (orphan, "unknown", "in_progress")
    assert row["expiresAt"] is None and row["leaseRanOutAt"] is not None
    # Three days on (every retention and the fence memory are a day or less): still in doubt.
    later = 3 * 24 * 3600.0
    store: RedisKeyStore | SQLiteKeyStore
    if kind == "redis":
        store = RedisKeyStore.from_url(store_url, prefix=prefix or "")
        store.advance_clock_for_testing(later)
    else:
        store = SQLiteKeyStore(store_url, clock=lambda: time.time() + later)
    try:
        assert await store.purge_expired() == 1  # the other call's record, past its retention
        kept = await store.get(orphan)
        assert kept is not None and (kept.state, kept.expires_at) == (RecordState.IN_PROGRESS, None)
        in_doubt = await in_doubt_records(store, now=time.time() + later)
        assert [r.key for r in in_doubt] == [orphan]
    finally:
        await store.aclose()
    if kind == "redis":
        import redis

        raw = redis.Redis.from_url(store_url)
        try:
            assert raw.pttl(f"{prefix}{{{orphan}}}") == -1  # Redis will not drop it either
        finally:
            raw.close()
    assert ledger_rows(ledger, "O1") == {"started": [victim_pid], "done": []}
