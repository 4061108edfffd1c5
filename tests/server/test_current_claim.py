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
from pathlib import Path
from typing import Any

import anyio
import pytest
from claim_server import ENTRIES, NAME, build
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult
from server_kit import SOON, call_fingerprint, marker, meta, record_key, serve_http

from idempotency import SQLiteKeyStore, current_claim

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
