"""Benchmark: a task creation's added cost (rule 23, SEP-2663) against the unguarded creation,
beside a plain call's, in one run.

Issue 44 bounds it: a guarded task creation may cost what a guarded plain call costs over its
unguarded twin, plus one store write (the task id kept with the record). Both are measured side
by side, the four variants interleaved call by call (`call_overhead._latencies`), on the in-repo
task-capable server: the SDK's `MCPServer` with a minimal in-memory tasks extension
(`_Tasks`: `deploy` answers a task-augmented call with a `CreateTaskResult` and a fresh task
id), bare for the unguarded variants and wrapped by `idempotent_tasks` for the guarded ones:

* `task`: task creation, unguarded; `task_guarded`: the same under `idempotent_tasks`;
* `call`: a plain `tools/call` of an unwrapped tool; `call_guarded`: the same under `@idempotent`;
* `call_declaring`, `call_declaring_guarded`: the same plain calls from a client that declares the
  tasks extension (the guarded server names `deploy` in `idempotent_tasks(task_tools=...)`, so
  the wrapper leaves `call` to the tool's own guard: the plain call's cost, checked in round trips).

Every call carries a fresh key (a first execution each time; the unguarded servers ignore it),
over an in-memory session (`mcp.client.Client(server)`, the client declaring the tasks extension
with `orchestrator.TasksExtension`), for the memory, SQLite and Redis stores (a private
redis-server). One store write is measured in the same rounds: `complete` of a claimed fresh
key with a `CreateTaskResult`-sized result (the write the task id adds, if it added one; the
guard's own claim and completion are in both guarded variants). The verdict, per store, on the
medians of the rounds' p50s: (task_guarded − task) <= (call_guarded − call) + write.
"""

from __future__ import annotations

import contextlib
import itertools
import secrets
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from mcp.client import Client
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension
from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolRequestParams

from idempotency import KeyStore, idempotent, idempotent_tasks, open_store
from mcp_once.proxy.tasks import producing_tasks
from orchestrator import TASKS_EXTENSION, TaskCreated, TasksExtension

from ._redis import RedisServer, read_counters
from ._scale import Scale, run_async
from ._servers import key_meta
from ._stats import percentile, spread
from .call_overhead import Call, _latencies

KINDS = ("task", "call", "call_declaring")
VARIANTS = tuple(f"{kind}{side}" for kind in KINDS for side in ("", "_guarded"))
STORES = ("memory", "sqlite", "redis")
#: The task's lifetime it announces (an hour): the record outlives it by rule 23.
TTL_MS = 3_600_000
ARGS = {"env": "prod"}
#: Calls per variant counted for the Redis round trips.
ROUND_TRIP_CALLS = 20


class _Tasks(Extension):
    """A minimal SEP-2663 backend for `MCPServer`: `deploy`, called by a client that declared
    the extension, becomes a task kept in memory (its body never runs: creation is what is
    measured); every other call is handed on."""

    identifier = TASKS_EXTENSION

    def __init__(self) -> None:
        self.created: dict[str, TaskCreated] = {}

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if params.name != "deploy":
            return await call_next(ctx)
        task = _new_task()
        self.created[task.task_id] = task
        return task


def _new_task() -> TaskCreated:
    """A task just created: a fresh id, `working`."""
    now = datetime.now(UTC).isoformat()
    return TaskCreated(
        task_id=secrets.token_urlsafe(24),
        status="working",
        created_at=now,
        last_updated_at=now,
        ttl_ms=TTL_MS,
        poll_interval_ms=500,
    )


def _server(store: KeyStore | None) -> tuple[MCPServer[Any], _Tasks]:
    """The task-capable server, guarded by `store` (None: unguarded), and its tasks backend."""
    backend = _Tasks()
    name = "bench-tasks"
    extension = (
        backend
        if store is None
        else idempotent_tasks(backend, store, server_name=name, task_tools=["deploy"])
    )
    server: MCPServer[Any] = MCPServer(name, extensions=[extension])

    async def deploy(env: str) -> str:
        return f"deployed {env}"

    async def call(env: str) -> str:
        return f"called {env}"

    for tool in (deploy, call):
        server.tool()(tool if store is None else idempotent(store)(tool))
    return server, backend


@contextlib.asynccontextmanager
async def _endpoint(store: KeyStore, warmup: int) -> AsyncIterator[tuple[Call, list[_Tasks]]]:
    """`call(variant, n, size)` for the four variants (an unguarded and a guarded server, one
    in-memory client each), and the two tasks backends, to count their tasks."""
    nonce = secrets.token_hex(4)
    bare, bare_tasks = _server(None)
    guarded, guarded_tasks = _server(store)
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(producing_tasks())
        # Task creations and `call_declaring` from a client declaring the tasks extension;
        # `call` from one that does not.
        clients = {
            (kind, side): await stack.enter_async_context(
                Client(server, extensions=[TasksExtension()] if kind != "call" else [])
            )
            for kind in KINDS
            for side, server in (("", bare), ("_guarded", guarded))
        }
        numbers = itertools.count()

        async def call(variant: str, _n: int, _size: int) -> None:
            kind = variant.removesuffix("_guarded")
            client = clients[kind, variant[len(kind) :]]
            meta = key_meta(f"{nonce}-{next(numbers)}")  # fresh across rounds too
            if kind == "task":
                answer = await client.session.call_tool(
                    "deploy", ARGS, meta=meta, allow_claimed=True
                )
                if not isinstance(answer, TaskCreated):
                    raise RuntimeError(f"the benchmark's task creation made no task: {answer}")
            else:
                result = await client.call_tool("call", ARGS, meta=meta)
                if result.is_error:
                    raise RuntimeError(f"the benchmark tool failed: {result}")

        for n in range(warmup):
            for variant in VARIANTS:
                await call(variant, -1 - n, 0)
        yield call, [bare_tasks, guarded_tasks]


async def _writes(store: KeyStore, payload: bytes, count: int) -> list[float]:
    """Milliseconds per store write: `complete` of a freshly claimed key with `payload`."""
    nonce = secrets.token_hex(4)
    found = []
    for n in range(count):
        key = f"bench-write:{nonce}:{n}"
        claimed = await store.claim(key, "f" * 64, lease=60, takeover=False, tool="deploy")
        if claimed.token is None:
            raise RuntimeError(f"the benchmark's claim of a fresh key failed: {claimed}")
        started = time.perf_counter()
        done = await store.complete(key, claimed.token, payload, retention=3600)
        found.append((time.perf_counter() - started) * 1000)
        if not done:
            raise RuntimeError("the benchmark's store write was refused")
    return found


async def _round_trips(call: Call, url: str) -> dict[str, float]:
    """Redis round trips and commands per call of each variant (`INFO` around a batch)."""
    client = redis.Redis.from_url(url)
    found: dict[str, Any] = {}
    try:
        for variant in VARIANTS:
            before = read_counters(client)
            for n in range(ROUND_TRIP_CALLS):
                await call(variant, n, 0)
            delta = read_counters(client).minus(before)
            found[variant] = delta["round_trips"] / ROUND_TRIP_CALLS
    finally:
        client.close()
    return found


def _payload() -> bytes:
    """A `CreateTaskResult`'s size on the wire, as the record keeps it."""
    return _new_task().model_dump_json(by_alias=True).encode()


def _summary(rounds: list[dict[str, list[float]]]) -> dict[str, Any]:
    """p50s per variant, the two added costs paired per round, and the bound (medians)."""
    out: dict[str, Any] = {
        v: {"p50_ms": spread([percentile(r[v], 50) for r in rounds], 4)}
        for v in (*VARIANTS, "write")
    }

    def added(r: dict[str, list[float]], base: str) -> float:
        return percentile(r[base + "_guarded"], 50) - percentile(r[base], 50)

    out["task_added_ms"] = spread([added(r, "task") for r in rounds], 4)
    out["call_added_ms"] = spread([added(r, "call") for r in rounds], 4)
    out["call_declaring_added_ms"] = spread([added(r, "call_declaring") for r in rounds], 4)
    bound = out["call_added_ms"]["median"] + out["write"]["p50_ms"]["median"]
    out["bound_ms"] = round(bound, 4)
    return out


async def _measure(scale: Scale) -> dict[str, Any]:
    rounds, calls, warmup = scale.task_rounds, scale.task_calls, scale.overhead_warmup
    payload = _payload()
    by_store: dict[str, list[dict[str, list[float]]]] = {s: [] for s in STORES}
    created: dict[str, list[int]] = {}
    with RedisServer() as redis_server, tempfile.TemporaryDirectory() as tmp:
        urls = {
            "memory": "memory://",
            "sqlite": f"sqlite:///{Path(tmp) / 'keys.db'}",
            "redis": redis_server.url,
        }
        async with contextlib.AsyncExitStack() as stack:
            endpoints = {}
            for name in STORES:
                store = open_store(urls[name])
                stack.push_async_callback(store.aclose)
                endpoints[name] = (store, await stack.enter_async_context(_endpoint(store, warmup)))
            for round_no in range(rounds):
                order = VARIANTS if round_no % 2 == 0 else tuple(reversed(VARIANTS))
                for name, (store, (call, _)) in endpoints.items():
                    sample = await _latencies(call, order, calls, 0)
                    sample["write"] = await _writes(store, payload, calls)
                    by_store[name].append(sample)
            trips = await _round_trips(endpoints["redis"][1][0], redis_server.url)
            for name, (_, (_, backends)) in endpoints.items():
                created[name] = [len(b.created) for b in backends]
    for name, (bare, guarded) in created.items():
        expected = warmup + rounds * calls + (ROUND_TRIP_CALLS if name == "redis" else 0)
        if bare != expected or guarded != expected:  # one task per creation, no more, no less
            raise RuntimeError(f"{name}: {bare}/{guarded} tasks created, expected {expected}")
    out: dict[str, Any] = {
        "calls_per_round": calls,
        "rounds": rounds,
        "write_bytes": len(payload),
        "event_loop": "uvloop" if scale.uvloop else "asyncio",
        "by_store": {name: _summary(runs) for name, runs in by_store.items()},
        "redis_round_trips_per_call": trips,
    }
    out["targets"] = verdicts(out)
    return out


def verdicts(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 44's target per store, in `bench`'s verdict table: the task creation's added cost
    against the plain call's plus one store write, each measured in this run."""
    rows = []
    for store, figures in out["by_store"].items():
        call, write = figures["call_added_ms"]["median"], figures["write"]["p50_ms"]["median"]
        added = figures["task_added_ms"]["median"]
        rows.append({
            "metric": f"task creation, guarded − unguarded p50 ms, in-process, {store} store"
                      f" (plain call's: {call:g} ms; one store write: {write:g} ms)",
            "measured": added, "ceiling": None,
            "target": f"<= {figures['bound_ms']:g} ms (call's + write)",
            "met": added <= figures["bound_ms"],
            "reachable": None,
        })  # fmt: skip
    trips = out["redis_round_trips_per_call"]
    declaring, plain = trips["call_declaring_guarded"], trips["call_guarded"]
    rows.append({
        "metric": "guarded plain call from a client declaring the tasks extension, Redis round"
                  f" trips per call (from one that does not: {plain:g})",
        "measured": declaring, "ceiling": None,
        "target": f"<= {plain:g} (a plain call's)",
        "met": declaring <= plain,
        "reachable": None,
    })  # fmt: skip
    return rows


def measure(scale: Scale) -> dict[str, Any]:
    return run_async(scale, _measure, scale)


if __name__ == "__main__":
    from ._standalone import standalone

    standalone(__doc__, measure)
