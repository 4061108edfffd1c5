"""Kill and resume, with real processes: an agent running a scripted eight-call pipeline (a
parallel turn of three among them) against the shop server over HTTP, SIGKILLed in the four
windows of a call's life and started again with the same run id until the pipeline completes.

What is counted is the shop's ledger (rows each tool body writes itself, in a SQLite file the
server owns), never what the agent says. The agent processes are forked from one pre-imported
zygote (`crash_kit.Zygote`): each is a real process, killed by a real SIGKILL, and a restart
costs a fork instead of an interpreter start. One shop serves every seed; call ids carry the
seed, so each seed's effects are its own.

Windows (see `run_agent.py`): W1 intent recorded, not sent; W2 the server ran the tool, the answer
never reached the run; W3 the answer reached the run, done not recorded; W4 between calls.
"""

from __future__ import annotations

import json
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from crash_kit import DurableShop, Zygote, durable_shop
from crash_point import CRASH_AT
from run_agent import BUSY, DIVERGED, EXPIRED, POSITIONS, TURN, UNGUARDED, steps

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


AGENT = str(Path(__file__).with_name("run_agent.py"))
WINDOWS = ("W1", "W2", "W3", "W4")
SEEDS = range(20)
#: Where a seed's kills may land: each position outside the turn, or one of the turn's.
SLOTS: tuple[int | tuple[int, ...], ...] = (0, 1, 2, TURN, 6, 7)
KILLED = -9
#: Agents running at once (the machine may have two cores).
PARALLEL = 6

Kill = tuple[int, str]


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


def normal(text: str, tag: str) -> str:
    """A result with what differs between runs (random hex, the seed's tag) blanked."""
    return re.sub(r"[0-9a-f]{12}", "X", text.replace(tag, "T"))


class Harness:
    def __init__(self, shop: DurableShop, zygote: Zygote, tmp: Path) -> None:
        self.shop = shop
        self.zygote = zygote
        self.tmp = tmp
        self.limiter = anyio.CapacityLimiter(PARALLEL)

    async def agent(
        self, tag: str, *, crash: Kill | None = None, mode: str = "run", **options: Any
    ) -> int:
        argv = [
            "--url",
            self.shop.url,
            "--journal",
            str(self.tmp / "journal.db"),
            "--run-id",
            f"run-{tag}",
            "--tag",
            tag,
            "--out",
            str(self.tmp / f"{tag}.json"),
            "--mode",
            mode,
        ]
        for name, value in options.items():
            argv += [f"--{name.replace('_', '-')}", str(value)]
        env = {CRASH_AT: f"{crash[1]}@{crash[0]}"} if crash is not None else {}
        async with self.limiter:
            return await self.zygote.run(argv, env, self.tmp / f"{tag}.log")

    async def resumed(self, tag: str, kills: Sequence[Kill], mode: str = "run") -> int:
        """Run the pipeline with one kill per process, then once more to completion; the
        number of processes it took."""
        for position, window in kills:
            if mode == "fresh" and window == "W3":
                window = "W2"  # no journal: W3 is the same point as W2
            code = await self.agent(tag, crash=(position, window), mode=mode)
            assert code == KILLED, f"{tag}: not killed at {window}@{position} ({code})\n" + (
                self.log(tag)
            )
        code = await self.agent(tag, mode=mode)
        assert code == 0, f"{tag}: the last process exited {code}\n" + self.log(tag)
        return len(kills) + 1

    def log(self, tag: str) -> str:
        path = self.tmp / f"{tag}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def output(self, tag: str) -> dict[int, dict[str, str]]:
        raw = json.loads((self.tmp / f"{tag}.json").read_text())
        return {int(position): outcome for position, outcome in raw.items()}

    def effects(self, tag: str) -> dict[int, list[str]]:
        """The ledger's effects of one seed, by position."""
        found: dict[int, list[str]] = {position: [] for position in range(POSITIONS)}
        for call_id, effects in self.shop.ledger.by_call().items():
            if call_id.startswith(f"{tag}-"):
                found[int(call_id.rsplit("-", 1)[1])] = [effect.result for effect in effects]
        return found


def check_seed(
    harness: Harness, tag: str, kills: Sequence[Kill], control: dict[int, dict[str, str]]
) -> Counter[str]:
    """Every rule of the harness for one resumed seed; what its unguarded calls ended as."""
    effects = harness.effects(tag)
    output = harness.output(tag)
    killed_at = dict(kills)
    seen: Counter[str] = Counter()
    for position in range(POSITIONS):
        outcome, ran = output[position], effects[position]
        tool = steps(tag, "same")[position][0]
        if position not in UNGUARDED:
            # Guarded and naturally idempotent: exactly one effect, and the output is its result
            # (a resumed call got the first execution's answer back, replayed by key).
            assert len(ran) == 1, f"{tag} position {position} ({tool}): {len(ran)} effects"
            assert outcome == {"status": "ok", "text": ran[0]}, (tag, position, outcome)
            assert normal(ran[0], tag) == normal(control[position]["text"], "control")
            continue
        assert len(ran) <= 1, f"{tag} position {position} (notify): {len(ran)} effects"
        status = outcome["status"]
        seen[status] += 1
        window = killed_at.get(position)
        if status == "ok":
            assert ran == [outcome["text"]]
        elif status == "unknown:resumed_done":
            assert len(ran) == 1
        else:
            assert status == "unknown:resumed_intent", (tag, position, status)
        if window in ("W2", "W3"):
            # The tool ran, its answer died with the process: an explicit OutcomeUnknown.
            assert (status, len(ran)) == ("unknown:resumed_intent", 1), (tag, position, window)
        elif window == "W1":
            assert (status, len(ran)) == ("unknown:resumed_intent", 0), (tag, position, window)
    return seen


async def test_kill_and_resume_every_window_against_fresh_keys(tmp_path: Path) -> None:
    started = time.monotonic()
    async with (
        durable_shop(tmp_path, hold=0.0) as shop,
        Zygote([sys.executable, AGENT, "--zygote"], tmp_path) as zygote,
    ):
        harness = Harness(shop, zygote, tmp_path)
        plans = {seed: schedule(seed) for seed in SEEDS}
        processes: dict[str, int] = {}

        async def resume(tag: str, kills: list[Kill], mode: str) -> None:
            processes[tag] = await harness.resumed(tag, kills, mode)

        assert await harness.agent("control") == 0, harness.log("control")
        async with anyio.create_task_group() as group:
            for seed, kills in plans.items():
                group.start_soon(resume, f"s{seed}", kills, "run")
                group.start_soon(resume, f"f{seed}", kills, "fresh")
        control = harness.output("control")
        assert all(outcome["status"] == "ok" for outcome in control.values())

        unguarded: Counter[str] = Counter()
        for seed, kills in plans.items():
            unguarded += check_seed(harness, f"s{seed}", kills, control)
        windows = Counter(window for kills in plans.values() for _, window in kills)
        duplicates = {
            seed: sum(len(ran) - 1 for ran in harness.effects(f"f{seed}").values() if ran)
            for seed in SEEDS
        }
        elapsed = time.monotonic() - started

    kills_per_seed = [len(kills) for kills in plans.values()]
    print(
        f"\nkill-and-resume: {len(SEEDS)} seeds, {sum(kills_per_seed)} kills"
        f" ({dict(sorted(windows.items()))}), {sum(processes.values())} agent processes;"
        f" run: 0 duplicate effects, unguarded outcomes {dict(unguarded)};"
        f" fresh keys: {sum(duplicates.values())} duplicate effects"
        f" in {sum(1 for d in duplicates.values() if d)} of {len(SEEDS)} seeds;"
        f" {elapsed:.1f}s"
    )
    assert min(kills_per_seed) >= 3
    assert all(windows[window] >= 5 for window in WINDOWS), windows
    assert all(count > 0 for count in duplicates.values()), duplicates


async def test_two_copies_resumed_at_once_one_runs_the_other_is_busy(tmp_path: Path) -> None:
    async with (
        durable_shop(tmp_path, hold=0.0) as shop,
        Zygote([sys.executable, AGENT, "--zygote"], tmp_path) as zygote,
    ):
        harness = Harness(shop, zygote, tmp_path)
        assert await harness.agent("twin", crash=(3, "W2")) == KILLED
        await anyio.sleep(1.0)  # the dead holder's lease (0.75 s) runs out
        codes: list[int] = []

        async def copy() -> None:
            codes.append(await harness.agent("twin", linger=1.5, wait_busy=0))

        async with anyio.create_task_group() as group:
            group.start_soon(copy)
            group.start_soon(copy)
        assert sorted(codes) == [0, BUSY], [*codes, harness.log("twin")]
        effects = harness.effects("twin")
        assert all(len(effects[p]) == 1 for p in range(POSITIONS)), effects


async def test_divergence_expiry_and_a_finished_run(tmp_path: Path) -> None:
    async with (
        durable_shop(tmp_path, hold=0.0) as shop,
        Zygote([sys.executable, AGENT, "--zygote"], tmp_path) as zygote,
    ):
        harness = Harness(shop, zygote, tmp_path)
        # Divergence: the model picks another amount at the resumed position 6.
        assert await harness.agent("div", crash=(6, "W2")) == KILLED
        assert await harness.agent("div", variant="diverge") == DIVERGED
        assert "diverged at position 6" in harness.log("div")
        assert len(harness.effects("div")[6]) == 1
        # Expiry: resumed a day and more later (past the shop's advertised 24 h): nothing sent.
        assert await harness.agent("exp", crash=(1, "W2")) == KILLED
        before = harness.effects("exp")
        assert await harness.agent("exp", skew=90_000) == EXPIRED
        assert harness.effects("exp") == before
        # A finished run, started again: its calls replay, nothing executes.
        assert await harness.agent("fin") == 0
        first, effects = harness.output("fin"), harness.effects("fin")
        assert await harness.agent("fin") == 0
        assert harness.effects("fin") == effects
        again = harness.output("fin")
        for position in range(POSITIONS):
            if position in UNGUARDED:
                assert again[position] == {"status": "unknown:resumed_done"}
            else:
                assert again[position] == first[position]
