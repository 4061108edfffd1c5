"""What every framework test uses: a real shop server process, its ledger, and a lost response.

The server is the scenario engine's shop (`mcp_once.scenarios`): `pay` (guarded when the server
has a key store), `set_value` (annotated idempotent) and `notify` (never guarded, not annotated).
It runs in a process of its own, over stdio or streamable HTTP, and every execution of a tool's
effect is a row its body writes to a SQLite ledger outside the idempotency layer: the count the
tests check is one the server cannot fake. A lost response is the chaos link's LOST_ACK on the
first `tools/call` of the tool under test: the server runs it and answers; the answer never comes.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
from mcp.client.stdio import StdioServerParameters, stdio_client

from mcp_once.scenarios._endpoints import ServerProcess, server_command
from mcp_once.scenarios._ledger import Effect, Ledger
from orchestrator import RetryPolicy, streamable_http_transport
from orchestrator.chaos import Chaos, Fault, FaultPlan
from orchestrator.fastmcp import SDKStreamTransport

if TYPE_CHECKING:
    from mcp.client._transport import TransportStreams

TransportName = Literal["stdio", "http"]

#: Seconds an attempt waits for an answer. A lost answer costs exactly this; a healthy call on
#: a loaded 2-core machine answers in milliseconds.
ATTEMPT_TIMEOUT = 2.0
#: Bound for anything that ends as soon as the awaited thing happens.
SOON = 30.0

POLICY = RetryPolicy(max_attempts=3, attempt_timeout=ATTEMPT_TIMEOUT, deadline=SOON)

StreamsFactory = Callable[[], AbstractAsyncContextManager["TransportStreams"]]


@dataclass
class Shop:
    transport: TransportName
    guarded: bool
    ledger: Ledger
    connect: StreamsFactory
    #: The server's URL over HTTP (None over stdio), for frameworks that take one.
    url: str | None = None
    #: The stdio command, for frameworks that spawn the server themselves.
    params: StdioServerParameters | None = None
    calls: list[str] = field(default_factory=list)

    def call_id(self) -> str:
        """A fresh logical call id (a tool argument, so identical on every attempt)."""
        call = f"call-{uuid.uuid4().hex[:8]}"
        self.calls.append(call)
        return call

    def effects(self, call_id: str) -> list[Effect]:
        return [effect for effect in self.ledger.effects() if effect.call_id == call_id]


def fastmcp_over(shop: Shop, chaos: Chaos) -> SDKStreamTransport:
    """A FastMCP transport to the shop through the chaos link (a new link per connection)."""
    return SDKStreamTransport(lambda: chaos.wrap(shop.connect()))


def lose_first_answer(tool: str) -> Chaos:
    """A chaos run that swallows the response to the first `tools/call` of `tool`, only."""
    return Chaos(FaultPlan(schedule={1: Fault.LOST_ACK, 2: None, 3: None}, tools={tool}), seed=7)


async def settle(chaos: Chaos) -> None:
    """Wait until the server has answered every request whose answer the chaos swallowed."""
    with anyio.fail_after(SOON):
        await chaos.settled()


@asynccontextmanager
async def open_shop(transport: TransportName, tmp: Path, *, guarded: bool) -> AsyncIterator[Shop]:
    ledger = Ledger(tmp / "ledger.sqlite3")
    store = f"sqlite:///{tmp / 'keys.sqlite3'}" if guarded else None
    if transport == "stdio":
        argv = server_command("stdio", ledger, store)
        params = StdioServerParameters(command=sys.executable, args=argv[1:])
        yield Shop(transport, guarded, ledger, lambda: stdio_client(params), params=params)
        return
    process = ServerProcess(lambda port: server_command("http", ledger, store, port=port))
    await anyio.to_thread.run_sync(process.start)
    try:
        url = process.url
        yield Shop(transport, guarded, ledger, lambda: streamable_http_transport(url), url=url)
    finally:
        await anyio.to_thread.run_sync(process.stop)


def pay_args(call: str) -> dict[str, Any]:
    return {"call_id": call, "account": "acct", "cents": 100}


def notify_args(call: str) -> dict[str, Any]:
    return {"call_id": call, "message": "hi"}


async def executions(shop: Shop, call: str, chaos: Chaos) -> list[Effect]:
    """The call's effects, once the server has answered everything the chaos swallowed."""
    await settle(chaos)
    return shop.effects(call)


async def replayed_once(
    shop: Shop, call: str, chaos: Chaos, *, key_prefix: str | None = None
) -> Effect:
    """The call was sent twice (the first answer lost), with one key, and ran once."""
    effects = await executions(shop, call, chaos)
    assert len(effects) == 1, effects
    assert chaos.requests_seen == 2
    if key_prefix is not None:
        assert effects[0].key is not None and effects[0].key.startswith(f"{key_prefix}-")
    return effects[0]


async def sent_once(shop: Shop, call: str, chaos: Chaos) -> None:
    """The call was never re-sent after its answer was lost, and ran once."""
    assert len(await executions(shop, call, chaos)) == 1
    assert chaos.requests_seen == 1
