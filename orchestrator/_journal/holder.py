"""Who holds a run, and whether it can still write: the proof of life recorded with each holder,
and how a new holder enters a held run (rule 21 of the contract).

A lease alone cannot tell a dead holder from a live one before it runs out, so a killed agent
restarted at once by its supervisor would be refused for a whole lease. On Linux the journal can
know more: each holder records where it lives (the boot id, which differs per host and per boot,
and its PID namespace) and which process it is (its PID and that process's start time, since a
PID is reused). A holder recorded on this boot and namespace whose process is gone, a zombie, or
a later process under the same PID, is dead: nobody can write with its fence any more, so the
run is taken over at once. Anything else (another host or container, no `/proc` here, a holder
written by a release that recorded no proof) is waited for, up to its lease, which is what the
lease was always for.

The takeover itself stays a compare-and-set in the journal: `acquire(..., dead=fence)` takes the
run only while `fence` still holds it, so two restarted copies that both found the holder dead
race in the journal and one wins; the loser finds a live holder and waits for it.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import anyio

from .errors import RunBusy
from .journal import Journal

logger = logging.getLogger("orchestrator.run")

PROC = Path("/proc")
#: What a holder's proof says about it, read from here.
Verdict = Literal["dead", "alive", "elsewhere", "unknown"]
#: Polling a held run: the first pause and the longest (a holder that lets go is noticed
#: within it). Each poll is one journal call, cheap next to what a run does.
FIRST_POLL = 0.02
LONGEST_POLL = 0.25


@dataclass(frozen=True)
class Proof:
    """What proves a holder alive on its host: the boot id, the PID namespace (as
    `readlink /proc/self/ns/pid` names it), the PID and the start time of that process (clock
    ticks after boot, field 22 of `/proc/PID/stat`)."""

    boot: str
    namespace: str
    pid: int
    started: int

    def encode(self) -> str:
        return f"{self.boot} {self.namespace} {self.pid} {self.started}"

    @classmethod
    def decode(cls, text: str | None) -> Proof | None:
        """The proof a journal stored, or None for none or one this release cannot read."""
        if not text:
            return None
        parts = text.split(" ")
        if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
            return None
        return cls(parts[0], parts[1], int(parts[2]), int(parts[3]))


def _stat(pid: int, proc: Path) -> tuple[str, int] | None:
    """(state, start time) of process `pid` from `/proc/PID/stat`; None if there is none.
    The command name (field 2) may hold spaces and parentheses, so fields are counted after
    its closing one."""
    try:
        raw = (proc / str(pid) / "stat").read_text()
    except FileNotFoundError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])  # fields 3 and 22


def this_process(proc: Path = PROC) -> Proof | None:
    """The proof of this process, or None where it cannot be read (no `/proc`: another OS)."""
    try:
        boot = (proc / "sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink(proc / "self/ns/pid")
        pid = os.getpid()
        stat = _stat(pid, proc)
    except (OSError, ValueError, IndexError):
        return None
    if not boot or stat is None:
        return None
    return Proof(boot, namespace, pid, stat[1])


def verdict(recorded: str | None, proc: Path = PROC) -> Verdict:
    """Whether the holder `recorded` names is dead, alive, elsewhere (another host, boot or
    namespace: not for this process to judge) or unknown (no proof, or none readable here).

    "Gone" is asked of the kernel as well as of `/proc`: with `hidepid`, another user's process
    is missing from `/proc` but `kill(pid, 0)` still says it exists, and it is then unknown,
    never dead."""
    theirs = Proof.decode(recorded)
    mine = this_process(proc)
    if theirs is None or mine is None:
        return "unknown"
    if (theirs.boot, theirs.namespace) != (mine.boot, mine.namespace):
        return "elsewhere"
    try:
        stat = _stat(theirs.pid, proc)
    except (OSError, ValueError, IndexError):
        return "unknown"
    if stat is None:
        try:
            os.kill(theirs.pid, 0)
        except ProcessLookupError:
            return "dead"
        except OSError:
            return "unknown"
        return "unknown"  # it exists, hidden from this /proc
    state, started = stat
    if started != theirs.started or state in ("Z", "X"):
        return "dead"  # another process under its PID, or it died and is not reaped yet
    return "alive"


_SAYS: dict[Verdict, str] = {
    "alive": "alive on this host",
    "elsewhere": "on another host or PID namespace",
    "unknown": "whose liveness cannot be read here",
    "dead": "dead",
}


def check_wait(wait: object) -> float:
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not wait >= 0:
        raise ValueError(f"wait must be a non-negative number of seconds, not {wait!r}")
    if not math.isfinite(wait):
        raise ValueError(f"wait must be finite, not {wait!r}")
    return float(wait)


async def enter(
    journal: Journal,
    run_id: str,
    holder: str,
    lease: float,
    *,
    wait: float,
    alive: Proof | None,
    proc: Path = PROC,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Acquire `run_id` for `holder`, its fence: at once if it is free, expired or held by a
    holder proven dead here; else after waiting, up to `wait` seconds, for the holder to let
    go or its lease to run out. `RunBusy` (with the holder's details) past the wait.

    Each journal call is shielded (a fence handed out must reach us, or the run stays held by
    a fence nobody knows); the pauses between them are not, so the wait can be cancelled."""
    deadline = clock() + wait
    pause = FIRST_POLL
    told: int | None = None
    dead: int | None = None
    while True:
        try:
            with anyio.CancelScope(shield=True):
                return await journal.acquire(
                    run_id, holder, lease, alive=alive.encode() if alive else None, dead=dead
                )
        except RunBusy as busy:
            found = verdict(busy.alive, proc)
            if found == "dead" and busy.fence is not None and busy.fence != dead:
                logger.info(
                    "run %r: its holder %r (fence %d) died on this host; taking the run over",
                    run_id,
                    busy.holder,
                    busy.fence,
                )
                dead = busy.fence
                continue
            left = deadline - clock()
            if left <= 0:
                raise RunBusy(
                    run_id,
                    f"{busy} ({_SAYS[found]}); waited {wait:.1f}s for it",
                    holder=busy.holder,
                    fence=busy.fence,
                    alive=busy.alive,
                    left=busy.left,
                ) from None
            if told != busy.fence:
                told = busy.fence
                logger.warning(
                    "run %r is held by %r (fence %s, %s) for %s more; waiting up to %.1fs for"
                    " it to let go or for its lease to run out",
                    run_id,
                    busy.holder,
                    busy.fence,
                    _SAYS[found],
                    "?" if busy.left is None else f"{busy.left:.1f}s",
                    left,
                )
            # Wake at the lease's end if it comes first, so an expired holder is taken over on
            # time; polls in between notice a holder that lets go (or dies) sooner.
            until_expiry = busy.left if busy.left is not None else pause
            await anyio.sleep(max(0.0, min(pause, until_expiry + 0.001, left)))
            pause = min(pause * 2, LONGEST_POLL)
