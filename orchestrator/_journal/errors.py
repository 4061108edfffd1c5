"""How a journal call fails: one base class, so a caller can catch "the journal said no" apart
from bugs, and `RunBusy` for the one refusal a second copy of a run must see (it is what
`orchestrator` will export)."""

from __future__ import annotations


class JournalError(Exception):
    """A journal refused or could not do what was asked."""


class RunBusy(JournalError):
    """Another holder has this run: its lease is live, so a second copy must not write.

    Two copies of one run interleaving their calls would number them differently and defeat the
    journal; refusing the second one is the only safe answer while the first may still be alive.
    Carries what the journal knows of that holder, so the caller can judge it: its name, its
    fence, its proof of life (`alive`, None if it recorded none) and the seconds its lease has
    `left` (None where the refusal is not about a lease).
    """

    def __init__(
        self,
        run_id: str,
        message: str,
        *,
        holder: str | None = None,
        fence: int | None = None,
        alive: str | None = None,
        left: float | None = None,
    ) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.holder = holder
        self.fence = fence
        self.alive = alive
        self.left = left


class FencedOut(RunBusy):
    """The fence given is no longer the run's current one (someone took the run over, or it
    was released): the write was refused and nothing changed.

    A subclass of `RunBusy` because, to the stale holder, it means the same: another copy owns
    the run now, stop.
    """


class RunFinished(JournalError):
    """The run is finished; its entries are final and no more intents are recorded in it."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} is finished; it records nothing more")
        self.run_id = run_id


class EntryConflict(JournalError):
    """A position already holds another call, or a call to mark done was never recorded.

    The journal never overwrites an entry: the key at a position is what makes a resumed call
    the same call, so changing it would silently turn a replay into a second effect.
    """


class JournalUnavailable(JournalError):
    """The journal's storage failed (locked too long, unreachable, not ours). Fail closed: a
    call whose intent could not be recorded must not be sent."""
