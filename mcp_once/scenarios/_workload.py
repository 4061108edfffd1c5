"""Drive many logical calls at the workload server through a faulty link, two ways.

"mcp-once": `RetryingSession` (keys, the annotation gate, reconnection through `connect=`).
"naive": tenacity's `AsyncRetrying` around a bare `call_tool`: no keys, every `MCPError`
retried, the same number of attempts and the same reconnection — the baseline that shows what
the faults do without mcp-once.

Arguments are drawn from the seed, so the naive and the mcp-once run of one seed make the same
calls; with one worker (the default) the chaos draws happen in the same order too.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from mcp import Client, MCPError
from mcp_types import CONNECTION_CLOSED, CallToolResult, TextContent
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_none

from mcp_once.scenarios._endpoints import Endpoint
from mcp_once.scenarios._ledger import Ledger
from mcp_once.scenarios._shop import UNGUARDED_TOOLS
from orchestrator import (
    CallReport,
    Connect,
    NotExecuted,
    OutcomeUnknown,
    ReconnectFailed,
    RetryingSession,
    RetryPolicy,
    ServerOutcomeUnknown,
    SessionSlot,
    ToolCallError,
    tool_session,
)
from orchestrator.chaos import Chaos, FaultPlan

__all__ = [
    "CallOutcomeName",
    "CallRecord",
    "CallSpec",
    "Mode",
    "RunResult",
    "connect_factory",
    "default_policy",
    "plan_calls",
    "run_workload",
]

Mode = Literal["mcp-once", "naive"]
#: How a logical call ended, as the checker sees it.
CallOutcomeName = Literal[
    "result", "is_error", "outcome_unknown", "not_executed", "error", "unexplained"
]
#: Called with each finished call, in completion order (live progress).
Progress = Callable[["CallRecord"], None]
#: Started in the background when call `n` (0-based) starts: process faults, restarts.
Action = Callable[[], Awaitable[None]]

_ACCOUNTS = ("acct-a", "acct-b", "acct-c", "acct-d")
_NAMES = ("colour", "limit", "mode", "owner")
_MIX: tuple[tuple[str, int], ...] = (
    ("pay", 45),
    ("set_value", 25),
    ("get_balance", 15),
    ("notify", 15),
)


@dataclass(frozen=True, slots=True)
class CallSpec:
    """One logical call: which tool with which (seeded) arguments."""

    index: int
    call_id: str
    tool: str
    arguments: dict[str, Any]


def plan_calls(calls: int, seed: int, *, tools: Sequence[str] | None = None) -> list[CallSpec]:
    """`calls` logical calls drawn from `seed` (the same list for every mode and transport)."""
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
        raise ValueError(f"calls must be an int >= 0, got {calls!r}")
    rng = random.Random(f"mcp-once-workload-{seed}")
    mix = [(name, weight) for name, weight in _MIX if tools is None or name in tools]
    if not mix:
        raise ValueError(f"no workload tool among {tools!r}")
    names = [name for name, _ in mix]
    weights = [weight for _, weight in mix]
    specs: list[CallSpec] = []
    for index in range(calls):
        tool = rng.choices(names, weights)[0]
        call_id = f"s{seed}-c{index}"
        arguments: dict[str, Any]
        if tool == "pay":
            cents = rng.randrange(100, 10_000)
            arguments = {"call_id": call_id, "account": rng.choice(_ACCOUNTS), "cents": cents}
        elif tool == "set_value":
            name, value = rng.choice(_NAMES), rng.randrange(1000)
            arguments = {"call_id": call_id, "name": name, "value": value}
        elif tool == "get_balance":
            arguments = {"account": rng.choice(_ACCOUNTS)}
        else:
            arguments = {"call_id": call_id, "message": f"hello {rng.randrange(1000)}"}
        specs.append(CallSpec(index, call_id, tool, arguments))
    return specs


def default_policy(*, max_attempts: int = 4, attempt_timeout: float = 0.5) -> RetryPolicy:
    """Retries sized for a chaos run: short attempts (a lost answer costs one timeout), no
    shared budget (the run measures every call's fate, not load shedding)."""
    return RetryPolicy(
        max_attempts=max_attempts,
        attempt_timeout=attempt_timeout,
        deadline=60.0,
        wait_initial=0.01,
        wait_max=0.2,
        budget=None,
        connect_timeout=20.0,
    )


@dataclass(slots=True)
class CallRecord:
    """How one logical call ended, from the client's side."""

    spec: CallSpec
    outcome: CallOutcomeName
    #: The first text block of the result (None without a result).
    result: str | None = None
    error_type: str | None = None
    #: The key the calls carried (mcp-once mode; None for naive calls).
    key: str | None = None
    attempts: int = 1
    replayed: bool = False
    report: CallReport | None = None
    #: Reconciliation after the run, for calls that did not end with a result (mcp-once):
    #: ("replayed" | "executed", result text) or ("unknown", None) when an operator must settle.
    reconciled: tuple[str, str | None] | None = None

    @property
    def tool(self) -> str:
        return self.spec.tool

    @property
    def retries(self) -> int:
        return max(0, self.attempts - 1)


@dataclass(slots=True)
class RunResult:
    """Everything a run produced, for the invariant checker."""

    mode: Mode
    transport: str
    era: str
    seed: int
    records: list[CallRecord]
    chaos: Chaos
    ledger: Ledger
    elapsed: float
    connects: int
    #: Process- and store-level faults the caller injected, by kind (added to the chaos counts).
    extra_faults: dict[str, int] = field(default_factory=dict)


def _text(result: CallToolResult) -> str | None:
    for block in result.content:
        if isinstance(block, TextContent):
            return block.text
    return None


def _replayed(result: CallToolResult) -> bool:
    from idempotency import wire

    marker = (result.meta or {}).get(wire.IDEMPOTENCY_META)
    return isinstance(marker, Mapping) and marker.get("status") == "replayed"


def connect_factory(endpoint: Endpoint, chaos: Chaos | None = None) -> Connect:
    """A `connect=` factory for `RetryingSession`: a new `Client` to `endpoint` (waiting until it
    is up), its transport wrapped in `chaos` when given."""

    @asynccontextmanager
    async def connect() -> AsyncIterator[Client]:
        await endpoint.ready()
        inner = endpoint.make()
        if chaos is not None:
            link = chaos.wrap(inner)
            endpoint.attach(link)
            inner = link
        async with Client(inner, mode=endpoint.client_mode) as client:
            yield client

    return connect


async def _once_call(rs: RetryingSession, spec: CallSpec) -> CallRecord:
    try:
        result, report = await rs.call_tool_with_report(spec.tool, dict(spec.arguments))
    except (OutcomeUnknown, NotExecuted) as exc:
        outcome: CallOutcomeName = (
            "outcome_unknown" if isinstance(exc, OutcomeUnknown) else "not_executed"
        )
        return CallRecord(
            spec,
            outcome,
            error_type=type(exc).__name__,
            key=exc.key,
            attempts=exc.attempts,
            report=exc.report,
        )
    except ToolCallError as exc:
        return CallRecord(
            spec,
            "error",
            error_type=type(exc).__name__,
            key=exc.key,
            attempts=exc.attempts,
            report=exc.report,
        )
    except Exception as exc:
        return CallRecord(spec, "unexplained", error_type=type(exc).__name__)
    return CallRecord(
        spec,
        "is_error" if result.is_error else "result",
        result=_text(result),
        key=report.key,
        attempts=len(report.attempts),
        replayed=report.replayed,
        report=report,
    )


async def _naive_call(
    slot: SessionSlot, spec: CallSpec, max_attempts: int, attempt_timeout: float | None
) -> CallRecord:
    attempts = 0
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(max_attempts),
            retry=retry_if_exception_type((MCPError, ReconnectFailed)),
            wait=wait_none(),
            reraise=True,
        ):
            with attempt:
                attempts += 1
                session, generation = await slot.acquire()
                try:
                    result = await tool_session(session).call_tool(
                        spec.tool, dict(spec.arguments), attempt_timeout, None, meta=None
                    )
                except MCPError as exc:
                    if exc.code == CONNECTION_CLOSED or tool_session(session).closed():
                        slot.mark_dead(generation)
                    raise
    except Exception as exc:
        # Retries exhausted on a raw error: the caller cannot tell whether the tool ran.
        return CallRecord(spec, "unexplained", error_type=type(exc).__name__, attempts=attempts)
    return CallRecord(
        spec,
        "is_error" if result.is_error else "result",
        result=_text(result),
        attempts=attempts,
        replayed=_replayed(result),
    )


async def _perform(action: Action) -> None:
    await action()


async def _reconcile(endpoint: Endpoint, records: list[CallRecord]) -> None:
    """Ask again, on a clean link, with the same key, for every call that did not end with a
    result: the record answers (replay), runs it now (nothing ran), or says an operator must
    settle it (UNKNOWN). Never for tools the server does not guard: those are reconciled by
    looking the call up (the ledger), not by re-running it."""
    pending = [
        record
        for record in records
        if record.outcome in ("outcome_unknown", "not_executed")
        and record.key is not None
        and record.tool not in UNGUARDED_TOOLS
    ]
    if not pending:
        return
    policy = RetryPolicy(max_attempts=6, deadline=60.0, wait_initial=0.05, wait_max=0.5)
    async with RetryingSession(connect=connect_factory(endpoint, None), policy=policy) as rs:
        for record in pending:
            try:
                result, report = await rs.call_tool_with_report(
                    record.tool, dict(record.spec.arguments), idempotency_key=record.key
                )
            except ServerOutcomeUnknown:
                record.reconciled = ("unknown", None)
                continue
            except Exception as exc:
                record.reconciled = (f"failed:{type(exc).__name__}", None)
                continue
            record.reconciled = ("replayed" if report.replayed else "executed", _text(result))


async def run_workload(
    endpoint: Endpoint,
    *,
    mode: Mode,
    ledger: Ledger,
    plan: FaultPlan,
    seed: int,
    calls: int | Sequence[CallSpec] = 200,
    policy: RetryPolicy | None = None,
    concurrency: int = 1,
    actions: Mapping[int, Action] | None = None,
    progress: Progress | None = None,
    reconcile: bool = True,
    settle_timeout: float = 10.0,
) -> RunResult:
    """Run the workload once and return what happened (check it with `check`).

    `actions[n]` starts in the background as call `n` starts (kill a server, restart Redis...).
    In "mcp-once" mode, calls that did not end with a result are reconciled afterwards on a
    clean link (see `_reconcile`), unless `reconcile` is False.
    """
    if mode not in ("mcp-once", "naive"):
        raise ValueError(f"mode must be 'mcp-once' or 'naive', got {mode!r}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
    specs = plan_calls(calls, seed) if isinstance(calls, int) else list(calls)
    policy = policy if policy is not None else default_policy()
    chaos = Chaos(plan, seed=seed)
    connect = connect_factory(endpoint, chaos)
    records: list[CallRecord | None] = [None] * len(specs)
    pending_actions = dict(actions or {})
    started = anyio.current_time()
    next_index = 0

    async with anyio.create_task_group() as background:

        async def worker(call: Callable[[CallSpec], Awaitable[CallRecord]]) -> None:
            nonlocal next_index
            while next_index < len(specs):
                spec = specs[next_index]
                next_index += 1
                action = pending_actions.pop(spec.index, None)
                if action is not None:
                    background.start_soon(_perform, action)
                record = await call(spec)
                records[spec.index] = record
                if progress is not None:
                    progress(record)

        if mode == "mcp-once":
            async with RetryingSession(connect=connect, policy=policy) as rs:

                async def once(spec: CallSpec) -> CallRecord:
                    return await _once_call(rs, spec)

                async with anyio.create_task_group() as workers:
                    for _ in range(concurrency):
                        workers.start_soon(worker, once)
                connects = rs.connects
        else:
            slot = SessionSlot(None, connect, connect_timeout=policy.connect_timeout)
            async with slot:

                async def naive(spec: CallSpec) -> CallRecord:
                    return await _naive_call(
                        slot, spec, policy.max_attempts, policy.attempt_timeout
                    )

                async with anyio.create_task_group() as workers:
                    for _ in range(concurrency):
                        workers.start_soon(worker, naive)
                connects = slot.connects
    # Answers the chaos swallowed are still on their way: let the server finish them first.
    with anyio.move_on_after(settle_timeout):
        await chaos.settled()
    finished = [record for record in records if record is not None]
    if mode == "mcp-once" and reconcile:
        await _reconcile(endpoint, finished)
    return RunResult(
        mode=mode,
        transport=endpoint.transport,
        era=endpoint.era,
        seed=seed,
        records=finished,
        chaos=chaos,
        ledger=ledger,
        elapsed=anyio.current_time() - started,
        connects=connects,
        extra_faults={"server_restart": endpoint.restarts} if endpoint.restarts else {},
    )
