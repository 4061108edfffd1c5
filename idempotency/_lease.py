"""Keeping a claim alive while the tool runs (rule 4), and stopping the tool when it is lost.

The lease is renewed every `lease / 3`. A renewal that finds the token gone (another worker took
the record over, or it turned UNKNOWN) cancels the run: a stale worker must stop acting. A store
that cannot be reached is retried until the last proven lease runs out, then the run is cancelled
too, because from that instant another worker may legitimately take over.
"""

from __future__ import annotations

import anyio

from ._store import KeyStore
from ._telemetry import Trace, logger, record_name


class LeaseKeeper:
    def __init__(
        self,
        store: KeyStore,
        store_key: str,
        token: str,
        *,
        lease: float,
        held_until: float,
        run_scope: anyio.CancelScope,
        trace: Trace,
    ) -> None:
        self._store = store
        self._key = store_key
        self._token = token
        self._lease = lease
        #: Event-loop time until which the claim is proven ours (measured from before the
        #: request that last extended it, so it never overestimates).
        self._held_until = held_until
        self._run_scope = run_scope
        self._trace = trace
        #: True once the claim could no longer be proven and the run was cancelled.
        self.lost = False

    async def run(self) -> None:
        """Renew until cancelled by the owner; never raises."""
        interval = self._lease / 3
        while True:
            await anyio.sleep(interval)
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
            if renewed:
                self._held_until = started + self._lease
                continue
            if renewed is False or anyio.current_time() >= self._held_until:
                self.lost = True
                logger.warning(
                    "lost the lease of record %s; cancelling the running tool",
                    record_name(self._key),
                )
                self._run_scope.cancel()
                return
