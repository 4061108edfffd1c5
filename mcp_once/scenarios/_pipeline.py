"""The kill-and-resume pipeline: an agent process (`_pipeline_agent`) running a scripted
eight-call pipeline against the shop server over HTTP, SIGKILLed at seeded points in the four
windows of a call's life and started again with the same run id until it completes.

One implementation for the run tests (`tests/run/test_run_kill_resume.py`, 20 seeds and the
rules checked per position) and `mcp-once demo` (a few seeds, the totals side by side): the
schedule of kills, the harness that forks agents from a `Zygote` and restarts them, and the
ledger's count of effects per position, which is what is believed, never what an agent says.

Modes: `run` is the agent under `orchestrator.Run` (keys from the run id and the position,
journalled); `fresh` is what users have without it: a fresh key per call and process, so every
restart sends the pipeline again under new keys.
"""

from __future__ import annotations

import contextlib
import functools
import json
import random
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.to_thread

from mcp_once.scenarios._endpoints import ServerProcess, server_command
from mcp_once.scenarios._ledger import Ledger
from mcp_once.scenarios._pipeline_agent import CRASH_AT, POSITIONS, TURN, UNGUARDED
from mcp_once.scenarios._zygote import Zygote

__all__ = [
    "AGENT",
    "KILLED",
    "SLOTS",
    "WINDOWS",
    "Kill",
    "PipelineHarness",
    "PipelineMode",
    "PipelineTotals",
    "pipeline_shop",
    "run_pipelines",
    "schedule",
]

#: How to start the zygote the agents are forked from.
AGENT = [sys.executable, "-m", "mcp_once.scenarios._pipeline_agent", "--zygote"]
WINDOWS = ("W1", "W2", "W3", "W4")
#: Where a seed's kills may land: each position outside the turn, or one of the turn's.
SLOTS: tuple[int | tuple[int, ...], ...] = (0, 1, 2, TURN, 6, 7)
#: The exit code of an agent that died of its SIGKILL.
KILLED = -9
#: Agents running at once (the machine may have two cores).
PARALLEL = 6

#: The Run lease of the demo's agents. On Linux a restart takes a killed agent's run over at once
#: (its process is gone); elsewhere (no `/proc`) it waits for the lease to run out, so it is
#: short, and long enough (renewed every third of it) that a live agent keeps its run.
DEMO_LEASE = 0.4

Kill = tuple[int, str]
PipelineMode = Literal["run", "fresh"]


def schedule(seed: int) -> list[Kill]:
    """3 or 4 kills at distinct, increasing positions (so each is reached by the process that
    is to die there), at most one inside the turn, in seeded windows."""
    rng = random.Random(seed)
    slots = sorted(rng.sample(range(len(SLOTS)), rng.choice((3, 4))))
    kills = []
    for slot in slots:
        where = SLOTS[slot]
        position = rng.choice(where) if isinstance(where, tuple) else where
        kills.append((position, rng.choice(WINDOWS)))
    return kills


@asynccontextmanager
async def pipeline_shop(folder: Path) -> AsyncIterator[tuple[str, Ledger]]:
    """The shop server over HTTP in a process of its own, guarded by a SQLite key store in
    `folder`, writing its effects to a ledger there: its URL and the ledger."""
    ledger = Ledger(folder / "ledger.sqlite3")
    store = f"sqlite:///{folder / 'keys.sqlite3'}"
    process = ServerProcess(lambda port: server_command("http", ledger, store, port=port))
    await anyio.to_thread.run_sync(process.start)
    try:
        yield process.url, ledger
    finally:
        await anyio.to_thread.run_sync(process.stop)


class PipelineHarness:
    """Forks agents of one shop from `zygote`; every file of a pipeline (output, log, replays)
    is named by its tag in `folder`, and its run id is `run-<tag>`. `journal`: where the agents
    journal their runs (a URL, or by default `journal.db` in `folder`)."""

    def __init__(
        self, url: str, ledger: Ledger, zygote: Zygote, folder: Path, journal: str | None = None
    ) -> None:
        self.url = url
        self.ledger = ledger
        self.zygote = zygote
        self.folder = folder
        self.journal = journal or str(folder / "journal.db")
        self.limiter = anyio.CapacityLimiter(PARALLEL)

    async def agent(
        self,
        tag: str,
        *,
        crash: Kill | None = None,
        mode: PipelineMode = "run",
        name: str | None = None,
        **options: Any,
    ) -> int:
        """One agent process, dying at `crash` if given; its exit code. `name`: the stem of its
        output and log files, when copies of one pipeline run side by side (default `tag`)."""
        stem = name or tag
        argv = [
            "--url", self.url,
            "--journal", self.journal,
            "--run-id", f"run-{tag}",
            "--tag", tag,
            "--out", str(self.folder / f"{stem}.json"),
            "--mode", mode,
        ]  # fmt: skip
        for name, value in options.items():
            argv += [f"--{name.replace('_', '-')}", str(value)]
        env = {CRASH_AT: f"{crash[1]}@{crash[0]}"} if crash is not None else {}
        async with self.limiter:
            return await self.zygote.run(argv, env, self.folder / f"{stem}.log")

    async def resumed(
        self, tag: str, kills: Sequence[Kill], mode: PipelineMode = "run", **options: Any
    ) -> int:
        """Run the pipeline with one kill per process, then once more to completion (`options`
        go to every agent); the number of processes it took. An agent that does not die or end
        as planned is an `AssertionError` carrying its log."""
        for position, window in kills:
            if mode == "fresh" and window == "W3":
                window = "W2"  # no journal: W3 is the same point as W2
            code = await self.agent(tag, crash=(position, window), mode=mode, **options)
            if code != KILLED:
                raise AssertionError(
                    f"{tag}: not killed at {window}@{position} ({code})\n" + self.log(tag)
                )
        code = await self.agent(tag, mode=mode, **options)
        if code != 0:
            raise AssertionError(f"{tag}: the last process exited {code}\n" + self.log(tag))
        return len(kills) + 1

    def log(self, tag: str) -> str:
        """The end of the log of `tag` (or of a copy's `name`)."""
        path = self.folder / f"{tag}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def output(self, tag: str) -> dict[int, dict[str, str]]:
        """What the last agent of `tag` (or of a copy's `name`) reported, per position."""
        raw = json.loads((self.folder / f"{tag}.json").read_text())
        return {int(position): outcome for position, outcome in raw.items()}

    def replays(self, tag: str) -> int:
        """Answers the server replayed to the agents of `tag`, killed ones included."""
        path = self.folder / f"{tag}.json.replays"
        return len(path.read_text().split()) if path.exists() else 0

    def effects(self, tag: str) -> dict[int, list[str]]:
        """The ledger's effects of one pipeline, by position."""
        found: dict[int, list[str]] = {position: [] for position in range(POSITIONS)}
        for call_id, effects in self.ledger.by_call().items():
            if call_id.startswith(f"{tag}-"):
                found[int(call_id.rsplit("-", 1)[1])] = [effect.result for effect in effects]
        return found


@dataclass
class PipelineTotals:
    """One mode's totals over the pipelines: agent processes, kills, what the ledger saw
    (`effects`, `duplicates`: effects beyond the first at a position, `missing`: guarded
    positions that never ran), replays served and calls that ended in `OutcomeUnknown`."""

    mode: PipelineMode
    pipelines: int = 0
    processes: int = 0
    kills: int = 0
    effects: int = 0
    duplicates: int = 0
    missing: int = 0
    replays: int = 0
    outcome_unknown: int = 0
    windows: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and self.missing == 0

    def add(self, harness: PipelineHarness, tag: str, kills: Sequence[Kill]) -> None:
        effects = harness.effects(tag)
        output = harness.output(tag)
        self.pipelines += 1
        self.processes += len(kills) + 1
        self.kills += len(kills)
        for _, window in kills:
            self.windows[window] = self.windows.get(window, 0) + 1
        self.effects += sum(len(ran) for ran in effects.values())
        self.duplicates += sum(len(ran) - 1 for ran in effects.values() if ran)
        self.missing += sum(1 for p, ran in effects.items() if not ran and p not in UNGUARDED)
        self.replays += harness.replays(tag)
        self.outcome_unknown += sum(
            1 for outcome in output.values() if outcome["status"].startswith("unknown:")
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "pipelines": self.pipelines,
            "calls": self.pipelines * POSITIONS,
            "processes": self.processes,
            "kills": self.kills,
            "windows": dict(sorted(self.windows.items())),
            "effects": self.effects,
            "duplicate_effects": self.duplicates,
            "missing_effects": self.missing,
            "replays": self.replays,
            "outcome_unknown": self.outcome_unknown,
            "ok": self.ok,
        }


async def run_pipelines(
    seeds: Sequence[int],
    folder: Path,
    *,
    lease: float = DEMO_LEASE,
    zygote: Zygote | None = None,
) -> tuple[PipelineTotals, PipelineTotals]:
    """Each seed's pipeline killed on its schedule and restarted until done, once with fresh
    keys and once under `Run` (its lease `lease` seconds: a restart waits that long at most
    for a killed agent's lease to run out), all at once against one shop; the totals of both
    modes. `zygote`: one entered earlier (`Zygote(AGENT, folder)`), so that its imports ran
    while the caller did something else; else one is started here."""
    async with contextlib.AsyncExitStack() as stack:
        if zygote is None:
            zygote = await stack.enter_async_context(Zygote(AGENT, folder))
        url, ledger = await stack.enter_async_context(pipeline_shop(folder))
        totals = await _resume_all(PipelineHarness(url, ledger, zygote, folder), seeds, lease)
    return totals


async def _resume_all(
    harness: PipelineHarness, seeds: Sequence[int], lease: float
) -> tuple[PipelineTotals, PipelineTotals]:
    fresh, journalled = PipelineTotals("fresh"), PipelineTotals("run")
    plans = {seed: schedule(seed) for seed in seeds}
    async with anyio.create_task_group() as group:
        for seed, kills in plans.items():
            group.start_soon(harness.resumed, f"f{seed}", kills, "fresh")
            group.start_soon(
                functools.partial(harness.resumed, f"s{seed}", kills, "run", lease=lease)
            )
    for seed, kills in plans.items():
        fresh.add(harness, f"f{seed}", kills)
        journalled.add(harness, f"s{seed}", kills)
    return fresh, journalled
