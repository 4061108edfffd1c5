"""Servers whose tools answer with the claim they run under (`current_claim()`), per entry point.

`whoami(note)` (async) and `whoami_sync(note)` (sync: run in a worker thread) answer with the
claim as JSON, `null` outside one; `unguarded(note)` is never guarded. Each entry point —
`@idempotent`, `install()`, the low-level handler — takes expired leases over
(`naturally_idempotent`), so a test can stand in for a dead worker by claiming a key itself with
a lease that has run out before the server's claim arrives.

As a stdio server: `python claim_server.py --entry decorator|install|lowlevel --store PATH`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from mcp.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
)

from idempotency import (
    KeyStore,
    SQLiteKeyStore,
    current_claim,
    idempotent,
    idempotent_call_tool,
    install,
)

NAME = "claims"
ENTRIES = ("decorator", "install", "lowlevel")
GUARDED = ("whoami", "whoami_sync")
POLICY: dict[str, Any] = {"naturally_idempotent": True}


def claim_json() -> str:
    claim = current_claim()
    return json.dumps(None if claim is None else dataclasses.asdict(claim))


def _tools() -> dict[str, Callable[..., Any]]:
    """Fresh functions per server: a function registered unguarded cannot be guarded later."""

    async def whoami(note: str) -> str:
        return claim_json()

    def whoami_sync(note: str) -> str:
        return claim_json()

    async def unguarded(note: str) -> str:
        return claim_json()

    return {"whoami": whoami, "whoami_sync": whoami_sync, "unguarded": unguarded}


def _high_level(entry: str, store: KeyStore) -> MCPServer:
    server = MCPServer(NAME)
    for name, fn in _tools().items():
        if entry == "decorator" and name in GUARDED:
            fn = idempotent(store, **POLICY)(fn)
        server.tool(name=name)(fn)
    if entry == "install":
        install(server, store, exclude=["unguarded"], **POLICY)
    return server


def _low_level(store: KeyStore) -> Server:
    schema = {"type": "object", "properties": {"note": {"type": "string"}}}

    async def list_tools(ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
        names = (*GUARDED, "unguarded")
        return ListToolsResult(tools=[Tool(name=n, input_schema=schema) for n in names])

    async def call_tool(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
        if params.name == "whoami_sync":
            text = await anyio.to_thread.run_sync(claim_json)
        else:
            text = claim_json()
        return CallToolResult(content=[TextContent(type="text", text=text)])

    guarded = idempotent_call_tool(store, call_tool, tools=GUARDED, server_name=NAME, **POLICY)
    return Server(NAME, on_list_tools=guarded.advertise(list_tools), on_call_tool=guarded)


def build(entry: str, store: KeyStore) -> MCPServer | Server:
    if entry not in ENTRIES:
        raise ValueError(f"entry must be one of {ENTRIES}")
    return _low_level(store) if entry == "lowlevel" else _high_level(entry, store)


async def serve(entry: str, path: Path) -> None:
    store = SQLiteKeyStore(path)
    server = build(entry, store)
    try:
        if isinstance(server, MCPServer):
            await server.run_stdio_async()
        else:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
    finally:
        with anyio.CancelScope(shield=True):
            await store.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--entry", choices=ENTRIES, required=True)
    parser.add_argument("--store", type=Path, required=True, help="the SQLite key store file")
    args = parser.parse_args()
    anyio.run(serve, args.entry, args.store)
