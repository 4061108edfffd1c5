"""The journal contract, run against every journal (`kind` fixture: memory, SQLite, SQLite under
trio, Redis). Each test states one promise of `orchestrator/_journal/journal.py` and checks it
on what the journal then holds: a refused call must have changed nothing."""

from __future__ import annotations

import anyio
import pytest
from journal_kinds import RETENTION, Kind, entry

from orchestrator._journal import (
    EntryConflict,
    FencedOut,
    JournalError,
    RunBusy,
    RunFinished,
    RunSummary,
)

pytestmark = pytest.mark.anyio

RUN = "run-1"
LEASE = 30.0


async def snapshot(kind: Kind, run_id: str = RUN) -> tuple[RunSummary | None, list[object]]:
    return await kind.journal.run(run_id), list(await kind.journal.entries(run_id))


# -- the lease: one writer per run -------------------------------------------------------------


async def test_a_new_run_is_created_at_fence_one(kind: Kind) -> None:
    assert await kind.journal.run(RUN) is None
    assert await kind.journal.acquire(RUN, "a", LEASE) == 1
    summary = await kind.journal.run(RUN)
    assert summary is not None
    assert (summary.state, summary.calls, summary.dangling, summary.holder) == (
        "running",
        0,
        0,
        "a",
    )
    assert summary.lease_deadline == pytest.approx(kind.clock() + LEASE)
    assert summary.created_at == pytest.approx(kind.clock())
    assert summary.held(kind.clock())


async def test_another_holder_is_refused_while_the_lease_is_live(kind: Kind) -> None:
    await kind.journal.acquire(RUN, "a", LEASE)
    before = await snapshot(kind)
    kind.clock.advance(LEASE - 1)
    with pytest.raises(RunBusy, match="held by 'a'") as raised:
        await kind.journal.acquire(RUN, "b", LEASE)
    assert raised.value.run_id == RUN
    assert not isinstance(raised.value, FencedOut)
    assert await snapshot(kind) == before


async def test_an_expired_lease_is_taken_over_with_a_higher_fence(kind: Kind) -> None:
    first = await kind.journal.acquire(RUN, "a", LEASE)
    kind.clock.advance(LEASE + 0.001)
    second = await kind.journal.acquire(RUN, "b", LEASE)
    assert second > first
    summary = await kind.journal.run(RUN)
    assert summary is not None and summary.holder == "b" and summary.fence == second


async def test_renewing_keeps_the_run_from_a_takeover(kind: Kind) -> None:
    fence = await kind.journal.acquire(RUN, "a", LEASE)
    for _ in range(3):
        kind.clock.advance(LEASE * 2 / 3)
        await kind.journal.renew(RUN, fence, LEASE)
    with pytest.raises(RunBusy):
        await kind.journal.acquire(RUN, "b", LEASE)


async def test_a_released_run_is_taken_at_once(kind: Kind) -> None:
    fence = await kind.journal.acquire(RUN, "a", LEASE)
    assert await kind.journal.release(RUN, fence) is True
    summary = await kind.journal.run(RUN)
    assert summary is not None and summary.holder is None and not summary.held(kind.clock())
    assert await kind.journal.acquire(RUN, "b", LEASE) == fence + 1


async def test_the_same_holder_acquiring_again_gets_a_new_fence(kind: Kind) -> None:
    """A restart that reuses its holder name still fences out its former self."""
    first = await kind.journal.acquire(RUN, "a", LEASE)
    second = await kind.journal.acquire(RUN, "a", LEASE)
    assert second == first + 1
    with pytest.raises(FencedOut):
        await kind.journal.record_intent(RUN, first, entry(0))


async def test_runs_do_not_share_leases(kind: Kind) -> None:
    await kind.journal.acquire("run-a", "a", LEASE)
    assert await kind.journal.acquire("run-b", "b", LEASE) == 1


# -- a holder's proof of life, and taking over a dead one (rule 21) ------------------------------

PROOF = "1d3f846e-07ae-414a-a286-6679a0ad9023 pid:[4026531836] 4242 130956"


async def test_a_holder_is_refused_with_what_proves_it_alive(kind: Kind) -> None:
    fence = await kind.journal.acquire(RUN, "a", LEASE, alive=PROOF)
    summary = await kind.journal.run(RUN)
    assert summary is not None and summary.alive == PROOF
    kind.clock.advance(10)
    with pytest.raises(RunBusy) as raised:
        await kind.journal.acquire(RUN, "b", LEASE, alive="other proof 1 2")
    busy = raised.value
    assert (busy.holder, busy.fence, busy.alive) == ("a", fence, PROOF)
    assert busy.left == pytest.approx(LEASE - 10, abs=1e-3)


async def test_a_holder_without_a_proof_is_refused_without_one(kind: Kind) -> None:
    """What a holder written by an earlier release looks like: nothing to judge it by."""
    await kind.journal.acquire(RUN, "a", LEASE)
    with pytest.raises(RunBusy) as raised:
        await kind.journal.acquire(RUN, "b", LEASE, alive=PROOF)
    assert raised.value.alive is None
    summary = await kind.journal.run(RUN)
    assert summary is not None and summary.alive is None


async def test_a_live_lease_is_taken_over_when_its_fence_is_named_dead(kind: Kind) -> None:
    dead = await kind.journal.acquire(RUN, "a", LEASE, alive=PROOF)
    await kind.journal.record_intent(RUN, dead, entry(0))
    fence = await kind.journal.acquire(RUN, "b", LEASE, alive="b proof 1 2", dead=dead)
    assert fence == dead + 1
    summary = await kind.journal.run(RUN)
    assert summary is not None
    assert (summary.holder, summary.fence, summary.alive) == ("b", fence, "b proof 1 2")
    with pytest.raises(FencedOut):
        await kind.journal.record_intent(RUN, dead, entry(1))
    await kind.journal.record_intent(RUN, fence, entry(1))


async def test_of_two_takeovers_of_one_dead_holder_one_wins(kind: Kind) -> None:
    """The takeover is a compare-and-set on the dead fence: the second finds the first's live
    lease, under another fence, and is refused."""
    dead = await kind.journal.acquire(RUN, "a", LEASE, alive=PROOF)
    outcomes: list[object] = []

    async def take(holder: str) -> None:
        try:
            outcomes.append(await kind.journal.acquire(RUN, holder, LEASE, dead=dead))
        except RunBusy as busy:
            outcomes.append(busy)

    async with anyio.create_task_group() as group:
        group.start_soon(take, "b")
        group.start_soon(take, "c")
    won = [outcome for outcome in outcomes if isinstance(outcome, int)]
    lost = [outcome for outcome in outcomes if isinstance(outcome, RunBusy)]
    assert won == [dead + 1] and len(lost) == 1, outcomes
    assert lost[0].fence == dead + 1


async def test_naming_another_fence_dead_takes_nothing(kind: Kind) -> None:
    fence = await kind.journal.acquire(RUN, "a", LEASE, alive=PROOF)
    before = await snapshot(kind)
    with pytest.raises(RunBusy):
        await kind.journal.acquire(RUN, "b", LEASE, dead=fence - 1)
    assert await snapshot(kind) == before


async def test_letting_go_forgets_the_proof(kind: Kind) -> None:
    fence = await kind.journal.acquire(RUN, "a", LEASE, alive=PROOF)
    await kind.journal.release(RUN, fence)
    released = await kind.journal.run(RUN)
    fence = await kind.journal.acquire(RUN, "b", LEASE, alive=PROOF)
    await kind.journal.finish(RUN, fence)
    finished = await kind.journal.run(RUN)
    assert released is not None and released.alive is None
    assert finished is not None and finished.alive is None


# -- fencing: a stale holder changes nothing ----------------------------------------------------


async def stale_holder(kind: Kind) -> tuple[int, int]:
    """'a' records position 0 and is presumed dead; 'b' takes over. Both fences."""
    stale = await kind.journal.acquire(RUN, "a", LEASE)
    await kind.journal.record_intent(RUN, stale, entry(0))
    kind.clock.advance(LEASE + 1)
    current = await kind.journal.acquire(RUN, "b", LEASE)
    return stale, current


async def test_a_stale_fence_records_nothing(kind: Kind) -> None:
    stale, _ = await stale_holder(kind)
    before = await snapshot(kind)
    with pytest.raises(FencedOut) as raised:
        await kind.journal.record_intent(RUN, stale, entry(1))
    assert isinstance(raised.value, RunBusy)
    with pytest.raises(FencedOut):
        await kind.journal.mark_done(RUN, stale, 0)
    with pytest.raises(FencedOut):
        await kind.journal.renew(RUN, stale, LEASE)
    with pytest.raises(FencedOut):
        await kind.journal.finish(RUN, stale)
    assert await kind.journal.release(RUN, stale) is False
    assert await snapshot(kind) == before


async def test_the_holder_that_took_over_carries_on(kind: Kind) -> None:
    _, current = await stale_holder(kind)
    await kind.journal.mark_done(RUN, current, 0)
    await kind.journal.record_intent(RUN, current, entry(1))
    assert [(e.position, e.state) for e in await kind.journal.entries(RUN)] == [
        (0, "done"),
        (1, "intent"),
    ]


async def test_a_released_fence_writes_nothing(kind: Kind) -> None:
    fence = await kind.journal.acquire(RUN, "a", LEASE)
    await kind.journal.release(RUN, fence)
    with pytest.raises(FencedOut, match="released"):
        await kind.journal.record_intent(RUN, fence, entry(0))
    assert await kind.journal.entries(RUN) == []


async def test_a_write_to_an_unknown_run_is_fenced_out(kind: Kind) -> None:
    with pytest.raises(FencedOut):
        await kind.journal.record_intent("nobody", 1, entry(0))
    assert await kind.journal.run("nobody") is None


async def test_a_holder_past_its_lease_writes_until_someone_takes_over(kind: Kind) -> None:
    """The fence decides, not the clock: a slow holder nobody replaced is not failed."""
    fence = await kind.journal.acquire(RUN, "a", LEASE)
    kind.clock.advance(LEASE * 3)
    await kind.journal.record_intent(RUN, fence, entry(0))
    await kind.journal.renew(RUN, fence, LEASE)
    with pytest.raises(RunBusy):
        await kind.journal.acquire(RUN, "b", LEASE)


# -- entries ------------------------------------------------------------------------------------


async def test_intents_are_kept_by_position_and_counted(kind: Kind) -> None:
    fence = await kind.journal.acquire(RUN, "a", LEASE)
    recorded = [entry(2), entry(0), entry(1, server="mail", tool="send", arguments={})]
    for each in recorded:
        await kind.journal.record_intent(RUN, fence, each)
    await kind.journal.mark_done(RUN, fence, 0)
    got = await kind.journal.entries(RUN)
    assert [e.position for e in got] == [0, 1, 2]
    assert got[1] == recorded[2]
    assert got[2] == recorded[0]
    assert got[0].state == "done" and got[0].same_call(recorded[1])
    assert got[0].at == recorded[1].at
    summary = await kind.journal.run(RUN)
    assert summary is not None and (summary.calls, summary.dangling) == (3, 2)


async def test_recording_the_same_call_again_changes_nothing(kind: Kind) -> None:
    """A resumed run re-records the intent of a call it resends: a no-op, done stays done."""
    fence = await kind.journal.acquire(RUN, "a", LEASE)
    await kind.journal.record_intent(RUN, fence, entry(0))
    await kind.journal.mark_done(RUN, fence, 0)
    before = await snapshot(kind)
    await kind.journal.record_intent(RUN, fence, entry(0, at=1_800_000_000.0))
    await kind.journal.mark_done(RUN, fence, 0)
    after = await snapshot(kind)
    assert after[1] == before[1]
    assert after[0] is not None and (after[0].calls, after[0].dangling) == (1, 0)


@pytest.mark.parametrize(
    "other",
    [
        {"tool": "refund"},
        {"server": "other"},
        {"arguments": {"customer": "c-43"}},
        {"run_id": "another-run"},  # same call, another key
    ],
)
async def test_another_call_at_a_recorded_position_is_refused(
    kind: Kind, other: dict[str, object]
) -> None:
    fence = await kind.journal.acquire(RUN, "a", LEASE)
    await kind.journal.record_intent(RUN, fence, entry(0))
    before = await snapshot(kind)
    with pytest.raises(EntryConflict, match="never overwritten"):
        await kind.journal.record_intent(RUN, fence, entry(0, **other))  # type: ignore[arg-type]
    assert await snapshot(kind) == before


async def test_marking_an_unrecorded_position_done_is_refused(kind: Kind) -> None:
    fence = await kind.journal.acquire(RUN, "a", LEASE)
    with pytest.raises(EntryConflict, match="no intent at position 3"):
        await kind.journal.mark_done(RUN, fence, 3)


async def test_only_intents_are_recorded(kind: Kind) -> None:
    fence = await kind.journal.acquire(RUN, "a", LEASE)
    done = entry(0)
    with pytest.raises(ValueError, match="records intents"):
        await kind.journal.record_intent(
            RUN,
            fence,
            type(done)(**{**done.__dict__, "state": "done"}),
        )
    assert await kind.journal.entries(RUN) == []


async def test_names_and_keys_survive_any_characters(kind: Kind) -> None:
    fence = await kind.journal.acquire(RUN, "a", LEASE)
    odd = entry(0, server='sé|rv"er', tool="t|o{o}l\\n")
    await kind.journal.record_intent(RUN, fence, odd)
    assert await kind.journal.entries(RUN) == [odd]


async def test_an_odd_run_id_is_its_own_run(kind: Kind) -> None:
    odd = "run {with} braces:é"
    fence = await kind.journal.acquire(odd, "a", LEASE)
    await kind.journal.record_intent(odd, fence, entry(0, run_id=odd))
    assert [e.position for e in await kind.journal.entries(odd)] == [0]
    assert await kind.journal.entries("run ") == []


async def test_concurrent_intents_of_one_turn_are_all_recorded(kind: Kind) -> None:
    fence = await kind.journal.acquire(RUN, "a", LEASE)
    async with anyio.create_task_group() as tg:
        for position in range(20):
            tg.start_soon(kind.journal.record_intent, RUN, fence, entry(position))
    summary = await kind.journal.run(RUN)
    assert summary is not None and (summary.calls, summary.dangling) == (20, 20)
    assert [e.position for e in await kind.journal.entries(RUN)] == list(range(20))


# -- finishing ----------------------------------------------------------------------------------


async def test_a_finished_run_is_released_and_records_nothing_more(kind: Kind) -> None:
    fence = await kind.journal.acquire(RUN, "a", LEASE)
    await kind.journal.record_intent(RUN, fence, entry(0))
    kind.clock.advance(5)
    await kind.journal.finish(RUN, fence)
    summary = await kind.journal.run(RUN)
    assert summary is not None
    assert summary.state == "finished" and summary.holder is None
    assert summary.finished_at == pytest.approx(kind.clock())
    # Resuming a finished run: it may be held again (so two resumers still exclude each
    # other), but it records nothing more.
    again = await kind.journal.acquire(RUN, "b", LEASE)
    with pytest.raises(RunFinished):
        await kind.journal.record_intent(RUN, again, entry(1))
    with pytest.raises(RunFinished):
        await kind.journal.mark_done(RUN, again, 0)
    kind.clock.advance(5)
    await kind.journal.finish(RUN, again)
    summary = await kind.journal.run(RUN)
    assert summary is not None and summary.finished_at == pytest.approx(kind.clock() - 5)
    assert [e.state for e in await kind.journal.entries(RUN)] == ["intent"]


# -- the operator's view, purge and sweep -------------------------------------------------------


async def test_runs_lists_every_run_oldest_first(kind: Kind) -> None:
    first = await kind.journal.acquire("run-b", "a", LEASE)
    await kind.journal.record_intent("run-b", first, entry(0, run_id="run-b"))
    await kind.journal.record_intent("run-b", first, entry(1, run_id="run-b"))
    await kind.journal.mark_done("run-b", first, 0)
    kind.clock.advance(10)
    second = await kind.journal.acquire("run-a", "a", LEASE)
    await kind.journal.finish("run-a", second)
    listed = await kind.journal.runs()
    assert [(r.run_id, r.state, r.calls, r.dangling) for r in listed] == [
        ("run-b", "running", 2, 1),
        ("run-a", "finished", 0, 0),
    ]
    assert listed[0].age(kind.clock()) == pytest.approx(10)


async def test_purge_forgets_a_run_but_not_a_held_one(kind: Kind) -> None:
    fence = await kind.journal.acquire(RUN, "a", LEASE)
    await kind.journal.record_intent(RUN, fence, entry(0))
    with pytest.raises(RunBusy, match="force"):
        await kind.journal.purge(RUN)
    assert (await snapshot(kind))[0] is not None
    assert await kind.journal.purge(RUN, force=True) is True
    assert await snapshot(kind) == (None, [])
    assert await kind.journal.purge(RUN) is False
    assert await kind.journal.runs() == []
    # The run id starts afresh, and the purged holder's fence writes nothing into it.
    assert await kind.journal.acquire(RUN, "b", LEASE) == 1


async def test_purge_takes_an_abandoned_run_without_force(kind: Kind) -> None:
    await kind.journal.acquire(RUN, "a", LEASE)
    kind.clock.advance(LEASE + 1)
    assert await kind.journal.purge(RUN) is True


async def test_sweep_forgets_finished_runs_past_the_retention_only(kind: Kind) -> None:
    old = await kind.journal.acquire("old", "a", LEASE)
    await kind.journal.record_intent("old", old, entry(0, run_id="old"))
    await kind.journal.finish("old", old)
    await kind.journal.acquire("unfinished", "a", LEASE)
    kind.clock.advance(RETENTION / 2)
    young = await kind.journal.acquire("young", "a", LEASE)
    await kind.journal.finish("young", young)
    assert await kind.journal.sweep() == 0
    kind.clock.advance(RETENTION / 2)
    assert await kind.journal.sweep() == 1
    assert await kind.journal.entries("old") == []
    assert [r.run_id for r in await kind.journal.runs()] == ["unfinished", "young"]
    # `now` may be given: far in the future, every finished run goes, unfinished ones never.
    assert await kind.journal.sweep(kind.clock() + 100 * RETENTION) == 1
    assert [r.run_id for r in await kind.journal.runs()] == ["unfinished"]


async def test_sweep_keeps_the_journal_bounded(kind: Kind) -> None:
    """Runs started and finished forever: after each sweep, only those inside the retention
    remain, however many came before."""
    for step in range(30):
        run_id = f"run-{step}"
        fence = await kind.journal.acquire(run_id, "a", LEASE)
        await kind.journal.record_intent(run_id, fence, entry(0, run_id=run_id))
        await kind.journal.mark_done(run_id, fence, 0)
        await kind.journal.finish(run_id, fence)
        kind.clock.advance(RETENTION / 4)
        await kind.journal.sweep()
        assert len(await kind.journal.runs()) <= 5


async def test_a_second_journal_over_the_same_data_sees_the_same_runs(kind: Kind) -> None:
    other = kind.reopen()
    if other is None:
        pytest.skip("the memory journal is one object; nothing else can open it")
    fence = await kind.journal.acquire(RUN, "a", LEASE)
    await kind.journal.record_intent(RUN, fence, entry(0))
    with pytest.raises(RunBusy):
        await other.acquire(RUN, "b", LEASE)
    assert await other.entries(RUN) == await kind.journal.entries(RUN)


@pytest.mark.parametrize(
    ("run_id", "holder", "lease"),
    [("", "a", 1.0), ("r", "", 1.0), ("r", "a", 0), ("r", "a", float("nan")), ("x" * 201, "a", 1)],
)
async def test_bad_arguments_are_refused_before_anything_is_written(
    kind: Kind, run_id: str, holder: str, lease: float
) -> None:
    with pytest.raises(ValueError):
        await kind.journal.acquire(run_id, holder, lease)
    assert await kind.journal.runs() == []


def test_every_refusal_is_a_journal_error() -> None:
    for error in (RunBusy, FencedOut, RunFinished, EntryConflict):
        assert issubclass(error, JournalError)
