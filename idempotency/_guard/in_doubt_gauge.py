"""The gauge `mcp_once_records_in_doubt`: how many records of the key store are in doubt
(UNKNOWN, or IN_PROGRESS under a lease that ran out: `in_doubt_records`), for the alert that a
charge may have happened and nobody knows (rule 25: such records never expire, so the gauge
stays up until each is settled or reconciled).

Counted from the store, not from what one process saw: a record turned UNKNOWN by one replica,
orphaned by a replica that was killed, or settled by an operator changes every replica's count
alike. So every replica reports the same store-wide number: aggregate it across replicas with
max, never sum. An up-down counter per process could not be right: the worker whose holder died
cannot count its own death, and the operator's `keys settle` runs in no server at all.

Counting reads the store, so it happens on a background task of the event loop of the guard's
first protected call (a system task, `_system_task.py`), and only when a metrics collection
asked for the value since the last count, at most once per `CENSUS_INTERVAL`: no meter provider
or no collection, no reads; a collection reports the count the previous one asked for (the
observable callback runs in the exporter's thread and cannot wait for the store). A store that
cannot be read reports nothing until it can, rather than a stale number. The count stops at
`CENSUS_CAP`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import anyio
from opentelemetry.metrics import CallbackOptions, Observation

from .._stores.in_doubt import in_doubt_records
from .._stores.store import KeyStore
from .._system_task import current_loop, loop_alive, loop_time, spawn
from .telemetry import _meter, _metrics_on, logger

#: Seconds between two counts at least, however often collections ask.
CENSUS_INTERVAL = 10.0
#: The count stops here: a listing of more in-doubt records than this is an operator's job.
CENSUS_CAP = 100_000


class _Census:
    """One store's count, kept by a system task of one event loop."""

    def __init__(self, store: KeyStore) -> None:
        self.store = store
        self.loop = current_loop()
        self.value: int | None = None
        self._asked = anyio.Event()

    def ask(self) -> None:
        """From any thread (the exporter's, or the loop's own): count again, when due."""
        loop = self.loop
        try:
            if isinstance(loop, asyncio.AbstractEventLoop):
                loop.call_soon_threadsafe(self._wake)
            else:
                loop.run_sync_soon(self._wake)  # type: ignore[attr-defined]
        except RuntimeError:  # the loop is gone (asyncio closed, trio finished)
            self.value = None

    def _wake(self) -> None:
        """On the loop: the event the task waits on now (it replaces it on the loop too)."""
        self._asked.set()

    async def run(self) -> None:
        while True:
            counted_at = loop_time()
            try:
                found = await in_doubt_records(self.store, limit=CENSUS_CAP, now=None)
            except Exception as exc:
                self.value = None
                logger.debug("could not count the records in doubt: %r", exc)
            else:
                self.value = len(found)
            await self._asked.wait()
            self._asked = anyio.Event()
            await anyio.sleep_until(counted_at + CENSUS_INTERVAL)


#: The census of each store (by identity: any `KeyStore` will do) a guard of this process
#: protected calls with, while its event loop lives.
_censuses: dict[int, _Census] = {}


def watch(store: KeyStore) -> None:
    """Count `store`'s in-doubt records for the gauge from now on (on the running event loop,
    unless a live one counts them already), if a meter provider is set. Called by the guard per
    protected call: a dictionary look-up once the census runs."""
    if not _metrics_on():
        return
    census = _censuses.get(id(store))
    if census is not None and loop_alive(census.loop):
        return
    census = _censuses[id(store)] = _Census(store)
    spawn(census.run, name="mcp-once in-doubt census")


def _observe(options: CallbackOptions) -> Iterable[Observation]:
    del options
    counts = []
    for key, census in list(_censuses.items()):
        census.ask()
        if census.value is not None:
            counts.append(census.value)
        elif not loop_alive(census.loop):
            del _censuses[key]  # its loop ended: the store is no longer watched from here
    if counts:
        yield Observation(sum(counts))


_gauge = _meter.create_observable_gauge(
    "mcp_once_records_in_doubt",
    callbacks=[_observe],
    unit="{record}",
    description="Records in doubt in the key store (UNKNOWN, or IN_PROGRESS under a lease that"
    " ran out), as last counted; the same store-wide number from every replica",
)
