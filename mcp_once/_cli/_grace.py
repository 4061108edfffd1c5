"""The rule that keeps `keys settle --failed` from letting a paused worker charge a second time.

Settling an UNKNOWN record as failed lets the next call run the tool again, which is right only
if the worker that held the record's last lease is dead. A worker that is merely paused (SIGSTOP,
a long GC pause, a frozen VM) resumes in the middle of its tool and first finishes the step it
was in — the charge — because cancellation reaches a tool only at its next `await`. If the next
call has run the tool meanwhile, the effect happened twice; the fence kept the *record* right,
not the world.

The rule: `--failed` is refused, unless `--force`, while the record's last lease ran out less
than `--grace` seconds ago (default 90 s: three default leases), unless its holder itself saw the
execution end and said so (`ended_by_its_holder`: the proxy whose stdio upstream exited mid-call
turned the record UNKNOWN at once, an `interrupted` event with `ended=yes`): that holder is alive,
and nothing of the execution can still be running. Measured from the lease deadline
the store recorded (its own clock) to now on this machine's clock. Within that time a paused
worker that wakes up still renews or completes, and its effect shows at the provider the
operator is about to check. The grace narrows the window, it does not close it: a worker paused
for longer can still act once when it resumes. `--force` is for an operator who knows the worker
is gone (its process exited); a tool that fences its downstream write with `current_claim()`
closes the window for good.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from idempotency import (
    DEFAULT_LEASE,
    AuditedStore,
    KeyStore,
    Record,
    RecordState,
    history_interruption,
    rfc3339,
)
from idempotency import lease_ran_out as _ran_out

#: Three leases of the server's default length: a worker that resumes at all usually does so
#: within a lease or two, and its renewal or completion attempt is then visible in the logs.
DEFAULT_GRACE = 3 * DEFAULT_LEASE

#: This machine's clock (seconds since the epoch). Tests move it instead of sleeping.
clock: Callable[[], float] = time.time


def add_arguments(settle: argparse.ArgumentParser) -> None:
    settle.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE,
        metavar="SECONDS",
        help="refuse --failed while the record's last lease ran out less than this long ago"
        " (default: %(default)g s, three default leases)",
    )
    settle.add_argument(
        "--force",
        action="store_true",
        help="settle --failed within the grace period: you know the worker is gone (not needed"
        " where its holder said the execution ended: an mcp-once proxy whose child exited); or"
        " replace an operator's earlier settle of the record (never a result the tool stored)",
    )


def lease_ran_out(record: Record, now: float | None = None) -> bool:
    """Whether `record` is IN_PROGRESS under a lease that ran out: its worker died or hung.

    The store keeps it IN_PROGRESS until the next claim turns it UNKNOWN (or takes it over); for
    an operator it is unknown already, and `keys` shows and settles it as such, so that a dead
    worker's record does not wait for a client to come back."""
    return _ran_out(record, clock() if now is None else now)


def too_soon_to_fail(record: Record | None, grace: float) -> str | None:
    """Why `record` must not be settled as failed yet, or None when nothing speaks against it
    (records that are neither UNKNOWN nor under a lease that ran out are left to the store,
    which refuses them itself)."""
    if record is None or not (record.state is RecordState.UNKNOWN or lease_ran_out(record)):
        return None
    ran_out = record.lease_deadline if record.lease_deadline is not None else record.updated_at
    age = clock() - ran_out
    if age >= grace:
        return None
    when = "has not run out yet" if age < 0 else f"ran out only {age:.1f} s ago"
    return (
        f"refusing to settle {record.key} as failed: its last lease (fence {record.fence}) {when}"
        f" ({rfc3339(ran_out)}). The worker that held it may be paused rather than dead; if it"
        " resumes after the next call ran the tool again, it finishes the step it was in and the"
        f" effect happens twice. Check again from {rfc3339(ran_out + grace)} (--grace"
        f" {grace:g} s), or pass --force once you know that worker is gone. Nothing was changed."
    )


async def ended_by_its_holder(store: KeyStore, record: Record | None) -> str | None:
    """What the holder of `record`'s last execution said when it gave it up, where it saw that
    execution end (its `interrupted` event, `ended=yes`, at the record's fence): the grace
    protects against a paused holder, and this one was alive to say so. None otherwise (no such
    event, a history that cannot be read, a store that keeps none)."""
    if record is None or record.state is not RecordState.UNKNOWN:
        return None
    if not isinstance(store, AuditedStore):
        return None
    try:
        event = history_interruption(await store.history(record.key))
    except ValueError:
        return None
    if event is None or event.fence != record.fence or event.details.get("ended") != "yes":
        return None
    return event.details.get("why") or "its holder saw the execution end"
