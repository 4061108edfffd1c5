"""Replicas of the workload server behind one client-side balancer, sharing one key store.

What operators run: several streamable-HTTP replicas on one Redis. `Replicas` is an `Endpoint`
whose transports reach whichever replica is in service, round-robin per request (the 2026-07-28
era is stateless, so any replica can answer any request). A replica can be frozen (SIGSTOP) and
taken out of rotation at the same instant, as a health check would notice, and thawed later: the
paused-worker fault, with requests already on it hanging until the client gives up on them.
A replica can also be killed for good (SIGKILL, never restarted): the crashed-worker fault.

The balancer notes which replica saw which idempotency key. A record that ends UNKNOWN although
its key never reached a frozen or killed replica was lost by a worker that stayed alive — the
failure rule 11 forbids — and a checker can now tell it apart from the legitimate kind.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio.to_thread
import httpx2

from idempotency import CallScope, RecordState, default_scope, open_store, store_key, wire
from mcp_once.scenarios._endpoints import Endpoint, Era, ServerProcess, server_command
from mcp_once.scenarios._ledger import Ledger
from mcp_once.scenarios._shop import UNGUARDED_TOOLS
from mcp_once.scenarios._workload import RunResult
from orchestrator import streamable_http_transport

if TYPE_CHECKING:
    from mcp.client._transport import Transport

__all__ = ["Replicas", "Strays", "open_replicas", "strays"]


def _key_of(request: httpx2.Request) -> str | None:
    """The idempotency key a tools/call request carries, if any."""
    with contextlib.suppress(httpx2.RequestNotRead, ValueError):
        message = json.loads(request.content)
        if isinstance(message, dict) and message.get("method") == "tools/call":
            meta = (message.get("params") or {}).get("_meta") or {}
            key = meta.get(wire.KEY_META)
            return key if isinstance(key, str) else None
    return None


class _Balancer(httpx2.AsyncBaseTransport):
    """One connection's way to the replicas: each request to the next one in service."""

    def __init__(self, replicas: Replicas) -> None:
        self._replicas = replicas
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        index = await self._replicas.pick()
        key = _key_of(request)
        if key is not None:
            self._replicas.keys_seen[index].add(key)
        request.url = request.url.copy_with(port=self._replicas.processes[index].port)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class Replicas(Endpoint):
    """Streamable-HTTP replicas of one logical server, reached through a balancer."""

    transport = "http"

    def __init__(self, processes: Sequence[ServerProcess], era: Era = "modern") -> None:
        super().__init__(era)
        self.processes = list(processes)
        #: Which replicas the balancer sends requests to.
        self.in_service = [True] * len(self.processes)
        #: The idempotency keys each replica was sent (tools/call requests), by replica index.
        self.keys_seen: list[set[str]] = [set() for _ in self.processes]
        #: Replicas that were frozen or killed at some point of the run, by index.
        self.struck: set[int] = set()
        self._turn = 0

    def make(self) -> Transport:
        return streamable_http_transport(self.processes[0].url, inner=_Balancer(self))

    async def pick(self) -> int:
        """The next replica in service (waiting for one to be up)."""
        serving = [i for i, on in enumerate(self.in_service) if on]
        if not serving:
            raise RuntimeError("no replica is in service")
        self._turn += 1
        index = serving[self._turn % len(serving)]
        await self.processes[index].wait_up()
        return index

    async def ready(self) -> None:
        """Every replica in service is up (a killed one is not waited for)."""
        for index, process in enumerate(self.processes):
            if self.in_service[index]:
                await process.wait_up()

    async def freeze(self, index: int) -> None:
        """SIGSTOP replica `index` and take it out of rotation: requests on it hang."""
        self.in_service[index] = False
        self.struck.add(index)
        self.processes[index].pause()

    async def thaw(self, index: int) -> None:
        """SIGCONT replica `index` and put it back into rotation."""
        self.processes[index].resume()
        self.in_service[index] = True

    async def kill(self, index: int) -> None:
        """SIGKILL replica `index` for good (a crashed worker nobody restarts): out of rotation,
        and whatever it was running is lost mid-way."""
        self.in_service[index] = False
        self.struck.add(index)
        await anyio.to_thread.run_sync(self.processes[index].kill)

    async def restart(self) -> None:
        """kill -9 the first replica and start it again (same port)."""
        self.restarts += 1
        self.struck.add(0)
        await anyio.to_thread.run_sync(self.processes[0].restart)

    async def aclose(self) -> None:
        for process in self.processes:
            await anyio.to_thread.run_sync(process.stop)

    def pids(self) -> list[int | None]:
        return [process.pid for process in self.processes]

    def never_struck(self, keys: Sequence[str]) -> list[str]:
        """Those of `keys` that no frozen or killed replica was ever sent. A record of such a
        key left UNKNOWN (or IN_PROGRESS, to turn UNKNOWN) after the run, or a tool run twice
        for it, was lost by a worker that stayed alive."""
        struck = set().union(*(self.keys_seen[i] for i in self.struck))
        return [key for key in keys if key not in struck]

    def describe(self) -> str:
        return f"http/{self.era} x{len(self.processes)} replicas"


@asynccontextmanager
async def open_replicas(
    ledger: Ledger,
    store_url: str | None,
    *,
    replicas: int = 2,
    era: Era = "modern",
    lease: float = 30.0,
    wait: float = 10.0,
    hold: float = 0.0,
    reconcile: bool = False,
) -> AsyncIterator[Replicas]:
    """`replicas` workload server processes on the store at `store_url` (None: unguarded, the
    baseline), each logging next to the ledger (`ledger.replica-N.log`), for as long as the block
    runs. `reconcile`: `pay` reconciles in-doubt records with the ledger (rule 19)."""

    def argv(port: int) -> list[str]:
        return server_command(
            "http",
            ledger,
            store_url,
            port=port,
            lease=lease,
            wait=wait,
            hold=hold,
            reconcile=reconcile,
        )

    made: list[ServerProcess] = []
    try:
        for n in range(replicas):
            made.append(ServerProcess(argv, log=ledger.path.with_suffix(f".replica-{n}.log")))
            await anyio.to_thread.run_sync(made[-1].start)
        yield Replicas(made, era)
    finally:
        for process in made:
            await anyio.to_thread.run_sync(process.stop)


@dataclass(frozen=True, slots=True)
class Strays:
    """What a run with struck replicas left behind, and whether only struck replicas left it."""

    #: Client keys of this run whose record is UNKNOWN, or IN_PROGRESS with nobody running it
    #: (it turns UNKNOWN at the next retry).
    orphans: list[str]
    #: Client keys of guarded calls whose tool ran more than once.
    twice: list[str]
    #: Of those, the keys no frozen or killed replica was ever sent: lost by a live worker.
    orphans_alive: list[str]
    twice_alive: list[str]


async def strays(replicas: Replicas, run: RunResult, store_url: str) -> Strays:
    """Read the store (after the run: nothing runs any more) and the ledger for what `run`
    left half-done, and tell which of it a worker that stayed alive is to blame for. Records of
    other runs sharing the store are ignored."""
    scope = default_scope(CallScope("chaos-shop", "", None, None, None))
    client_keys = {
        store_key(scope, record.tool, record.key): record.key
        for record in run.records
        if record.key is not None
    }
    store = open_store(store_url)
    try:
        records = await store.list_records(limit=1_000_000)
    finally:
        await store.aclose()
    orphans = [
        client_keys[record.key]
        for record in records
        if record.key in client_keys
        and record.state in (RecordState.UNKNOWN, RecordState.IN_PROGRESS)
    ]
    effects = run.ledger.by_call()
    twice = [  # guarded tools only: a copy of an unguarded call the network made is no retry
        record.key
        for record in run.records
        if record.key
        and record.tool not in UNGUARDED_TOOLS
        and len(effects.get(record.spec.call_id, [])) > 1
    ]
    return Strays(orphans, twice, replicas.never_struck(orphans), replicas.never_struck(twice))
