"""The example server, written with FastMCP: `uv run python examples/fastmcp_server.py [--stdio]`.

The same three tools as `examples/server.py` (a payment, an upsert, a read), on a `fastmcp.FastMCP`
server (the `fastmcp` extra; see the README's Install section). FastMCP runs tools its own way, so
the guard is a middleware rather than `@idempotent` (which refuses FastMCP tools):

    mcp = FastMCP("shop")
    mcp.add_middleware(IdempotencyMiddleware(store, tags={"effect"}))   # before any cache

    @mcp.tool(tags={"effect"})        # guarded: at most one run per key, replays after
    async def charge(order_id: str, cents: int) -> dict: ...

`examples/client_http.py` works against it unchanged.
"""

from __future__ import annotations

import contextlib
from typing import Any

from fastmcp import FastMCP
from mcp_types import ToolAnnotations
from server import options  # examples/server.py: the same command line and default store

from idempotency import KeyStore, open_store
from idempotency.fastmcp import IdempotencyMiddleware


def build_server(store: KeyStore) -> FastMCP[Any]:
    charges: list[dict[str, Any]] = []  # the "payment provider": it deduplicates nothing
    addresses: dict[str, str] = {}
    mcp: FastMCP[Any] = FastMCP("mcp-once-fastmcp-example")
    # One policy for the tools tagged "effect". Listed with `idempotentHint: true` and mcp-once's
    # `_meta` entry for every caller whose keyless calls the server can tell apart.
    mcp.add_middleware(IdempotencyMiddleware(store, tags={"effect"}))

    # Not idempotent by itself: every run moves money. A worker lost mid-charge leaves an UNKNOWN
    # record (-32012) for an operator instead of charging again.
    @mcp.tool(tags={"effect"})
    async def charge(order_id: str, cents: int) -> dict[str, Any]:
        """Charge an order (a payment: must happen at most once per idempotency key)."""
        receipt = {"charge_id": f"ch_{len(charges) + 1}", "order_id": order_id, "cents": cents}
        charges.append(receipt)
        return receipt

    # Naturally idempotent, and declared so (`idempotentHint`): a lost worker is taken over.
    @mcp.tool(tags={"effect"}, annotations=ToolAnnotations(idempotent_hint=True))
    async def set_shipping_address(order_id: str, address: str) -> str:
        """Set the shipping address of an order (an upsert)."""
        addresses[order_id] = address
        return f"order {order_id} ships to {address}"

    # Read-only and untagged: not guarded (a replay would serve stale data); `readOnlyHint`
    # alone lets a client retry it.
    @mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def list_charges(order_id: str | None = None) -> list[dict[str, Any]]:
        """The charges made so far, optionally for one order."""
        return [c for c in charges if order_id is None or c["order_id"] == order_id]

    return mcp


def main() -> None:
    args = options(__doc__.splitlines()[0])  # --stdio, --host, --port, --store
    server = build_server(open_store(args.store))
    # No banner: it is FastMCP's advertisement, and it checks PyPI for a newer FastMCP (an
    # "update available" line, and a network call) on every start.
    if args.stdio:
        server.run("stdio", show_banner=False)
    else:
        # Streamable HTTP at http://HOST:PORT/mcp (see examples/client_http.py).
        server.run("http", host=args.host, port=args.port, show_banner=False)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the server has shut down cleanly
        main()
