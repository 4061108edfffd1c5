"""Rule 13: inside a guarded call the tool reads its claim — key, fence, attempt, record — with
`idempotency.current_claim()`, under every entry point (`@idempotent`, `install()`, the low-level
handler), async or in a worker thread, over in-memory, stdio and streamable HTTP sessions; and the
fence is higher after a takeover. Outside a guarded call it is None.

A dead worker is played by the test itself: it claims the key in the shared SQLite store with a
lease that has already run out when the server's claim arrives, so the server takes it over.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from claim_server import ENTRIES, NAME, build
from held_cancels import GIVE_UP, HoldCancels
from mcp import MCPError
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp_types import REQUEST_TIMEOUT, CallToolResult
from server_kit import SOON, call_fingerprint, marker, meta, record_key, serve_http

from idempotency import (
    InDoubt,
    MemoryKeyStore,
    OutcomeLost,
    Reconciled,
    SQLiteKeyStore,
    current_claim,
    idempotent,
    wire,
)
from orchestrator.chaos import in_memory_transport

pytestmark = pytest.mark.anyio

SCRIPT = Path(__file__).with_name("claim_server.py")
NOTE = {"note": "hello"}
#: Process start-up (Python + the SDK) on a loaded 2-core machine can take a few seconds.
STARTUP_BOUND = 120.0


@asynccontextmanager
async def session(entry: str, transport: str, store: SQLiteKeyStore) -> AsyncIterator[Client]:
    """A client of the `entry` server over `transport`, its records in `store`."""
    if transport == "stdio":
        args = [str(SCRIPT), "--entry", entry, "--store", str(store.path)]
        params = StdioServerParameters(command=sys.executable, args=args)
        async with Client(params) as client:
            yield client
        return
    server = build(entry, store)
    if transport == "memory":
        async with Client(server, mode="legacy") as client:
            yield client
        return
    async with (
        serve_http(server.streamable_http_app()) as base,
        Client(streamable_http_client(f"{base}/mcp"), mode="legacy") as client,
    ):
        yield client


def claim_of(result: CallToolResult) -> Any:
    block = result.content[0]
    assert block.type == "text"
    return json.loads(block.text)


@pytest.mark.parametrize("transport", ["memory", "stdio", "http"])
@pytest.mark.parametrize("entry", ENTRIES)
async def test_the_tool_sees_its_claim_and_a_takeover_raises_the_fence(
    entry: str, transport: str, tmp_path: Path
) -> None:
    store = SQLiteKeyStore(tmp_path / "keys.sqlite3")
    # A worker that claimed "k-dead" and died: its lease is over before the server's claim.
    dead = record_key(NAME, "whoami", "k-dead")
    gone = await store.claim(dead, call_fingerprint("whoami", NOTE), lease=1e-6, takeover=False)
    assert gone.fence == 1
    try:
        with anyio.fail_after(STARTUP_BOUND):
            async with session(entry, transport, store) as client:
                first = await client.call_tool("whoami", NOTE, meta=meta("k-1"))
                replay = await client.call_tool("whoami", NOTE, meta=meta("k-1"))
                threaded = await client.call_tool("whoami_sync", NOTE, meta=meta("k-2"))
                taken = await client.call_tool("whoami", NOTE, meta=meta("k-dead"))
                unguarded = await client.call_tool("unguarded", NOTE, meta=meta("k-3"))
    finally:
        await store.aclose()
    assert claim_of(first) == {
        "key": "k-1",
        "fence": 1,
        "attempt": 1,
        "record": record_key(NAME, "whoami", "k-1"),
        "tool": "whoami",
    }
    assert marker(replay)["status"] == "replayed" and claim_of(replay) == claim_of(first)
    assert claim_of(threaded) == {
        "key": "k-2",
        "fence": 1,
        "attempt": 1,
        "record": record_key(NAME, "whoami_sync", "k-2"),
        "tool": "whoami_sync",
    }
    assert claim_of(taken) == {
        "key": "k-dead",
        "fence": 2,
        "attempt": 2,
        "record": dead,
        "tool": "whoami",
    }
    assert marker(taken)["attempts"] == 2
    assert claim_of(unguarded) is None


async def test_no_claim_outside_a_guarded_call_or_without_a_key(tmp_path: Path) -> None:
    """None in code that is not a tool, in a keyless call the guard leaves unprotected, and again
    after a guarded call ended (the claim does not leak into the caller's context)."""
    store = SQLiteKeyStore(tmp_path / "keys.sqlite3")
    try:
        assert current_claim() is None
        server = build("decorator", store)
        with anyio.fail_after(SOON):
            # The SDK's direct dispatch has no caller identity: no key is derived for it.
            async with Client(server) as client:
                keyless = await client.call_tool("whoami", NOTE)
                keyed = await client.call_tool("whoami", NOTE, meta=meta("k-1"))
        assert current_claim() is None
    finally:
        await store.aclose()
    assert claim_of(keyless) is None
    assert claim_of(keyed)["key"] == "k-1"


# -- rule 18: a downstream key per intent (`Claim.downstream_key`) ------------------------------


class StripeLike:
    """A payment provider with Stripe's idempotency semantics: a charge under a key it has seen
    answers the stored response and charges nothing; a new key is a new charge."""

    def __init__(self) -> None:
        self.responses: dict[str, str] = {}
        #: The key of each charge made, in order.
        self.charged: list[str] = []

    def charge(self, key: str, order: str) -> str:
        if key not in self.responses:
            self.charged.append(key)
            self.responses[key] = f"ch_{len(self.charged)} for {order}"
        return self.responses[key]

    def find(self, key: str) -> str | None:
        return self.responses.get(key)


@dataclass
class Payments:
    """A guarded `charge(order)` handing the provider `current_claim().downstream_key`, and
    `open_gate()`. `gate`: charges wait for it (bounded) once they started. `lose`: the next
    execution of a later intent ("before" or "after" its charge) raises `OutcomeLost`, as a
    worker whose provider call broke would (the record turns UNKNOWN at once)."""

    store: MemoryKeyStore = field(default_factory=MemoryKeyStore)
    provider: StripeLike = field(default_factory=StripeLike)
    gate: anyio.Event = field(default_factory=anyio.Event)
    started: anyio.Event = field(default_factory=anyio.Event)
    lose: str | None = None
    #: The downstream key of every execution, and what each reconciler was asked with.
    keys: list[str] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)

    def server(self, *, reconcile: bool = False) -> MCPServer:
        server = MCPServer("payments")

        async def look_up(doubt: InDoubt) -> Reconciled:
            self.asked.append(doubt.downstream_key)
            found = self.provider.find(doubt.downstream_key)
            return Reconciled.not_happened() if found is None else Reconciled.happened(found)

        @server.tool()
        @idempotent(self.store, reconcile=look_up if reconcile else None)
        async def charge(order: str) -> str:
            claim = current_claim()
            assert claim is not None
            self.keys.append(claim.downstream_key)
            self.started.set()
            with anyio.fail_after(SOON):
                await self.gate.wait()
            lose, self.lose = (self.lose, None) if claim.intent > 1 else (None, self.lose)
            if lose == "before":
                raise OutcomeLost("the provider call broke before it was sent")
            made = self.provider.charge(claim.downstream_key, order)
            if lose == "after":
                raise OutcomeLost("the provider's answer was lost")
            return made

        @server.tool()
        async def open_gate() -> str:
            self.gate.set()
            return "open"

        return server

    async def record(self) -> str:
        (found,) = await self.store.list_records()
        return found.key


def text_of(result: CallToolResult) -> str:
    block = result.content[0]
    assert block.type == "text"
    return block.text


async def test_a_provider_key_charges_a_repeat_again_and_a_resend_never() -> None:
    """Keyless calls (a derived key) to a tool that hands a Stripe-like provider
    `current_claim().downstream_key`: the caller gives up on the first call while it runs (its
    read timeout's cancel), and its re-send gets the first charge, replayed: one charge. The
    same call once more, after that answer was delivered, is a new intent (rule 15): the
    provider gets a new key and charges again. With `claim.record` as the provider's key the
    repeat would get the first charge back from the provider, marked executed."""
    payments = Payments()
    transport = HoldCancels(in_memory_transport(payments.server()), lambda: payments.started)
    with anyio.fail_after(SOON):
        async with Client(transport, mode="legacy") as client:
            await client.list_tools()
            with pytest.raises(MCPError) as raised:
                await client.session.call_tool(
                    "charge", {"order": "o-1"}, read_timeout_seconds=GIVE_UP
                )
            assert raised.value.error.code == REQUEST_TIMEOUT
            await client.call_tool("open_gate", {})  # after the cancel: the server saw it
            resent = await client.call_tool("charge", {"order": "o-1"})
            charged_by_then = list(payments.provider.charged)
            repeated = await client.call_tool("charge", {"order": "o-1"})
    record = await payments.record()
    assert charged_by_then == [record]
    assert (marker(resent)["status"], text_of(resent)) == ("replayed", "ch_1 for o-1")
    assert (marker(repeated)["status"], text_of(repeated)) == ("executed", "ch_2 for o-1")
    assert payments.provider.charged == [record, f"{record}/2"]
    assert payments.keys == [record, f"{record}/2"]


@pytest.mark.parametrize("lose", ["before", "after"])
async def test_a_reconciler_looks_the_lost_intent_up_under_its_own_key(lose: str) -> None:
    """`InDoubt.downstream_key` is the key the lost execution handed the provider, and a
    `not_happened` runs the tool under that same key (one intent). The first call is delivered;
    the repeat (intent 2) loses its outcome, before or after its charge; the retry's reconciler
    looks the repeat's charge up by its key: not there, the tool runs (one charge under it);
    there, its receipt is the answer. Looked up by `record`, it would find the first call's
    charge and answer the repeat with it."""
    payments = Payments()
    payments.gate.set()
    with anyio.fail_after(SOON):
        async with Client(
            in_memory_transport(payments.server(reconcile=True)), mode="legacy"
        ) as client:
            first = await client.call_tool("charge", {"order": "o-2"})
            payments.lose = lose
            with pytest.raises(MCPError) as raised:
                await client.call_tool("charge", {"order": "o-2"})
            assert raised.value.error.code == wire.OUTCOME_UNKNOWN
            retried = await client.call_tool("charge", {"order": "o-2"})
    record = await payments.record()
    assert text_of(first) == "ch_1 for o-2"
    assert text_of(retried) == "ch_2 for o-2"
    assert payments.asked == [f"{record}/2"]
    assert payments.provider.charged == [record, f"{record}/2"]
    ran = [record, f"{record}/2"] + ([f"{record}/2"] if lose == "before" else [])
    assert payments.keys == ran
    assert marker(retried)["status"] == ("executed" if lose == "before" else "replayed")
