"""The `Journal` protocol: what a `Run` needs from wherever its entries are kept, and the run
summaries the operator commands list.

Every backend keeps the same promises, checked by one contract suite:

- one writer per run: `acquire` hands out a fence (a number that only grows) under a lease; a
  live lease of another holder is `RunBusy`, an expired one is taken over with a higher fence,
  and so is a live one whose holder the caller proved dead (`dead=`: only while that fence
  still holds the run, so of two copies taking over one dead holder one wins);
- each holder's proof of life (`alive=`, see `holder.py`) is kept with it, and reported only
  for the fence that wrote it (a holder written by a release that records none has none);
- every write names its fence, and a stale one changes nothing (`FencedOut`), so a holder that
  was presumed dead and comes back cannot interleave with the one that took over;
- `record_intent` is durable when it returns, before the call it records is sent;
- entries are never overwritten, and a finished run records nothing more;
- `sweep` forgets finished runs older than the retention, so the journal stays bounded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from .entry import Entry

Clock = Callable[[], float]
RunState = Literal["running", "finished"]

#: Seconds a lease lasts unless renewed: long enough that a live holder renewing at a third of
#: it never loses the run over a pause, short enough that a crashed one blocks a restart briefly.
DEFAULT_LEASE = 30.0
#: How long a finished run is kept (7 days): past it, the servers' keys are gone too, so its
#: entries could not make a replay happen anyway.
DEFAULT_RETENTION = 7 * 24 * 3600.0


@dataclass(frozen=True)
class RunSummary:
    """One run as the operator sees it: `calls` entries, `dangling` of them intents without a
    done (calls whose outcome the run never learnt), who holds it and until when, and the
    holder's proof of life (`alive`, `holder.Proof` encoded; None if it recorded none)."""

    run_id: str
    state: RunState
    calls: int
    dangling: int
    fence: int
    holder: str | None
    lease_deadline: float | None
    created_at: float
    updated_at: float
    finished_at: float | None
    alive: str | None = None

    def age(self, now: float) -> float:
        """Seconds since the run was created."""
        return max(0.0, now - self.created_at)

    def held(self, now: float) -> bool:
        """Whether a holder's lease on the run is live at `now`."""
        return self.holder is not None and (self.lease_deadline or 0.0) > now


class Journal(Protocol):
    """Where a run's intents are recorded and marked done, under a fenced lease."""

    #: Seconds a finished run is kept before `sweep` forgets it.
    retention: float

    async def acquire(
        self,
        run_id: str,
        holder: str,
        lease: float,
        *,
        alive: str | None = None,
        dead: int | None = None,
    ) -> int:
        """Hold `run_id` for `lease` seconds as `holder` (its proof of life `alive`); the new
        fence, higher than any before. `RunBusy`, carrying the holder, its fence, proof and
        lease left, if another holder's lease is live, unless that holder's fence is `dead`
        (the caller proved it dead). Creates the run if it is new."""
        ...

    async def renew(self, run_id: str, fence: int, lease: float) -> None:
        """Extend the lease to `lease` seconds from now; `FencedOut` if `fence` is stale."""
        ...

    async def release(self, run_id: str, fence: int) -> bool:
        """Let the run go (a restart may take it at once). False, changing nothing, if `fence`
        is stale: release is cleanup and must never undo a newer holder."""
        ...

    async def entries(self, run_id: str) -> list[Entry]:
        """The run's entries by position (empty for an unknown run)."""
        ...

    async def record_intent(self, run_id: str, fence: int, entry: Entry) -> None:
        """Record that `entry`'s call is about to be sent; durable on return. The same call
        again at its position is a no-op; another call there is `EntryConflict`."""
        ...

    async def mark_done(self, run_id: str, fence: int, position: int) -> None:
        """Record that the call at `position` was answered."""
        ...

    async def finish(self, run_id: str, fence: int) -> None:
        """Mark the run finished (its retention starts now) and release it."""
        ...

    async def run(self, run_id: str) -> RunSummary | None:
        """The summary of one run, or None if the journal does not know it."""
        ...

    async def runs(self) -> list[RunSummary]:
        """Every run the journal holds, oldest first."""
        ...

    async def purge(self, run_id: str, *, force: bool = False) -> bool:
        """Forget one run, finished or not; `RunBusy` if held by a live lease (unless `force`).
        True if there was a run to forget."""
        ...

    async def sweep(self, now: float | None = None) -> int:
        """Forget finished runs that finished more than `retention` before `now` (default:
        the journal's clock); how many were forgotten."""
        ...

    async def aclose(self) -> None:
        """Close connections; the journal is unusable afterwards."""
        ...
