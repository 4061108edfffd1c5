"""One chaos run: a plan, a seeded RNG stream and a fault log shared by every reconnection.

A session dies with its link, so a run that injects close faults spans several transports. Keeping
the ordinals, the RNG and the log here (not per transport) is what makes `seed + plan` reproduce
the whole run, reconnections included. The links call back into their run through the small
`ChaosRun` protocol of `_transport`, which therefore never imports this module; the public
`ChaosTransport` is defined here, where its `chaos` can be typed as the `Chaos` it belongs to.
"""

from __future__ import annotations

import logging
import random
import secrets
from typing import TYPE_CHECKING, Any

import anyio
from mcp.client.stdio import StdioServerParameters
from mcp.server import Server
from mcp.server.mcpserver import MCPServer
from mcp_types import RequestId

from orchestrator.chaos._memory import in_memory_transport
from orchestrator.chaos._plan import Fault, FaultPlan
from orchestrator.chaos._record import FaultRecord, count_by_kind
from orchestrator.chaos._transport import FaultyLink

if TYPE_CHECKING:
    from mcp.client._transport import Transport

__all__ = ["Chaos", "ChaosTransport"]

logger = logging.getLogger("orchestrator.chaos")

_DELAY_KINDS = frozenset({Fault.DELAY_REQUEST, Fault.DELAY_RESPONSE})


def _resolve_inner(inner: object) -> Transport:
    """Accept what `mcp.client.Client` accepts, always as a wire-level (stream) transport."""
    if isinstance(inner, MCPServer | Server):
        return in_memory_transport(inner)
    if isinstance(inner, StdioServerParameters):
        from mcp.client.stdio import stdio_client

        return stdio_client(inner)
    if isinstance(inner, str):
        from mcp.client.streamable_http import streamable_http_client

        return streamable_http_client(inner)
    if not (
        callable(getattr(inner, "__aenter__", None)) and callable(getattr(inner, "__aexit__", None))
    ):
        raise TypeError(
            "Chaos.wrap() takes an MCP client transport (an async context manager yielding "
            "(read_stream, write_stream)), a server URL, StdioServerParameters, or an in-process "
            f"Server/MCPServer; got {type(inner).__name__}"
        )
    transport: Transport = inner  # type: ignore[assignment]
    return transport


class Chaos:
    """A reproducible fault-injection run: `Client(Chaos(plan, seed=7).wrap(transport))`.

    Every `wrap()` makes a fresh single-use `ChaosTransport`; all of them draw from this object's
    RNG, number matching requests with its ordinals and append to its fault log. Determinism holds
    for a given sequence of client writes: concurrent calls whose write order varies between runs
    draw in that varying order.
    """

    def __init__(self, plan: FaultPlan | None = None, *, seed: int | None = None) -> None:
        if plan is None:
            plan = FaultPlan()
        if not isinstance(plan, FaultPlan):
            raise TypeError(f"Chaos plan must be a FaultPlan, got {type(plan).__name__}")
        if seed is None:
            seed = secrets.randbits(63)
        elif isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"Chaos seed must be an int (or None for a random one), got {seed!r}")
        self._plan = plan
        self._seed = seed
        self._rng = random.Random(seed)
        self._faults: list[FaultRecord] = []
        self._requests = 0
        self._connections = 0
        self._awaiting = 0
        self._settled: anyio.Event | None = None

    @property
    def plan(self) -> FaultPlan:
        return self._plan

    @property
    def seed(self) -> int:
        """The seed in use (drawn at random when none was given): report it to replay the run."""
        return self._seed

    @property
    def requests_seen(self) -> int:
        """How many matching requests have been decided so far (the last ordinal handed out)."""
        return self._requests

    @property
    def connections(self) -> int:
        """How many transports `wrap()` has made."""
        return self._connections

    @property
    def faults(self) -> tuple[FaultRecord, ...]:
        """Every injected fault of the run, in decision order."""
        return tuple(self._faults)

    def fault_counts(self) -> dict[Fault, int]:
        """How many faults of each kind the run injected (every kind present, zeros included)."""
        return count_by_kind(self._faults)

    def report(self) -> dict[str, Any]:
        """A JSON-ready summary that, with the same client, reproduces the run."""
        return {
            "seed": self._seed,
            "plan": self._plan.to_dict(),
            "requests": self._requests,
            "connections": self._connections,
            "counts": {kind.value: count for kind, count in self.fault_counts().items()},
            "faults": [record.to_dict() for record in self._faults],
        }

    def wrap(
        self, inner: Transport | Server[Any] | MCPServer | StdioServerParameters | str
    ) -> ChaosTransport:
        """A new faulty link over `inner`: a transport, a URL, StdioServerParameters or a server.

        An in-process `Server`/`MCPServer` is served over memory streams (not the SDK's direct
        dispatch) so that there is a wire to break; both protocol eras work over it.
        """
        transport = _resolve_inner(inner)
        self._connections += 1
        return ChaosTransport(transport, self, self._connections)

    async def settled(self) -> None:
        """Wait until every response this run is swallowing (lost acks, duplicates) has come back.

        After it returns, the server has finished every request whose answer the chaos hid, so a
        test can count effects without sleeping. A swallowed request the server never answers (it
        honoured the client's cancel) keeps this waiting until its link closes: bound the wait.
        """
        while self._awaiting:
            if self._settled is None:
                self._settled = anyio.Event()
            await self._settled.wait()

    # -- used by ChaosTransport ----------------------------------------------------------------

    def _decide(
        self, *, method: str, tool: str | None, request_id: RequestId, connection: int
    ) -> FaultRecord | None:
        """Number a matching request, draw for it and record the fault, if any."""
        self._requests += 1
        index = self._requests
        # Always two draws, fault or not, so schedule entries never shift later random choices.
        kind_draw = self._rng.random()
        delay_draw = self._rng.random()
        kind = self._plan.choose(index, kind_draw)
        if kind is None:
            return None
        record = FaultRecord(
            index=index,
            kind=kind,
            method=method,
            request_id=request_id,
            tool=tool,
            connection=connection,
            delay_seconds=self._plan.delay(delay_draw) if kind in _DELAY_KINDS else None,
            time=anyio.current_time(),
        )
        self._faults.append(record)
        logger.info(
            "chaos: %s on request #%d (%s%s, id %r, connection %d)",
            kind.value,
            index,
            method,
            f" {tool}" if tool is not None else "",
            request_id,
            connection,
        )
        return record

    def _swallowing(self, count: int) -> None:
        self._awaiting += count

    def _swallowed(self, count: int) -> None:
        if count <= 0:
            return
        self._awaiting -= count
        if self._awaiting == 0 and self._settled is not None:
            self._settled.set()
            self._settled = None


class ChaosTransport(FaultyLink):
    """A single-use MCP client transport that relays `inner` and injects its `Chaos`'s faults.

    Usable wherever the SDK takes a transport: `Client(chaos.wrap(inner))`, or
    `async with chaos.wrap(inner) as (read, write): ClientSession(read, write)`. Build it with
    `Chaos.wrap`; after a close fault the link stays dead, so reconnect by wrapping a new inner
    transport with the same `Chaos` (shared plan, RNG stream, ordinals and fault log).
    """

    def __init__(self, inner: Transport, chaos: Chaos, connection: int) -> None:
        super().__init__(inner, chaos, connection)
        self._chaos = chaos

    @property
    def chaos(self) -> Chaos:
        return self._chaos
