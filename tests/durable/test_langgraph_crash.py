"""LangGraph crash tests: a real agent worker (LangGraph 1.2, `langchain-mcp-adapters` 0.3.2, the
SQLite checkpointer, in the LangGraph environment) calls the real shop server (in this one) and is
killed around the call, then started again to resume its thread from the checkpoint.

Each scenario is one thread of `langgraph_worker.py`: a scripted model asks for one `pay`, the
tool node makes it over streamable HTTP. The windows are crash_kit's: `before` the request is
sent, `during` the tool (SIGKILL once the ledger shows it started), `after` the answer came back
and before LangGraph recorded it. With `CheckpointKeys` (the integration) the restarted worker
sends the same key: one effect, the re-run's result marked replayed where the tool had run, the
thread's final tool message the first execution's receipt. Without it, the same harness shows two
effects where the tool had run (proof that it sees duplicates). In `before` no request was sent,
so both give one effect; it is run with the integration only.

Five seeded crashes more (the seed picks the window), with a model that mints a new tool-call id
on every run as a real one does: under `durability="sync"` the model's message is checkpointed
before the tool runs, so the resumed thread keeps the id and the key. One recovering worker
resumes the five threads, as a restarted deployment would. And the decided non-sync behaviour: a
graph run with LangGraph's default durability ("async") is refused before anything is sent.

The scenarios are independent (own thread, own `call_id`, own checkpointer file) and run at once
against one shop, in one event loop per module; each test asserts on its scenario's outcome.
"""

from __future__ import annotations

import json
import random
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from crash_kit import ROOT, WINDOWS, CrashingWorker, DurableShop, Window, durable_shop, worker_env
from crash_point import WINDOW
from langgraph_env import langgraph_python

WORKER = Path(__file__).with_name("langgraph_worker.py")
SEEDS = (6, 7, 8, 9, 10)  # between them, every window (checked below)
#: Workers at once: each spends about 2 s of CPU importing LangGraph; this machine has 2 cores.
PARALLEL = 6


@dataclass(frozen=True)
class Scenario:
    name: str
    window: Window | None  # None: no crash (the refusal)
    keys: bool
    durability: str = "sync"


@dataclass
class Outcome:
    """What one thread left: the shop's effects for its call, the workers' notes, exit codes."""

    effects: list[Any] = field(default_factory=list)
    notes: list[dict[str, Any]] = field(default_factory=list)
    exits: list[int] = field(default_factory=list)
    output: str = ""
    error: BaseException | None = None

    def results(self) -> list[dict[str, Any]]:
        return [n for n in self.notes if n["event"] == "result"]

    def final(self) -> dict[str, Any]:
        finals = [n for n in self.notes if n["event"] == "final"]
        assert len(finals) == 1, self.output
        return finals[0]


def seeded_window(seed: int) -> Window:
    return random.Random(seed).choice(WINDOWS)


SCENARIOS = [
    *(Scenario(f"keys-{w}", w, keys=True) for w in WINDOWS),
    *(Scenario(f"bare-{w}", w, keys=False) for w in ("during", "after")),
    Scenario("refused-async", None, keys=True, durability="unset"),
]


def worker_argv(
    python: Path,
    shop: DurableShop,
    jobs: Sequence[tuple[Path, str]],
    out: Path,
    *,
    keys: bool,
    durability: str = "sync",
    tool_call_id: str = "fixed",
) -> list[str]:
    """The worker's command: each job a checkpointer file and a name (thread `thread-<name>`,
    `pay` call_id `<name>`)."""
    argv = [str(python), str(WORKER), "--url", shop.url, "--out", str(out)]
    for db, name in jobs:
        argv += ["--job", str(db), f"thread-{name}", name]
    argv += ["--durability", durability, "--tool-call-id", tool_call_id]
    return [*argv, "--keys"] if keys else argv


def read_notes(out: Path, call_id: str) -> list[dict[str, Any]]:
    lines = out.read_text().splitlines() if out.exists() else []
    return [note for note in map(json.loads, lines) if note.get("call_id") == call_id]


async def run_scenario(
    python: Path, shop: DurableShop, root: Path, scenario: Scenario, limiter: anyio.CapacityLimiter
) -> Outcome:
    """Run the scenario's worker until it dies in its window, then again until it finishes."""
    tmp = root / scenario.name
    tmp.mkdir()
    out = tmp / "notes.jsonl"
    jobs = [(tmp / "checkpoints.sqlite3", scenario.name)]
    argv = worker_argv(python, shop, jobs, out, keys=scenario.keys, durability=scenario.durability)
    worker = CrashingWorker(argv, window=scenario.window or "before", tmp=tmp)
    if scenario.window is None:
        worker.env.pop(WINDOW)
    outcome = Outcome()
    try:
        async with limiter:
            worker.start()
            if scenario.window is not None:
                await worker.crashed(shop.ledger, call_id=scenario.name)
                outcome.exits.append(worker.processes[-1].returncode)
                worker.start()
            outcome.exits.append(await worker.wait())
    except BaseException as exc:  # kept for the scenario's own test to raise
        outcome.error = exc
    finally:
        worker.stop()
    outcome.effects = shop.effects(scenario.name)
    outcome.notes = read_notes(out, scenario.name)
    outcome.output = worker.output()
    return outcome


async def run_seeded(
    python: Path, shop: DurableShop, root: Path, limiter: anyio.CapacityLimiter
) -> dict[str, Outcome]:
    """Five workers die at once, each in its seed's window; one worker resumes all five."""
    out = root / "seeded-notes.jsonl"
    names = [f"seed-{seed}" for seed in SEEDS]
    workers: dict[str, CrashingWorker] = {}
    outcomes = {name: Outcome() for name in names}
    for seed, name in zip(SEEDS, names, strict=True):
        tmp = root / name
        tmp.mkdir()
        argv = worker_argv(
            python, shop, [(tmp / "checkpoints.sqlite3", name)], out, keys=True,
            tool_call_id="random",
        )  # fmt: skip
        workers[name] = CrashingWorker(argv, window=seeded_window(seed), tmp=tmp)

    async def crash(name: str) -> None:
        async with limiter:
            workers[name].start()
            await workers[name].crashed(shop.ledger, call_id=name)
        outcomes[name].exits.append(workers[name].processes[-1].returncode)

    jobs = [(root / name / "checkpoints.sqlite3", name) for name in names]
    recovery_log = root / "seeded-recovery.log"
    env = worker_env("before", root)
    env.pop(WINDOW)
    try:
        async with anyio.create_task_group() as group:
            for name in names:
                group.start_soon(crash, name)
        argv = worker_argv(python, shop, jobs, out, keys=True, tool_call_id="random")
        with recovery_log.open("wb") as log:
            recovery = await anyio.run_process(
                argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=False
            )
        for outcome in outcomes.values():
            outcome.exits.append(recovery.returncode)
    except BaseException as exc:
        for outcome in outcomes.values():
            outcome.error = exc
    finally:
        for worker in workers.values():
            worker.stop()
    recovered = recovery_log.read_text(errors="replace") if recovery_log.exists() else ""
    for name, outcome in outcomes.items():
        outcome.effects = shop.effects(name)
        outcome.notes = read_notes(out, name)
        outcome.output = workers[name].output() + "\n--- recovery ---\n" + recovered
    return outcomes


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Outcome]]:
    python = langgraph_python()
    root = tmp_path_factory.mktemp("langgraph")
    found: dict[str, Outcome] = {}

    async def run_all() -> None:
        limiter = anyio.CapacityLimiter(PARALLEL)
        async with durable_shop(root) as shop:

            async def one(scenario: Scenario) -> None:
                found[scenario.name] = await run_scenario(python, shop, root, scenario, limiter)

            async def seeded() -> None:
                found.update(await run_seeded(python, shop, root, limiter))

            async with anyio.create_task_group() as group:
                group.start_soon(seeded)
                for scenario in SCENARIOS:
                    group.start_soon(one, scenario)

    anyio.run(run_all)
    yield found


def outcome_of(outcomes: dict[str, Outcome], name: str) -> Outcome:
    outcome = outcomes[name]
    if outcome.error is not None:
        raise AssertionError(f"scenario {name} failed:\n{outcome.output}") from outcome.error
    return outcome


def assert_once(outcome: Outcome, window: Window) -> None:
    """One effect; the thread ends with that effect's receipt; the re-run replayed it where the
    tool had run before the crash, and executed it where it had not."""
    assert outcome.exits[-1] == 0, outcome.output
    assert len(outcome.effects) == 1, (outcome.effects, outcome.output)
    receipt = outcome.effects[0].result
    final = outcome.final()
    assert final["tool_messages"] == [receipt], outcome.output
    rerun = [r for r in outcome.results() if r["pid"] == final["pid"]]
    assert len(rerun) == 1, outcome.output
    assert rerun[0]["text"] == receipt
    assert rerun[0]["marker"]["keySource"] == "client"
    assert rerun[0]["marker"]["key"].startswith("langgraph-")
    assert rerun[0]["marker"]["status"] == ("executed" if window == "before" else "replayed")
    # Everything any run of the thread saw is the one receipt, under one key.
    assert {r["text"] for r in outcome.results()} == {receipt}
    assert {r["marker"]["key"] for r in outcome.results()} == {outcome.effects[0].key}
    if window == "after":  # the first run saw the answer, then died before LangGraph kept it
        first = [r for r in outcome.results() if r["pid"] != final["pid"]]
        assert [r["marker"]["status"] for r in first] == ["executed"]


@pytest.mark.parametrize("window", WINDOWS)
def test_langgraph_with_checkpoint_keys_pays_once(
    outcomes: dict[str, Outcome], window: Window
) -> None:
    outcome = outcome_of(outcomes, f"keys-{window}")
    assert_once(outcome, window)
    assert outcome.final()["tool_call_ids"] == ["call-pay-1"]


@pytest.mark.parametrize("window", ["during", "after"])
def test_langgraph_without_the_integration_pays_twice(
    outcomes: dict[str, Outcome], window: Window
) -> None:
    """The same harness with the adapters alone (they send no key): the resumed thread runs the
    tool again, on the same guarded server."""
    outcome = outcome_of(outcomes, f"bare-{window}")
    assert outcome.exits[-1] == 0, outcome.output
    assert len(outcome.effects) == 2, (outcome.effects, outcome.output)
    assert [effect.key for effect in outcome.effects] == [None, None]
    assert outcome.final()["tool_messages"] == [outcome.effects[1].result]


@pytest.mark.parametrize("seed", SEEDS)
def test_langgraph_seeded_crash_under_sync_durability_pays_once(
    outcomes: dict[str, Outcome], seed: int
) -> None:
    """A model that mints a new tool-call id per run: the checkpoint kept the first one."""
    outcome = outcome_of(outcomes, f"seed-{seed}")
    assert_once(outcome, seeded_window(seed))
    (tool_call_id,) = outcome.final()["tool_call_ids"]
    assert tool_call_id.startswith("call-") and tool_call_id != "call-pay-1"


def test_the_seeds_cover_every_window() -> None:
    assert {seeded_window(seed) for seed in SEEDS} == set(WINDOWS)


def test_langgraph_default_durability_is_refused_before_sending(
    outcomes: dict[str, Outcome],
) -> None:
    """Decided: LangGraph's default durability ("async") can lose the model's message in a
    crash, and then a new tool-call id makes a new key; so the call is refused, loudly, and
    nothing reaches the server."""
    outcome = outcome_of(outcomes, "refused-async")
    assert outcome.exits == [1], outcome.output
    assert "DurabilityError" in outcome.output
    assert "durability='async'" in outcome.output
    assert outcome.effects == []
    assert outcome.results() == []
