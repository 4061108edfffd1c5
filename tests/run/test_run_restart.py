"""A restarted agent and its run's holder (rule 21), with real processes on SQLite and on Redis:
the pipeline agent of `mcp_once.scenarios` against the shop server over HTTP, its effects counted
in the shop's ledger.

- killed (SIGKILL) and restarted at once, as a supervisor does, it resumes within a second,
  though its lease is 30 s: the killed holder's process is gone, so the run is taken over at once;
- two copies restarted at once after a kill race for the dead holder: one runs, one is refused;
- a second copy started while the first is alive and renewing sends no call of its own: it
  waits and then replays the finished run, or is refused past its wait;
- a holder recorded with another host's identity, or by a release that recorded no proof, is
  waited for until its lease runs out; one of this host whose PID was reused is not.

Each agent writes `killed at <time>` before its SIGKILL and `entered <run> fence <n> at <time>`
when `Run` let it in (wall clock), which is where the restart-to-resume figures come from.
"""

from __future__ import annotations

import dataclasses
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from mcp_once.scenarios._pipeline import AGENT, KILLED, PipelineHarness, pipeline_shop
from mcp_once.scenarios._pipeline_agent import BUSY, POSITIONS, UNGUARDED, open_agent_journal
from mcp_once.scenarios._zygote import SOON, Zygote
from orchestrator._journal.holder import this_process

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(this_process() is None, reason="a dead holder is proven from /proc"),
]

#: The lease of the agents that must not wait for one: long, so a resume within a second can
#: only be a takeover of a holder known dead.
LONG_LEASE = 30.0
#: The lease of the holders the test writes, which stop renewing when the agent comes.
HOLD = 2.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the Redis journal's client runs on asyncio


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the agents journal: a SQLite file, or the session's Redis."""
    if request.param == "sqlite":
        return str(tmp_path / "journal.db")
    url: str = request.getfixturevalue("redis_url")
    return url


@asynccontextmanager
async def agents(tmp_path: Path, journal: str) -> AsyncIterator[PipelineHarness]:
    async with (
        pipeline_shop(tmp_path) as (url, ledger),
        Zygote(AGENT, tmp_path) as zygote,
    ):
        yield PipelineHarness(url, ledger, zygote, tmp_path, journal)


def label(journal: str) -> str:
    return "redis" if journal.startswith("redis") else "sqlite"


def unique(name: str) -> str:
    """A tag (and run id) no other test on the shared Redis uses."""
    return f"{name}{uuid.uuid4().hex[:8]}"


def times(harness: PipelineHarness, name: str) -> list[tuple[str, int, float]]:
    """The `killed` and `entered` lines of an agent's log, in order: (what, fence, when), and
    its `entering` lines (fence 0)."""
    found: list[tuple[str, int, float]] = []
    log = harness.folder / f"{name}.log"
    if not log.exists():  # not started yet
        return found
    for line in log.read_text().splitlines():
        killed = re.fullmatch(r"(killed|entering)(?: \S+)? at ([\d.]+)", line)
        entered = re.fullmatch(r"entered \S+ fence (\d+) at ([\d.]+)", line)
        if killed:
            found.append((killed[1], 0, float(killed[2])))
        elif entered:
            found.append(("entered", int(entered[1]), float(entered[2])))
    return found


def assert_one_effect_each(harness: PipelineHarness, tag: str) -> None:
    effects = harness.effects(tag)
    assert all(len(effects[p]) == 1 for p in range(POSITIONS)), effects


async def test_an_agent_killed_and_restarted_at_once_resumes_within_a_second(
    tmp_path: Path, journal: str
) -> None:
    """Killed after its call at position 1 and while its call at 6 was answered, restarted at
    once each time; the 30 s lease never runs out."""
    tag = unique("restart")
    async with agents(tmp_path, journal) as harness:
        options = {"lease": LONG_LEASE, "wait": LONG_LEASE * 2}
        assert await harness.agent(tag, crash=(1, "W4"), **options) == KILLED
        assert await harness.agent(tag, crash=(6, "W2"), **options) == KILLED
        assert await harness.agent(tag, **options) == 0, harness.log(tag)
        assert_one_effect_each(harness, tag)
        output = harness.output(tag)
    events = [event for event in times(harness, tag) if event[0] != "entering"]
    assert [(what, fence) for what, fence, _ in events] == [
        ("entered", 1),
        ("killed", 0),
        ("entered", 2),
        ("killed", 0),
        ("entered", 3),
    ]
    resumes = [events[i + 1][2] - events[i][2] for i in (1, 3)]
    print(f"\n{label(journal)}: SIGKILL to resumed run {[f'{s:.3f}s' for s in resumes]}")
    assert max(resumes) < 1.0, resumes
    assert "RunBusy" not in harness.log(tag)
    for position in UNGUARDED:  # notify: ran once in the second process, never sent again
        assert output[position] == {"status": "unknown:resumed_done"}, output
    assert all(output[p]["status"] == "ok" for p in range(POSITIONS) if p not in UNGUARDED)


async def test_two_copies_restarted_at_once_after_a_kill_one_runs(
    tmp_path: Path, journal: str
) -> None:
    """Both find the killed holder dead and take the run over; the journal lets one: the other,
    not waiting (`wait=0`), finds the winner alive (holding the run until the gate opens) and is
    refused."""
    tag = unique("twin")
    gate = tmp_path / f"{tag}.gate"
    async with agents(tmp_path, journal) as harness:
        assert await harness.agent(tag, crash=(3, "W2")) == KILLED
        codes: dict[str, int] = {}

        async def copy(name: str) -> None:
            codes[name] = await harness.agent(tag, name=name, gate=gate, wait=0)

        async with anyio.create_task_group() as group:
            group.start_soon(copy, f"{tag}-a")
            group.start_soon(copy, f"{tag}-b")
            with anyio.fail_after(SOON):
                while not codes:  # noqa: ASYNC110 (until the loser is refused)
                    await anyio.sleep(0.01)
            gate.touch()
        assert sorted(codes.values()) == [0, BUSY], codes
        assert_one_effect_each(harness, tag)
    refused = next(name for name, code in codes.items() if code == BUSY)
    assert "alive on this host" in harness.log(refused)
    assert not [event for event in times(harness, refused) if event[0] == "entered"]


async def logged(harness: PipelineHarness, name: str, text: str) -> None:
    """Until the log of agent `name` has `text` (bounded)."""
    with anyio.fail_after(SOON):
        while text not in harness.log(name):  # noqa: ASYNC110 (a log line, no event)
            await anyio.sleep(0.01)


async def test_a_second_copy_of_a_live_run_sends_no_call_of_its_own(
    tmp_path: Path, journal: str
) -> None:
    """The first copy holds the run, renewing its 0.75 s lease, until a gate opens. A second
    copy, waiting up to 30 s, enters once the first finished and only replays; a third, waiting
    0.3 s, is refused, having sent nothing. The gate opens once both met the run held."""
    tag = unique("copy")
    gate = tmp_path / f"{tag}.gate"
    first, waiter, refused = f"{tag}-first", f"{tag}-waiter", f"{tag}-refused"
    async with agents(tmp_path, journal) as harness:
        codes: dict[str, int] = {}

        async def agent(name: str, **options: object) -> None:
            codes[name] = await harness.agent(tag, name=name, **options)

        async with anyio.create_task_group() as group:
            group.start_soon(lambda: agent(first, gate=gate, lease=0.75))
            await logged(harness, first, "entered")
            group.start_soon(lambda: agent(waiter, wait=30))
            group.start_soon(lambda: agent(refused, wait=0.3))
            await logged(harness, waiter, "waiting up to")
            with anyio.fail_after(SOON):
                while refused not in codes:  # noqa: ASYNC110 (until it is refused)
                    await anyio.sleep(0.01)
            gate.touch()
        assert codes == {first: 0, waiter: 0, refused: BUSY}, codes
        assert_one_effect_each(harness, tag)
        before, after = harness.output(first), harness.output(waiter)
    for position in range(POSITIONS):
        if position in UNGUARDED:  # never sent again: the finished run says it was done
            assert after[position] == {"status": "unknown:resumed_done"}
        else:  # the first copy's answer, replayed by the server
            assert after[position] == before[position]
    assert harness.replays(waiter) == POSITIONS - len(UNGUARDED)
    assert [fence for what, fence, _ in times(harness, waiter) if what == "entered"] == [2]
    log = harness.log(waiter)
    assert log.count("waiting up to") == 1 and "alive on this host" in log, log
    assert "alive on this host" in harness.log(refused)
    assert not [event for event in times(harness, refused) if event[0] == "entered"]


def foreign(how: str) -> str | None:
    """The proof of life of a holder that did not come from this process's restart."""
    mine = this_process()
    assert mine is not None
    if how == "another host":
        return dataclasses.replace(mine, boot=str(uuid.uuid4())).encode()
    if how == "previous release":
        return None
    # This host, but its PID now runs a later process (this test's, started after it).
    return dataclasses.replace(mine, started=mine.started - 1).encode()


@pytest.mark.parametrize(
    ("how", "hold"),
    [("another host", HOLD), ("previous release", HOLD), ("this host, PID reused", LONG_LEASE)],
)
async def test_a_holder_that_cannot_be_proven_dead_is_waited_for(
    tmp_path: Path, journal: str, how: str, hold: float
) -> None:
    """The holder is written here, by the test: an agent on another host, one of a release that
    recorded no proof, or one of this host proven dead. The test renews its lease (2 s, or 30 s
    for the one not to be waited for) until the agent says it is entering its run, then stops,
    as a holder that died at that moment would: the agent meets the run held, whatever the load.
    """
    waited = hold == HOLD
    tag = unique("held")
    run_id = f"run-{tag}"
    async with agents(tmp_path, journal) as harness:
        holding = open_agent_journal(journal)
        code: list[int] = []

        async def agent() -> None:
            code.append(await harness.agent(tag, wait=HOLD * 3))

        try:
            lease_end = time.time() + hold
            fence = await holding.acquire(run_id, "elsewhere:4242:cafe", hold, alive=foreign(how))
            async with anyio.create_task_group() as group:
                group.start_soon(agent)
                with anyio.fail_after(SOON):
                    while not [e for e in times(harness, tag) if e[0] == "entering"]:
                        renewed_at = time.time()  # before: the journal's deadline is later
                        await holding.renew(run_id, fence, hold)
                        lease_end = renewed_at + hold
                        await anyio.sleep(hold / 6)
        finally:
            await holding.aclose()
        assert code == [0], harness.log(tag)
        assert_one_effect_each(harness, tag)
    (entering, event) = times(harness, tag)
    after = event[2] - entering[2]
    print(f"\n{label(journal)}, holder {how}: entered {after:.3f}s after it began (lease {hold}s)")
    assert event[1] == 2
    if waited:
        assert event[2] >= lease_end - 0.05, (event[2], lease_end)
        says = "on another host" if how == "another host" else "liveness cannot be read"
        assert harness.log(tag).count(says) == 1, harness.log(tag)
    else:
        assert after < 1.0, after
        assert "waiting" not in harness.log(tag)
