"""The example server: three tools, one per kind of effect, guarded as their effects demand.

It lives in the package so that `mcp-once serve-example` works from a plain install;
`examples/server.py` runs this same server (over streamable HTTP or stdio). Read it as
documentation: it is what a server author writes.

The "payment provider" is an in-memory `Ledger` of this process. Like a real provider it does
not deduplicate anything: every `charge` that runs moves money. Only `@idempotent` stands between
a retried call and a second charge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

from idempotency import KeyStore, idempotent

#: The server's name is part of every record's scope (`mcp-once keys show --server ...`).
SERVER_NAME = "mcp-once-example"


@dataclass
class Ledger:
    """The side effects, observable from outside through the read-only tool."""

    charges: list[dict[str, Any]] = field(default_factory=list)
    addresses: dict[str, str] = field(default_factory=dict)


def build_server(store: KeyStore, ledger: Ledger | None = None) -> MCPServer:
    """The example `MCPServer`, its records kept in `store`."""
    ledger = ledger if ledger is not None else Ledger()
    server = MCPServer(SERVER_NAME)

    # Not idempotent by itself: every run moves money. The guard runs it at most once per key and
    # replays the stored result to every retry. Its definition is advertised with
    # `idempotentHint: true`, which opens a careful client's retry gate. If a worker dies
    # mid-charge, the record turns UNKNOWN (error -32012) instead of charging again: an operator
    # reconciles it with `mcp-once keys settle`.
    @server.tool()
    @idempotent(store)
    async def charge(order_id: str, cents: int) -> dict[str, Any]:
        """Charge an order (a payment: must happen at most once per idempotency key)."""
        receipt = {
            "charge_id": f"ch_{len(ledger.charges) + 1}",
            "order_id": order_id,
            "cents": cents,
        }
        ledger.charges.append(receipt)
        return receipt

    # Naturally idempotent: setting the same address twice changes nothing more. Guarded anyway,
    # so that retries get the first answer (marked replayed), and declared so, so that a worker
    # that died mid-call is simply taken over instead of leaving an UNKNOWN record.
    @server.tool()
    @idempotent(store, naturally_idempotent=True)
    async def set_shipping_address(order_id: str, address: str) -> str:
        """Set the shipping address of an order (an upsert)."""
        ledger.addresses[order_id] = address
        return f"order {order_id} ships to {address}"

    # Read-only: no effect to protect and nothing worth storing (a replay would serve stale data).
    # `readOnlyHint` alone lets a client retry it; no guard needed.
    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def list_charges(order_id: str | None = None) -> list[dict[str, Any]]:
        """The charges made so far, optionally for one order."""
        return [c for c in ledger.charges if order_id is None or c["order_id"] == order_id]

    return server


__all__ = ["SERVER_NAME", "Ledger", "build_server"]
