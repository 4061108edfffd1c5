"""How each benchmark runs (its length and its event loop): one object, so `--quick` and
`--uvloop` mean the same thing everywhere."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar, TypeVarTuple

import anyio

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


@dataclass(frozen=True, slots=True)
class Scale:
    name: str
    #: Store throughput: interleaved rounds, and the measuring window per contender (s).
    throughput_rounds: int
    throughput_window: float
    #: Record memory: how many sizes the sweep samples.
    memory_sweep: int
    #: Call overhead: rounds, sequential calls per variant per round, throughput window (s) and
    #: how many of the rounds measure throughput, stores measured, warm-up calls, and whether
    #: the result-size sweep (the plot) runs.
    overhead_rounds: int
    overhead_calls: int
    overhead_window: float
    overhead_throughput_rounds: int
    overhead_stores: tuple[str, ...]
    #: Stores measured over HTTP only, beside `overhead_stores` (quick mode: the SQLite store,
    #: the embedded default, keeps its HTTP row and floor without the slow in-process row).
    overhead_http_stores: tuple[str, ...]
    overhead_warmup: int
    overhead_sweep: bool
    #: Outage: rounds, outage length and the time measured after it (s).
    outage_rounds: int
    outage_seconds: float
    outage_tail: float
    #: Run journal: rounds, sequential calls per variant per round, warm-up calls.
    journal_rounds: int
    journal_calls: int
    journal_warmup: int
    #: The event loop of the measuring process and of the HTTP server processes: asyncio unless
    #: `--uvloop`. Pinned either way: uvicorn's default (`loop="auto"`) silently switches to
    #: uvloop whenever it is installed, which changes absolute figures without saying so.
    uvloop: bool = False
    #: The proxy hop (`proxy_hop.py`): calls per tool per round, rounds, seconds per number of
    #: callers (at 16, the verdicts' figure, `hop_passes` windows of half that per round),
    #: start-ups timed, and whether every target runs (the peers, installed from npm and
    #: the package index, the HTTP fronts, FastMCP's bare proxy, Redis) or only direct, the SDK
    #: floor and mcp-once proxy on memory and SQLite.
    hop_calls: int = 300
    hop_rounds: int = 3
    hop_seconds: float = 2.0
    hop_passes: int = 6
    hop_startups: int = 7
    hop_every_target: bool = True
    #: Task creation (`task_creation.py`): rounds, and calls per variant per round.
    task_rounds: int = 5
    task_calls: int = 300


FULL = Scale(
    name="full",
    throughput_rounds=9,
    throughput_window=1.0,
    memory_sweep=80,
    overhead_rounds=5,
    overhead_calls=300,
    overhead_window=1.5,
    overhead_throughput_rounds=5,
    overhead_stores=("memory", "sqlite", "redis"),
    overhead_http_stores=(),
    overhead_warmup=30,
    overhead_sweep=True,
    outage_rounds=3,
    outage_seconds=4.0,
    outage_tail=1.0,
    journal_rounds=5,
    journal_calls=300,
    journal_warmup=30,
)

QUICK = Scale(
    name="quick",
    throughput_rounds=1,
    throughput_window=0.4,
    memory_sweep=12,
    overhead_rounds=2,
    overhead_calls=80,
    overhead_window=0.3,
    overhead_throughput_rounds=1,
    overhead_stores=("memory", "redis"),
    overhead_http_stores=("sqlite",),
    overhead_warmup=20,
    overhead_sweep=False,
    outage_rounds=1,
    outage_seconds=1.5,
    outage_tail=0.3,
    journal_rounds=2,
    journal_calls=80,
    journal_warmup=20,
    hop_calls=80,
    hop_rounds=1,
    hop_seconds=0.5,
    hop_passes=2,
    hop_startups=3,
    task_rounds=2,
    task_calls=80,
)

#: For the test suite: every code path, figures too short to mean anything.
SMOKE = Scale(
    name="smoke",
    throughput_rounds=1,
    throughput_window=0.1,
    memory_sweep=4,
    overhead_rounds=1,
    overhead_calls=10,
    overhead_window=0.1,
    overhead_throughput_rounds=1,
    overhead_stores=("memory", "redis"),
    overhead_http_stores=("sqlite",),
    overhead_warmup=3,
    overhead_sweep=False,
    outage_rounds=1,
    outage_seconds=0.5,
    outage_tail=0.1,
    journal_rounds=1,
    journal_calls=10,
    journal_warmup=3,
    hop_calls=5,
    hop_rounds=1,
    hop_seconds=0.1,
    hop_passes=1,
    hop_startups=1,
    hop_every_target=False,
    task_rounds=1,
    task_calls=10,
)


def run_async(scale: Scale, func: Callable[[*Ts], Awaitable[T]], *args: *Ts) -> T:
    """`anyio.run` on the event loop `scale` names (asyncio, or uvloop under `--uvloop`)."""
    return anyio.run(func, *args, backend_options={"use_uvloop": scale.uvloop})
