"""Storing a finished result (rule 11): the write that turns a claim into a replayable record.

A finished result is the most valuable thing the guard holds: the effect has happened, and giving
the result up turns a record whose worker is alive into UNKNOWN (the next retry gets -32012 and
needs an operator; a naturally idempotent tool runs a second time). So the claim's lease goes on
being renewed (`LeaseKeeper`) and the write is retried, with backoff, until it is stored, the
claim is found gone (the write answers that the token no longer holds the record: another attempt
took it over or turned it UNKNOWN), or two leases have passed since the tool returned.

Not until the lease can no longer be proven: while the store is unreachable nobody can claim the
record either, and once it is back the write still lands if no retry has claimed the key first
(the token check settles that race, as it does when only this worker lost the store). So an
outage shorter than the time left on the lease loses nothing, and a longer one loses the result
only to a retry that gets in before the write. Only at the bound is the result given up: the log
says so, and the caller is told (`stored: false`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
from mcp_types import CallToolResult

from .._stores.history import saying
from .._stores.store import KeyStore, LimitExceeded
from .._system_task import loop_time
from .lease import LeaseKeeper
from .replay import encode_result, too_large_placeholder
from .telemetry import Trace, logger, record_name

#: First pause between tries; it doubles after each failure.
BACKOFF = 0.05
#: The longest pause between tries, also capped at `lease / 6`: a store that is back is found
#: soon, before the lease it still has runs out and before a retry can claim the key.
BACKOFF_CAP = 1.0
#: However well renewals go, storing a result is given up this many leases after the tool
#: returned (60 s by default): a store that renews but cannot take the write must not keep the
#: key busy, and its duplicates waiting, for ever.
WITHIN_LEASES = 2


async def store_result(
    store: KeyStore,
    store_key: str,
    token: str,
    result: CallToolResult,
    *,
    executed_at: float,
    retention: float,
    max_bytes: int,
    lease: float,
    keeper: LeaseKeeper,
    trace: Trace,
    in_run_scope: bool = False,
    delivered: bool | None = None,
    upstream_replayed: bool = False,
) -> bool | None:
    """Store `result` under the claim `token`: True stored, False the claim was no longer ours
    (the guard then serves the answer of the attempt that has it), None given up (logged).

    Shielded from cancellation: a client giving up must not cost the record its result (rule 10).
    `keeper` renews the claim meanwhile, and says, on giving up, whether the lease had run out.

    `in_run_scope`: called inside the run's own shielded scope, which nothing cancels once the
    tool has returned but the renewal service at the give-up time (`LeaseKeeper.store_until`).
    The first write then needs no scope of its own and schedules no timer: a store that takes
    the result at once costs nothing more. If the service cuts that write off, the scope's
    cancellation propagates and the caller reports the give-up (`gave_up`). Retries, on a
    failed first write, are bounded by a shielded scope of their own, as when not in the run's.

    `delivered` (a derived key's record only, rule 15): whether the caller is still there for
    the answer; None leaves the store's `complete` called as every store takes it.
    `upstream_replayed`: the result is the replay of the server the tool called (kept with it).
    """
    data = encode_result(result, executed_at, upstream_replayed=upstream_replayed)
    if len(data) > max_bytes:
        data = _too_large(store_key, len(data), max_bytes, executed_at, trace)
    started = loop_time()
    give_up_at = started + WITHIN_LEASES * lease
    failed: Exception | None = None
    tries = 0
    if in_run_scope:
        keeper.store_until(started, give_up_at)
        tries = 1
        try:
            return await _complete(
                store, store_key, token, data, retention, delivered, upstream_replayed
            )
        except Exception as exc:  # judged below, as every failed try is
            failed = exc
    pause = BACKOFF
    why = ""
    # One shielded scope whose deadline is the give-up time: it bounds every write and every pause.
    with anyio.CancelScope(shield=True, deadline=give_up_at):
        while True:
            if isinstance(failed, LimitExceeded):
                if failed.what != "result" or len(data) <= failed.limit // 2:
                    why = "even a placeholder for it is over the store's size limit"
                    break
                data = _too_large(store_key, len(data), failed.limit, executed_at, trace)
            elif failed is not None:
                trace.store_error("complete", failed)
                logger.warning(
                    "could not store the result of record %s (try %d): %r",
                    record_name(store_key),
                    tries,
                    failed,
                )
                await anyio.sleep(pause)
                pause = min(pause * 2, BACKOFF_CAP, lease / 6)
            if tries and anyio.current_time() >= give_up_at:
                break  # no try after the deadline, even against a store that never yields
            tries += 1
            try:
                return await _complete(
                    store, store_key, token, data, retention, delivered, upstream_replayed
                )
            except Exception as exc:  # judged at the top of the loop
                failed = exc
    gave_up(store_key, tries, started, keeper, trace, why)
    return None


def _complete(
    store: KeyStore,
    store_key: str,
    token: str,
    data: bytes,
    retention: float,
    delivered: bool | None,
    upstream_replayed: bool,
) -> Awaitable[bool]:
    if upstream_replayed:
        args = (store, store_key, token, data, retention, delivered, False)
        return _said_upstream(lambda: _complete(*args))
    if delivered is None:
        return store.complete(store_key, token, data, retention=retention)
    return store.complete(store_key, token, data, retention=retention, delivered=delivered)


async def _said_upstream(complete: Callable[[], Awaitable[bool]]) -> bool:
    """`complete()` of the upstream's replay: its completed event says so (rule 20)."""
    with saying(upstream="replayed"):
        return await complete()


def gave_up(
    store_key: str, tries: int, started: float, keeper: LeaseKeeper, trace: Trace, why: str = ""
) -> None:
    """Log (and mark on the span) that storing the result of record `store_key` was given up,
    after `tries` writes since `started` (event-loop time); `why`, unless the deadline passed."""
    if not why:  # the deadline passed
        why = f"the store did not take it within {WITHIN_LEASES} leases"
        if keeper.lost or anyio.current_time() >= keeper.held_until:
            why += " (the claim's lease ran out meanwhile: another worker may take over)"
    trace.set(result_stored=False)
    logger.error(
        "gave up storing the result of record %s after %d tries over %.2f s: %s. The caller got"
        " the result (marked stored: false); the record stays IN_PROGRESS until its lease expires,"
        " then turns UNKNOWN, or is taken over if the tool may run twice",
        record_name(store_key),
        tries,
        anyio.current_time() - started,
        why,
    )


def _too_large(store_key: str, size: int, limit: int, executed_at: float, trace: Trace) -> bytes:
    """What is kept instead of a result over the size limit: replays learn the tool ran."""
    logger.warning(
        "the result of record %s is %d bytes, over the %d kept; replays get an explanation",
        record_name(store_key),
        size,
        limit,
    )
    trace.set(result_too_large=True)
    return encode_result(too_large_placeholder(size, limit), executed_at)
