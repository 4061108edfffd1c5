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

import anyio
from mcp_types import CallToolResult

from .._stores.store import KeyStore, LimitExceeded
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
) -> bool | None:
    """Store `result` under the claim `token`: True stored, False the claim was no longer ours
    (the guard then serves the answer of the attempt that has it), None given up (logged).

    Shielded from cancellation: a client giving up must not cost the record its result (rule 10).
    `keeper` renews the claim meanwhile; it is read only to say, on giving up, whether the lease
    had run out.
    """
    data = encode_result(result, executed_at)
    if len(data) > max_bytes:
        data = _too_large(store_key, len(data), max_bytes, executed_at, trace)
    started = anyio.current_time()
    give_up_at = started + WITHIN_LEASES * lease
    pause = BACKOFF
    tries = 0
    why = ""
    # One shielded scope whose deadline is the give-up time: it bounds every write and every pause.
    with anyio.CancelScope(shield=True, deadline=give_up_at):
        while True:
            if tries and anyio.current_time() >= give_up_at:
                break  # no try after the deadline, even against a store that never yields
            tries += 1
            try:
                return await store.complete(store_key, token, data, retention=retention)
            except LimitExceeded as exc:
                if exc.what != "result" or len(data) <= exc.limit // 2:
                    why = "even a placeholder for it is over the store's size limit"
                    break
                data = _too_large(store_key, len(data), exc.limit, executed_at, trace)
                continue
            except Exception as exc:
                trace.store_error("complete", exc)
                logger.warning(
                    "could not store the result of record %s (try %d): %r",
                    record_name(store_key),
                    tries,
                    exc,
                )
            await anyio.sleep(pause)
            pause = min(pause * 2, BACKOFF_CAP, lease / 6)
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
    return None


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
