"""What the FastMCP tests share: a FastMCP server whose guarded `charge` has countable effects
(the same body as the `MCPServer` tests' `effect_server`), and its clients over memory and
streamable HTTP on 127.0.0.1."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastmcp import Client, FastMCP
from mcp_types import Tool
from server_kit import SOON, Effects, serve_http

from idempotency import KeyStore, wire
from idempotency.fastmcp import IdempotencyMiddleware

TRANSPORTS = ["memory", "http"]
#: Opens a new client to the server under test (enter it with `async with`).
Connect = Callable[..., Client[Any]]


def charge_server(
    store: KeyStore | None,
    effects: Effects,
    *,
    name: str = "shop",
    gated: bool = True,
    **options: Any,
) -> FastMCP[Any]:
    """A FastMCP server with one tool, `charge`, guarded by `IdempotencyMiddleware(store)`
    (`store` None: the same server unguarded, for reference)."""
    mcp: FastMCP[Any] = FastMCP(name)
    if store is not None:
        mcp.add_middleware(IdempotencyMiddleware(store, **options))

    @mcp.tool
    async def charge(order: str, cents: int) -> str:
        return await effects.charge(order, cents, gated=gated)

    return mcp


@asynccontextmanager
async def serving(server: FastMCP[Any], transport: str, **app: Any) -> AsyncIterator[Connect]:
    """Clients to `server`: in-process over memory streams, or over streamable HTTP served on
    127.0.0.1 (`app` goes to `http_app`). The returned callable takes `Client` options. The
    block must finish within `SOON`: a hang fails the test instead of stalling the suite."""
    with anyio.fail_after(SOON):
        if transport == "memory":
            yield lambda **kwargs: Client(server, **kwargs)
            return
        async with serve_http(server.http_app(**app)) as base:
            yield lambda **kwargs: Client(f"{base}/mcp", **kwargs)


def promise(tool: Tool) -> tuple[bool | None, Any]:
    """What a listed definition promises: its `idempotentHint` and mcp-once's `_meta` entry."""
    hint = tool.annotations.idempotent_hint if tool.annotations is not None else None
    return hint, (tool.meta or {}).get(wire.IDEMPOTENCY_META)
