"""One call from "which transport, which seed" to a checked `Report`: shared by the test suite,
the soak script and `mcp-once demo`, so that all three measure the same thing the same way."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio.to_thread

from idempotency import KeyStore, open_store
from mcp_once.scenarios._endpoints import (
    Endpoint,
    Era,
    HttpEndpoint,
    MemoryEndpoint,
    ServerProcess,
    StdioEndpoint,
    TransportName,
    server_command,
)
from mcp_once.scenarios._invariants import Report, check
from mcp_once.scenarios._ledger import Ledger
from mcp_once.scenarios._shop import build_server
from mcp_once.scenarios._workload import Mode, Progress, run_workload
from orchestrator import RetryPolicy
from orchestrator.chaos import FaultPlan

__all__ = ["Scenario", "default_plan", "open_endpoint", "run_scenario"]

TRANSPORTS: tuple[TransportName, ...] = ("memory", "stdio", "http")


def default_plan(*, scale: float = 1.0, delay_max_seconds: float = 0.05) -> FaultPlan:
    """Every wire fault kind, about one request in five faulted at `scale` 1."""
    if not 0 < scale <= 4:
        raise ValueError(f"scale must be in (0, 4], got {scale!r}")
    return FaultPlan(
        lost_ack=0.05 * scale,
        drop_request=0.02 * scale,
        delay_request=0.02 * scale,
        delay_response=0.02 * scale,
        duplicate=0.04 * scale,
        close_before_write=0.02 * scale,
        close_after_write=0.03 * scale,
        delay_min_seconds=0.001,
        delay_max_seconds=delay_max_seconds,
    )


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """A run's setting. `store_url` None: a SQLite file in the run's work directory."""

    transport: TransportName = "memory"
    era: Era = "modern"
    calls: int = 200
    seed: int = 0
    plan: FaultPlan = field(default_factory=default_plan)
    store_url: str | None = None
    policy: RetryPolicy | None = None
    concurrency: int = 1
    #: Abrupt server restarts (kill -9, or the in-process equivalent) as these calls start.
    restart_at: tuple[int, ...] = ()
    #: Short, so that a claim left by a killed server expires within the run (the default of
    #: 30 s would make reconciliation wait that long); renewed every lease / 3 while tools run.
    lease: float = 5.0
    wait: float = 10.0

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}")
        if self.era not in ("modern", "legacy"):
            raise ValueError("era must be 'modern' or 'legacy'")


@asynccontextmanager
async def open_endpoint(
    transport: TransportName,
    era: Era,
    ledger: Ledger,
    store_url: str | None,
    *,
    lease: float = 30.0,
    wait: float = 10.0,
    hold: float = 0.0,
) -> AsyncIterator[Endpoint]:
    """The workload server on `transport`, guarded by the store at `store_url` (None: the
    unguarded baseline), for as long as the block runs."""
    if transport == "memory":
        store: KeyStore | None = open_store(store_url) if store_url is not None else None
        try:
            yield MemoryEndpoint(
                lambda: build_server(store, ledger, lease=lease, wait=wait, hold=hold), era
            )
        finally:
            if store is not None:
                await store.aclose()
        return
    if transport == "stdio":
        argv = server_command("stdio", ledger, store_url, lease=lease, wait=wait, hold=hold)
        stdio = StdioEndpoint(argv, ledger, era)
        try:
            yield stdio
        finally:
            await stdio.aclose()
        return
    process = ServerProcess(
        lambda port: server_command(
            "http", ledger, store_url, port=port, lease=lease, wait=wait, hold=hold
        ),
        log=ledger.path.with_suffix(".server.log"),
    )
    await anyio.to_thread.run_sync(process.start)
    endpoint = HttpEndpoint(process, era)
    try:
        yield endpoint
    finally:
        await endpoint.aclose()


def _fresh(workdir: Path, name: str) -> Path:
    """A path in `workdir` with no file (nor SQLite sidecar) left from an earlier run."""
    workdir.mkdir(parents=True, exist_ok=True)
    for stale in workdir.glob(f"{name}*"):
        stale.unlink()
    return (workdir / name).resolve()


async def run_scenario(
    scenario: Scenario,
    mode: Mode,
    workdir: Path,
    *,
    progress: Progress | None = None,
    actions: Mapping[int, Callable[[], Awaitable[None]]] | None = None,
) -> Report:
    """Run `scenario` in `mode` (mcp-once: guarded server and RetryingSession; naive: the same
    tools unguarded and a naive retry loop) and check its invariants."""
    tag = f"{mode}-{scenario.transport}-{scenario.era}-{scenario.seed}"
    ledger = Ledger(_fresh(workdir, f"ledger-{tag}.sqlite3"))
    store_url: str | None = None
    if mode == "mcp-once":
        store_url = scenario.store_url
        if store_url is None:
            store_url = f"sqlite:///{_fresh(workdir, f'keys-{tag}.sqlite3')}"
    async with open_endpoint(
        scenario.transport,
        scenario.era,
        ledger,
        store_url,
        lease=scenario.lease,
        wait=scenario.wait,
    ) as endpoint:
        all_actions = dict(actions or {})
        for index in scenario.restart_at:
            all_actions[index] = endpoint.restart
        run = await run_workload(
            endpoint,
            mode=mode,
            ledger=ledger,
            plan=scenario.plan,
            seed=scenario.seed,
            calls=scenario.calls,
            policy=scenario.policy,
            concurrency=scenario.concurrency,
            actions=all_actions,
            progress=progress,
        )
    return check(run)
