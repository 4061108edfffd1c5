"""`Run`: the journal of one agent pipeline run, so that a killed and restarted agent sends the
calls it had already sent under the keys it sent them with, instead of minting new ones.

A run is a key source with a memory: the key of a call is derived from (run id, the call's
position in the run), never from the arguments the model wrote, and the journal holds, per
position, which call was made there (server, tool, argument fingerprint) and whether its answer
came back. The session (`RetryingSession(..., run=run)`) asks the run, for each call it has no key
for, what to do (`Run.claim`): a new position is recorded as an intent before anything is sent; a
position the journal already holds is resumed under its key if it is the same call on a tool that
may be sent again, and refused otherwise (`RunDiverged`, `RunExpired`, `OutcomeUnknown`), with
nothing sent. Results are not kept: a guarded server replays them by key.

Positions: calls made one after another take 0, 1, 2, ... in the order they are made. Calls a
model asked for in one response and that run concurrently are numbered by their index in that
response, not by completion order (`Run.turn`), so a resume after a kill in the middle of a
gather numbers them the same way again.

One writer per run: entering a `Run` acquires the journal's fenced lease and renews it in a
background task. A run another holder has is waited for (`wait=`), up to its lease, then taken
over with a higher fence; a holder proven dead on this host (its process gone or replaced,
`_journal/holder.py`) is taken over at once, so a supervisor's immediate restart of a killed
agent resumes it; `RunBusy` only for a holder still live past the wait.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import socket
import time
import uuid
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from mcp_types import Tool

from ._catalog import advertised_retention
from ._gate import retry_gate
from ._journal import (
    DEFAULT_LEASE,
    Clock,
    Entry,
    FencedOut,
    Journal,
    RunBusy,
    RunFinished,
    open_journal,
)
from ._journal import holder as holders
from ._journal.lease import check_lease, check_run_id
from ._key import derive_key
from ._outcome import OutcomeUnknown
from ._policy import Override

logger = logging.getLogger("orchestrator.run")

#: The prefix of keys derived from a run id and a position.
KEY_SOURCE = "run"
#: The default wait for a held run, in leases: a little more than one, so that a holder that
#: died where its death cannot be seen (another host) is outlasted, with room for clock skew.
WAIT_PER_LEASE = 1.2


def run_key(run_id: str, position: int) -> str:
    """The key of the call at `position` of run `run_id`: the same in every process, hashed so
    the run id never reaches the wire."""
    return derive_key(KEY_SOURCE, run_id, str(position))


class RunDiverged(Exception):
    """The call made at a position differs from the one the journal holds there (another tool,
    another server or other arguments): nothing was sent.

    Sending it under the recorded key would be refused or replay the other call's result;
    sending it under a new key would leave the recorded call's fate unknown. Either way the run
    no longer follows its first course, which only the caller can decide about (use a new run
    id to start afresh). Names both calls by server, tool and argument fingerprint, never by
    their arguments.
    """

    def __init__(
        self, run_id: str, position: int, recorded: Entry, server: str, tool: str, fingerprint: str
    ) -> None:
        self.run_id = run_id
        self.position = position
        self.recorded = recorded
        self.server = server
        self.tool = tool
        self.fingerprint = fingerprint
        super().__init__(
            f"run {run_id!r} diverged at position {position}: the journal holds"
            f" {recorded.tool!r} on server {recorded.server!r} (arguments {recorded.fingerprint}),"
            f" this call is {tool!r} on server {server!r} (arguments {fingerprint});"
            " nothing was sent"
        )


class RunExpired(Exception):
    """The journal's entry at a position is older than the server keeps keys for the tool: the
    server may have forgotten the key, so resending would run the call again. Nothing was sent."""

    def __init__(self, run_id: str, position: int, tool: str, age: float, retention: float) -> None:
        self.run_id = run_id
        self.position = position
        self.tool = tool
        self.age = age
        self.retention = retention
        super().__init__(
            f"run {run_id!r} position {position} ({tool!r}) was sent {age:.0f}s ago; the server"
            f" keeps keys for {retention:.0f}s, so a resend could run it again; nothing was sent"
        )


@dataclass(frozen=True)
class Claim:
    """What the run decided for one call: send it under `key` at `position`. `resumed`: the
    journal already held it (from an earlier process, or this one); `done`: its answer was
    recorded before."""

    position: int
    key: str
    resumed: bool
    done: bool


class Turn:
    """The calls of one model response: `size` positions reserved together, one per tool call
    of the response, so each call's position is its index in the response whatever order the
    calls start or finish in."""

    def __init__(self, run: Run, base: int, size: int) -> None:
        self.run = run
        self.base = base
        self.size = size

    def __repr__(self) -> str:
        return f"Turn(positions {self.base}..{self.base + self.size - 1})"

    @contextlib.contextmanager
    def call(self, index: int) -> Iterator[None]:
        """The call made inside this block is the `index`-th of the response (0-based)."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"a turn index must be an int, not {type(index).__name__}")
        if not 0 <= index < self.size:
            raise ValueError(f"turn index {index} is outside this turn of {self.size} call(s)")
        token = _placed.set((self.run, self.base + index))
        try:
            yield
        finally:
            _placed.reset(token)


#: The position the next call of a run takes, when a turn placed it (`Turn.call`).
_placed: contextvars.ContextVar[tuple[Run, int] | None] = contextvars.ContextVar(
    "mcp_once_run_placed", default=None
)
#: The turn open in this context (`Run.turn`): a call inside it must say its index.
_open_turn: contextvars.ContextVar[Turn | None] = contextvars.ContextVar(
    "mcp_once_run_turn", default=None
)


def placed_run() -> Run | None:
    """The run a `Turn.call` block placed the current call in (how a framework hook hands its
    run to the session under it), or None."""
    placed = _placed.get()
    return placed[0] if placed is not None else None


class Run:
    """One run of an agent pipeline, journalled: `async with Run(run_id) as run:`.

    Pass it to the sessions the pipeline calls through (`RetryingSession(..., run=run)`, and
    the `run=` of the framework adapters). `run_id` names the run the same way in every process
    that runs it (a restart resumes it); it must not be reused for another run, since it fixes
    the keys. `journal`: a `Journal`, a URL (`sqlite:///path.db`, `redis://...`, `memory://`), or
    None for `.mcp-once/journal.db` under the working directory. `lease`: seconds the run stays
    held without a renewal (renewed every third of it while the block runs). `wait`: seconds to
    wait for another holder of the run to let go or for its lease to run out (default: the
    lease and a fifth more, so a holder that died elsewhere is outlasted); a holder proven dead
    on this host is not waited for, and one still live past the wait is `RunBusy`. `clock`: wall
    time for entry ages (tests inject one).

    Leaving the block normally finishes the run (its entries are final, the journal's retention
    starts); leaving it with an exception releases it, so a restart resumes it at once.
    """

    def __init__(
        self,
        run_id: str,
        *,
        journal: Journal | str | None = None,
        lease: float = DEFAULT_LEASE,
        wait: float | None = None,
        clock: Clock | None = None,
        holder: str | None = None,
    ) -> None:
        self.run_id = check_run_id(run_id)
        self.lease = check_lease(lease)
        self.wait = holders.check_wait(self.lease * WAIT_PER_LEASE if wait is None else wait)
        if journal is not None and not isinstance(journal, str):
            for method in ("acquire", "record_intent", "mark_done", "entries", "release"):
                if not callable(getattr(journal, method, None)):
                    raise TypeError(
                        f"journal must be a Journal, a URL or None, not {type(journal).__name__}"
                    )
        if clock is not None and not callable(clock):
            raise TypeError("clock must be a callable returning seconds, or None")
        if holder is not None and (not isinstance(holder, str) or not holder):
            raise ValueError(f"holder must be a non-empty string, not {holder!r}")
        self._journal_given = journal
        self._clock: Clock = clock if clock is not None else time.time
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._journal: Journal | None = None
        self._owns_journal = False
        self._fence: int | None = None
        self._entries: dict[int, Entry] = {}
        self._taken: set[int] = set()
        self._next = 0
        self._turns: dict[Hashable, Turn] = {}
        self._finished_before = False
        self._lost: RunBusy | None = None
        self._closed = False
        self._group: TaskGroup | None = None
        self._renewal: anyio.CancelScope | None = None

    def __repr__(self) -> str:
        return f"Run({self.run_id!r})"

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Run:
        if self._fence is not None or self._closed:
            raise RuntimeError("a Run is entered once; make a new Run to resume it")
        given = self._journal_given
        if given is None or isinstance(given, str):
            self._journal = open_journal(given, clock=self._clock)
            self._owns_journal = True
        else:
            self._journal = given
        journal = self._journal
        try:
            self._fence = await holders.enter(
                journal,
                self.run_id,
                self.holder,
                self.lease,
                wait=self.wait,
                alive=holders.this_process(),
            )
            with anyio.CancelScope(shield=True):
                summary = await journal.run(self.run_id)
                entries = await journal.entries(self.run_id)
        except BaseException:
            with anyio.CancelScope(shield=True):
                if self._fence is not None:
                    # Held and unusable: let go, so a restart need not wait for the lease.
                    with contextlib.suppress(Exception):
                        await journal.release(self.run_id, self._fence)
                    self._fence = None
                await self._close_journal()
            raise
        self._finished_before = summary is not None and summary.state == "finished"
        self._entries = {entry.position: entry for entry in entries}
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        await group.start(self._renew)
        logger.debug(
            "run %r entered (fence %d, %d entries)", self.run_id, self._fence, len(entries)
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._closed = True
        try:
            if self._renewal is not None:
                self._renewal.cancel()
            if self._group is not None:
                # Not the body's exception: the group only holds the renewal (which raises
                # nothing), and handing it the exception would wrap it in an ExceptionGroup.
                await self._group.__aexit__(None, None, None)
        finally:
            journal, fence = self._journal, self._fence
            with anyio.CancelScope(shield=True):
                try:
                    if journal is not None and fence is not None:
                        if exc_type is None and self._lost is None:
                            await journal.finish(self.run_id, fence)
                            # Each finished run forgets those finished more than the retention
                            # ago: the journal stays bounded with no sweeper to run. One short
                            # write per run; a failure here costs nothing but the sweep.
                            await journal.sweep()
                        else:
                            await journal.release(self.run_id, fence)
                except Exception as error:  # cleanup: a stale or failing journal must not mask
                    logger.warning(
                        "run %r: leaving it failed (%s)", self.run_id, type(error).__name__
                    )
                finally:
                    await self._close_journal()
        return None

    async def _close_journal(self) -> None:
        if self._owns_journal and self._journal is not None:
            with anyio.CancelScope(shield=True):
                await self._journal.aclose()

    async def _renew(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Renew the lease every third of it. Losing the fence (another holder took the run over)
        stops the run's writes; a failing journal is retried at the next tick, since the fence,
        not the clock, decides who writes."""
        with anyio.CancelScope() as scope:
            self._renewal = scope
            task_status.started()
            journal, fence = self._journal, self._fence
            assert journal is not None and fence is not None
            while True:
                await anyio.sleep(self.lease / 3)
                try:
                    with anyio.CancelScope(shield=True):
                        await journal.renew(self.run_id, fence, self.lease)
                except FencedOut as lost:
                    self._lost = lost
                    logger.warning("run %r: another holder took it over", self.run_id)
                    return
                except Exception as error:
                    logger.warning(
                        "run %r: renewing the lease failed (%s)", self.run_id, type(error).__name__
                    )

    # -- what callers see ---------------------------------------------------------------------

    @property
    def journal(self) -> Journal:
        if self._journal is None:
            raise RuntimeError("enter the Run (`async with Run(...) as run:`) first")
        return self._journal

    @property
    def fence(self) -> int | None:
        """The fence this holder writes with (None before entering)."""
        return self._fence

    @property
    def resumed(self) -> bool:
        """Whether the journal held entries of this run when it was entered."""
        return bool(self._entries) and self._fence is not None

    @property
    def finished_before(self) -> bool:
        """Whether this run had finished before it was entered (its calls can only replay)."""
        return self._finished_before

    def entries(self) -> list[Entry]:
        """The entries this holder knows, by position (the journal's, kept up to date)."""
        return [self._entries[position] for position in sorted(self._entries)]

    def now(self) -> float:
        return self._clock()

    @contextlib.contextmanager
    def turn(self, size: int) -> Iterator[Turn]:
        """Reserve `size` positions for the calls of one model response.

        Inside, each call says which of the response's calls it is: `with turn.call(index):`
        (a call inside the block without one is refused: its position would depend on timing).
        Positions after the block continue past the reservation, used or not.
        """
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"a turn's size must be a non-negative int, not {size!r}")
        current = _open_turn.get()
        if current is not None and current.run is self:
            raise RuntimeError("turns of one run do not nest")
        turn = self._reserve(size)
        token = _open_turn.set(turn)
        try:
            yield turn
        finally:
            _open_turn.reset(token)

    def turn_of(self, response: Hashable, size: int) -> Turn:
        """The turn of the model response named `response` (reserved the first time it is
        named): how a framework hook numbers the calls of one response, which it sees one at
        a time, by their index in it."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"a turn's size must be a non-negative int, not {size!r}")
        turn = self._turns.get(response)
        if turn is None:
            turn = self._turns[response] = self._reserve(size)
        elif turn.size != size:
            raise ValueError(f"response {response!r} had {turn.size} calls, now {size}")
        return turn

    def _reserve(self, size: int) -> Turn:
        turn = Turn(self, self._next, size)
        self._next += size
        return turn

    # -- the session's side ---------------------------------------------------------------------

    def _position(self) -> tuple[int, bool]:
        """The position the call being made would take, and whether it is the next free one
        (else a turn placed it); refuses a call that cannot take one."""
        self._check_live()
        placed = _placed.get()
        if placed is not None and placed[0] is self:
            position, fresh = placed[1], False
        else:
            turn = _open_turn.get()
            if turn is not None and turn.run is self:
                raise ValueError(
                    "a call inside run.turn() must say which call of the response it is:"
                    " `with turn.call(index):`"
                )
            position, fresh = self._next, True
        if position in self._taken:
            raise ValueError(
                f"position {position} of run {self.run_id!r} was already called in this"
                " process; one call per turn.call(index) block"
            )
        return position, fresh

    def next_key(self) -> str:
        """The key of the position the call being made would take, without taking it: what a
        call that could not even connect reports (`NotExecuted.key`), since it leaves no entry
        and a position is only taken by a call that is sent."""
        return run_key(self.run_id, self._position()[0])

    def take_position(self) -> int:
        """The position of the call being made: its turn index if a turn placed it, else the
        next one. Synchronous, so calls started in order take positions in that order."""
        position, fresh = self._position()
        if fresh:
            self._next += 1
        self._taken.add(position)
        return position

    async def claim(
        self,
        position: int,
        *,
        server: str,
        tool: str,
        fingerprint: str,
        listing: Tool | None = None,
        lookup: Any = None,
        overrides: Mapping[str, Override] | None = None,
        trust_annotations: bool = True,
    ) -> Claim:
        """Decide the call at `position` (`fingerprint`: `fingerprint_arguments` of its
        arguments), before anything is sent (see the module doc).

        A new position: the intent is recorded (durably, shielded from cancellation) and the
        claim returned. A recorded one: `RunDiverged` if it is another call; `OutcomeUnknown`
        if the tool's gate is closed (reason "resumed_intent" when its answer never came back,
        "resumed_done" when it did: either way it may have run, results are not journalled, and
        a second run could duplicate it); `RunExpired` if older than the server's advertised
        retention; else the recorded key. `lookup` (an async callable returning the tool's
        listing) is only awaited for a recorded position.
        """
        key = run_key(self.run_id, position)
        entry = self._entries.get(position)
        if entry is None:
            if self._finished_before:
                raise RunFinished(self.run_id)
            intent = Entry(
                position=position,
                server=server,
                tool=tool,
                fingerprint=fingerprint,
                key=key,
                state="intent",
                at=self._clock(),
            )
            await self._write_intent(intent)
            return Claim(position, key, resumed=False, done=False)
        if (entry.server, entry.tool, entry.fingerprint) != (server, tool, fingerprint):
            raise RunDiverged(self.run_id, position, entry, server, tool, fingerprint)
        if listing is None and lookup is not None:
            listing = await lookup()
        decision = retry_gate(
            "maybe_executed",
            tool_name=tool,
            tool=listing,
            overrides=overrides or {},
            trust_annotations=trust_annotations,
            key_attached=True,
        )
        if not decision.open:
            raise OutcomeUnknown(
                tool=tool,
                key=entry.key,
                attempts=0,
                last_error=None,
                reason="resumed_done" if entry.state == "done" else "resumed_intent",
            )
        retention = advertised_retention(listing)
        age = self._clock() - entry.at
        if retention is not None and age > retention:
            raise RunExpired(self.run_id, position, tool, age, retention)
        return Claim(position, entry.key, resumed=True, done=entry.state == "done")

    async def _write_intent(self, intent: Entry) -> None:
        journal, fence = self.journal, self._fence
        assert fence is not None
        try:
            with anyio.CancelScope(shield=True):
                await journal.record_intent(self.run_id, fence, intent)
        except FencedOut as lost:
            self._lost = lost
            raise
        self._entries[intent.position] = intent

    async def done(self, claim: Claim) -> None:
        """Record that the call of `claim` was answered. Never raises: the answer is in hand,
        and a done that could not be recorded only leaves an intent, which a resume treats as
        "may have run" (resent under its key where the gate allows it)."""
        if claim.done or self._finished_before:
            return
        journal, fence = self.journal, self._fence
        assert fence is not None
        try:
            with anyio.CancelScope(shield=True):
                await journal.mark_done(self.run_id, fence, claim.position)
        except FencedOut as lost:
            self._lost = lost
            return
        except Exception as error:
            logger.warning(
                "run %r: marking position %d done failed (%s)",
                self.run_id,
                claim.position,
                type(error).__name__,
            )
            return
        entry = self._entries.get(claim.position)
        if entry is not None:
            self._entries[claim.position] = Entry(
                position=entry.position,
                server=entry.server,
                tool=entry.tool,
                fingerprint=entry.fingerprint,
                key=entry.key,
                state="done",
                at=entry.at,
            )

    def _check_live(self) -> None:
        if self._fence is None:
            raise RuntimeError("enter the Run (`async with Run(...) as run:`) before calling")
        if self._lost is not None:
            raise RunBusy(
                self.run_id, f"run {self.run_id!r} was taken over by another holder: {self._lost}"
            )
        if self._closed:
            raise RuntimeError(f"run {self.run_id!r} is over; make a new Run to resume it")
