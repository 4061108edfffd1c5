"""Keeping a claim alive while the tool runs (rule 4) and until its result is stored (rule 11),
and stopping the tool when the claim is lost.

The lease is renewed every `lease / 3`. A renewal that finds the token gone (another worker took
the record over, or it turned UNKNOWN) cancels the run: a stale worker must stop acting. A store
that cannot be reached is retried until the last proven lease runs out (a failed renewal is
retried no later than that instant), then the run is cancelled too, because from that instant
another worker may legitimately take over. Once the tool has returned, the claim is still renewed
while the guard stores the result (`complete.py`): a store outage shorter than the lease must not
turn a finished result into an UNKNOWN record.

The same service ends a run that exceeds `max_run_time`: it wakes at the run's deadline as it
wakes for a renewal, and cancels the run as a lost lease does, so a run needs no timer of its own.
Once the tool has returned, it bounds the write of its result the same way (`store_until`: the
give-up time of `complete.py`), so the first write, made inside the run's own shielded scope,
needs no scope and no timer either: a call that stores at once never schedules one.

Almost every tool finishes long before its first renewal, so a renewer task per call (started
and cancelled around every run) would be pure overhead. Instead each event loop has one
`_Renewals` service: a run registers its claim (a set insert) and unregisters it when it ends;
one background task sleeps until the earliest due renewal and renews the claims that are due,
each in its own child task so that one slow store call does not delay the others. The service is
a system task (not a child of any request), so it never holds up a request's task group. It
lingers while claims keep coming: it exits at a wake-up that finds no claim registered and none
added since the previous wake-up (so between one and two renewal intervals, `lease / 3`, after
the last run ended), rather than being started again for every call that outlives the service's
last nap. It is cancelled with any other task when the event loop shuts down.
"""

from __future__ import annotations

import logging
import math

import anyio

from .._stores.store import KeyStore
from .._system_task import current_loop, loop_time, spawn
from .telemetry import Trace, log_about, logger, record_name


class LeaseKeeper:
    """One running claim as the renewal service sees it (`keep_lease`); `end()` when settled."""

    __slots__ = (
        "_ended",
        "_held_until",
        "_inflight",
        "_key",
        "_lease",
        "_run_scope",
        "_running",
        "_server",
        "_service",
        "_store",
        "_token",
        "_tool",
        "_trace",
        "due",
        "lost",
        "renewing",
        "stop_at",
        "storing_since",
    )

    def __init__(
        self,
        service: _Renewals,
        store: KeyStore,
        store_key: str,
        token: str,
        *,
        lease: float,
        held_until: float,
        max_run_time: float | None,
        run_scope: anyio.CancelScope,
        trace: Trace,
        tool: str = "",
        server: str = "",
    ) -> None:
        self._service = service
        #: What the log lines about the record name besides it.
        self._tool = tool
        self._server = server
        self._store = store
        self._key = store_key
        self._token = token
        self._lease = lease
        #: Event-loop time until which the claim is proven ours (measured from before the
        #: request that last extended it, so it never overestimates).
        self._held_until = held_until
        self._run_scope = run_scope
        self._trace = trace
        self._running = True
        now = loop_time()
        #: Event-loop time of the next renewal (each one `lease / 3` after the last ended).
        self.due = now + lease / 3
        #: Event-loop time at which the run is cancelled: the tool's (`max_run_time`) while it
        #: runs, then the result's write (`store_until`); infinite when neither applies.
        self.stop_at = math.inf if max_run_time is None else now + max_run_time
        #: True while a renewal of this claim is in flight.
        self.renewing = False
        #: The in-flight renewal, cancelled when the run ends (its answer no longer matters).
        self._inflight: anyio.CancelScope | None = None
        self._ended = False
        #: True once the claim could no longer be proven (the run, if still going, is cancelled).
        self.lost = False
        #: Event-loop time the result's write began (`store_until`).
        self.storing_since = math.inf

    @property
    def held_until(self) -> float:
        """Event-loop time until which the claim is proven ours."""
        return self._held_until

    @property
    def wake_at(self) -> float:
        """When the service must next look at this claim: its renewal, or its run's deadline."""
        return self.stop_at if self.stop_at < self.due else self.due

    def tool_returned(self) -> None:
        """The tool is over; the claim is now kept only while its result is stored, so a loss
        has nothing left to cancel (the write learns of it from the store), and `max_run_time`
        no longer applies."""
        self._running = False
        self.stop_at = math.inf

    def store_until(self, started: float, give_up_at: float) -> None:
        """The result is being written inside the run's scope since `started`: cancel that scope
        at `give_up_at` (event-loop times) should the write still be going then."""
        self.storing_since = started
        self.stop_at = give_up_at
        self._service.wake_by(give_up_at)

    def overran(self) -> None:
        """Called by the service at `stop_at`: cancel the tool if it still runs, or the write of
        its result if that is what `stop_at` bounds (once)."""
        self.stop_at = math.inf
        if not self._ended:
            self._run_scope.cancel()

    def end(self) -> None:
        """Stop renewing: the claim is settled (stored, released, given up) or lost. Idempotent."""
        if self._ended:
            return
        self._ended = True
        self.stop_at = math.inf
        self._service.discard(self)
        if self._inflight is not None:
            self._inflight.cancel()

    async def renew(self) -> bool:
        """One renewal; False once the claim is lost (the run is cancelled) or the run ended.
        Never raises an `Exception`."""
        if self._ended:
            return False
        with anyio.CancelScope() as self._inflight:
            started = anyio.current_time()
            renewed: bool | None = None
            with anyio.move_on_after(max(0.0, self._held_until - started)):
                try:
                    renewed = await self._store.renew(self._key, self._token, lease=self._lease)
                except Exception as exc:  # a backend failure: retry until the lease runs out
                    self._trace.store_error("renew", exc)
                    logger.warning(
                        "could not renew the lease of record %s: %r", record_name(self._key), exc
                    )
        self._inflight = None
        if self._ended:
            return False  # the run is over: a late answer says nothing about it
        now = anyio.current_time()
        if renewed:
            self._held_until = started + self._lease
        elif renewed is False or now >= self._held_until:
            self.lost = True
            log_about(
                logging.WARNING,
                "lease_ran_out",
                self._key,
                self._tool,
                self._server,
                "lost its lease (another attempt took it over, or it turned UNKNOWN) %s",
                "while the tool ran: cancelling it"
                if self._running
                else "while storing its result",
            )
            self.due = math.inf  # never renewed again; a write in flight stays bounded
            if self._running:
                self._run_scope.cancel()
            return False
        self.due = now + self._lease / 3
        if not renewed:
            # Not proven, not refused: try again before the proof runs out, so that the loss is
            # noticed when it happens rather than up to `lease / 3` later.
            self.due = min(self.due, self._held_until)
        return True


class _Renewals:
    """The claims running on one event loop, and the one task that renews them."""

    def __init__(self, loop: object) -> None:
        self._loop = loop
        self._claims: set[LeaseKeeper] = set()
        #: When the service task wakes up next; lowered (and the task woken) by an earlier claim.
        self._wake_at = math.inf
        self._nap: anyio.CancelScope | None = None
        #: A claim was added since the last wake-up: an idle service naps once more.
        self._joined = False
        #: How long an idle service naps before it looks again: the latest claim's `lease / 3`.
        self._idle_nap = 0.0
        self.stopped = anyio.Event()
        self._task: object = None

    @property
    def claims(self) -> int:
        return len(self._claims)

    def add(self, claim: LeaseKeeper, interval: float) -> None:
        self._claims.add(claim)
        self._joined = True
        self._idle_nap = interval
        self.wake_by(claim.wake_at)

    def discard(self, claim: LeaseKeeper) -> None:
        # No wake-up: the service notices at its next one, so back-to-back calls reuse it.
        self._claims.discard(claim)

    def wake_by(self, when: float) -> None:
        """Wake up no later than `when` (event-loop time)."""
        if when < self._wake_at:
            self._wake_at = when
            if self._nap is not None:
                self._nap.deadline = when

    async def serve(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                while True:
                    joined, self._joined = self._joined, False
                    now = anyio.current_time()
                    if not self._claims:
                        if not joined:
                            # A whole nap without a claim: stop. A claim added from here on
                            # starts a new service, not this one, which may still wait below
                            # for renewals of claims already ended.
                            self._retire()
                            break
                        self._wake_at = now + self._idle_nap
                    else:
                        due = [c for c in self._claims if not c.renewing and c.due <= now]
                        for claim in due:
                            claim.renewing = True
                        for claim in self._claims:
                            if claim.stop_at <= now:
                                claim.overran()
                        waiting = (c.wake_at for c in self._claims if not c.renewing)
                        # Nothing to wait for (every claim renewing, or lost and not yet
                        # ended): look again after an idle nap, so the service can retire.
                        self._wake_at = min(waiting, default=now + self._idle_nap)
                        for claim in due:  # after the bookkeeping: a renewal may finish eagerly
                            tg.start_soon(self._renew, claim)
                    with anyio.CancelScope(deadline=self._wake_at) as self._nap:
                        await anyio.sleep_forever()
                    self._nap = None
        finally:
            self._retire()
            self.stopped.set()

    def _retire(self) -> None:
        """From now on a new claim on this event loop starts a new service."""
        if _services.get(self._loop) is self:
            del _services[self._loop]

    async def _renew(self, claim: LeaseKeeper) -> None:
        keep = await claim.renew()
        claim.renewing = False
        if keep or claim.stop_at < math.inf:
            # Renewed, or lost while its result's write is bounded here: still watched.
            self.wake_by(claim.wake_at)
        else:
            self._claims.discard(claim)


#: The running service of each event loop (an asyncio loop or a trio run's token).
_services: dict[object, _Renewals] = {}


def _start(loop: object) -> _Renewals:
    """Start the renewal service of `loop` (which has none running)."""
    service = _services[loop] = _Renewals(loop)
    service._task = spawn(service.serve, name="mcp-once lease renewals")
    return service


def keep_lease(
    store: KeyStore,
    store_key: str,
    token: str,
    *,
    lease: float,
    held_until: float,
    max_run_time: float | None,
    run_scope: anyio.CancelScope,
    trace: Trace,
    tool: str = "",
    server: str = "",
) -> LeaseKeeper:
    """Renew the claim until `end()` is called on the answer; cancel `run_scope` if the claim is
    lost, or if the tool still runs `max_run_time` from now. The caller must `end()` it."""
    loop = current_loop()
    service = _services.get(loop)
    if service is None:
        service = _start(loop)
    claim = LeaseKeeper(
        service,
        store,
        store_key,
        token,
        lease=lease,
        held_until=held_until,
        max_run_time=max_run_time,
        run_scope=run_scope,
        trace=trace,
        tool=tool,
        server=server,
    )
    service.add(claim, lease / 3)
    return claim


def _renewal_service() -> _Renewals | None:
    """The current event loop's renewal service, if one is running (a probe for tests)."""
    return _services.get(current_loop())
