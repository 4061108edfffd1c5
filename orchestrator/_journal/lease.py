"""Where a run is leased and fenced: the pure rules the memory and SQLite journals apply to a
run's head row inside their own atomicity (a lock, a `BEGIN IMMEDIATE`). The Redis journal
mirrors them in Lua (`lua/lib.lua`).

The fence, not the clock, decides who may write: a holder keeps writing with its fence until
someone takes the run over, even past its lease. That is safe because a takeover always raises
the fence, and it spares a slow-but-alive holder from failing when nobody wanted the run.
"""

from __future__ import annotations

import dataclasses
import math

from .errors import FencedOut, RunBusy, RunFinished
from .journal import RunSummary


def check_run_id(run_id: object) -> str:
    """A run id is a non-empty string of at most 200 characters (it is stored with every run
    and shown by the operator commands)."""
    if not isinstance(run_id, str) or not run_id:
        raise ValueError(f"a run id must be a non-empty string, not {run_id!r}")
    if len(run_id) > 200:
        raise ValueError(f"a run id must be at most 200 characters, not {len(run_id)}")
    return run_id


def check_lease(lease: object) -> float:
    if (
        isinstance(lease, bool)
        or not isinstance(lease, int | float)
        or not math.isfinite(lease)
        or lease <= 0
    ):
        raise ValueError(f"a lease must be a positive number of seconds, not {lease!r}")
    return float(lease)


def check_holder(holder: object) -> str:
    if not isinstance(holder, str) or not holder:
        raise ValueError(f"a holder must be a non-empty string, not {holder!r}")
    return holder


def acquired(
    head: RunSummary | None,
    run_id: str,
    holder: str,
    lease: float,
    now: float,
    *,
    alive: str | None = None,
    dead: int | None = None,
) -> RunSummary:
    """The head after `holder` (proof of life `alive`) acquires the run: a new run at fence 1,
    or the next fence. A live holder refuses it (`RunBusy`) unless its fence is `dead`."""
    if head is None:
        return RunSummary(
            run_id=run_id,
            state="running",
            calls=0,
            dangling=0,
            fence=1,
            holder=holder,
            lease_deadline=now + lease,
            created_at=now,
            updated_at=now,
            finished_at=None,
            alive=alive,
        )
    if head.held(now) and head.holder != holder and head.fence != dead:
        left = (head.lease_deadline or now) - now
        raise busy(run_id, head.holder, left, head.fence, head.alive)
    return dataclasses.replace(
        head,
        fence=head.fence + 1,
        holder=holder,
        lease_deadline=now + lease,
        updated_at=now,
        alive=alive,
    )


def busy(run_id: str, holder: str | None, left: float, fence: int, alive: str | None) -> RunBusy:
    """The refusal of a run another holder has: what a waiter needs to judge that holder."""
    return RunBusy(
        run_id,
        f"run {run_id!r} is held by {holder!r} (fence {fence}) for {left:.1f}s more",
        holder=holder,
        fence=fence,
        alive=alive,
        left=left,
    )


def held(head: RunSummary | None, run_id: str, fence: int, *, writing: bool = False) -> RunSummary:
    """`head`, if `fence` holds it; `FencedOut` if not, and `RunFinished` for a write to a
    finished run."""
    if head is None:
        raise FencedOut(run_id, f"run {run_id!r} does not exist (fence {fence} holds nothing)")
    if head.fence != fence or head.holder is None:
        raise FencedOut(
            run_id,
            f"fence {fence} no longer holds run {run_id!r}"
            f" (current fence {head.fence}, {'held' if head.holder else 'released'})",
        )
    if writing and head.state == "finished":
        raise RunFinished(run_id)
    return head


def renewed(head: RunSummary, lease: float, now: float) -> RunSummary:
    return dataclasses.replace(head, lease_deadline=now + lease, updated_at=now)


def released(head: RunSummary, now: float) -> RunSummary:
    return dataclasses.replace(head, holder=None, lease_deadline=None, updated_at=now, alive=None)


def finished(head: RunSummary, now: float) -> RunSummary:
    """Finished and released; finishing twice keeps the first finish time."""
    return dataclasses.replace(
        head,
        state="finished",
        finished_at=head.finished_at if head.finished_at is not None else now,
        holder=None,
        lease_deadline=None,
        updated_at=now,
        alive=None,
    )


def purgeable(head: RunSummary, now: float, *, force: bool) -> None:
    """`RunBusy` unless the run may be forgotten: a live holder is never pulled out from under
    its run unless the operator insists."""
    if head.held(now) and not force:
        raise RunBusy(
            head.run_id,
            f"run {head.run_id!r} is held by {head.holder!r}; purge it with force to override",
        )


def swept(head: RunSummary, cutoff: float) -> bool:
    """Whether the sweep forgets this run: finished at or before `cutoff` (now - retention).
    Unfinished runs are kept whatever their age: forgetting dangling intents would let a resume
    send them again under fresh keys, the very duplicate the journal exists to prevent."""
    return head.state == "finished" and head.finished_at is not None and head.finished_at <= cutoff
