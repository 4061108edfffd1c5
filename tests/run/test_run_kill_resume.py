"""Kill and resume, with real processes: an agent running a scripted eight-call pipeline (a
parallel turn of three among them) against the shop server over HTTP, SIGKILLed in the four
windows of a call's life and started again with the same run id until the pipeline completes.

What is counted is the shop's ledger (rows each tool body writes itself, in a SQLite file the
server owns), never what the agent says. The agent, its kill schedule and the harness are
`mcp_once.scenarios` (`_pipeline_agent`, `_pipeline`), shared with `mcp-once demo`; the agent
processes are forked from one pre-imported zygote (`_zygote.Zygote`): each is a real process,
killed by a real SIGKILL, and a restart costs a fork instead of an interpreter start. One shop
serves every seed; call ids carry the seed, so each seed's effects are its own.

Windows (see `_pipeline_agent`): W1 intent recorded, not sent; W2 the server ran the tool, the
answer never reached the run; W3 the answer reached the run, done not recorded; W4 between calls.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from mcp_once.scenarios._pipeline import (
    AGENT,
    KILLED,
    WINDOWS,
    Kill,
    PipelineHarness,
    PipelineMode,
    pipeline_shop,
    schedule,
)
from mcp_once.scenarios._pipeline_agent import DIVERGED, EXPIRED, POSITIONS, UNGUARDED, steps
from mcp_once.scenarios._zygote import Zygote

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


SEEDS = range(20)


def normal(text: str, tag: str) -> str:
    """A result with what differs between runs (random hex, the seed's tag) blanked."""
    return re.sub(r"[0-9a-f]{12}", "X", text.replace(tag, "T"))


def check_seed(
    harness: PipelineHarness, tag: str, kills: Sequence[Kill], control: dict[int, dict[str, str]]
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
        pipeline_shop(tmp_path) as (url, ledger),
        Zygote(AGENT, tmp_path) as zygote,
    ):
        harness = PipelineHarness(url, ledger, zygote, tmp_path)
        plans = {seed: schedule(seed) for seed in SEEDS}
        processes: dict[str, int] = {}

        async def resume(tag: str, kills: list[Kill], mode: PipelineMode) -> None:
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


async def test_divergence_expiry_and_a_finished_run(tmp_path: Path) -> None:
    async with (
        pipeline_shop(tmp_path) as (url, ledger),
        Zygote(AGENT, tmp_path) as zygote,
    ):
        harness = PipelineHarness(url, ledger, zygote, tmp_path)
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
