"""The chaos workload's shop, written for FastMCP: the same four tools, names and effects as the
engine's `MCPServer` shop (the checker knows them by name), guarded by `IdempotencyMiddleware`.

- `pay`: an effect that must never happen twice; guarded.
- `set_value`: naturally idempotent (`idempotentHint`), guarded: an expired lease is taken over.
- `get_balance`: read-only (`readOnlyHint`), guarded.
- `notify`: not idempotent, not annotated and not guarded: the client gate alone must keep it
  from running twice.

Every effect is the engine shop's own (`ShopEffects`), written to the ledger by the tool body.
Run as a script, it serves streamable HTTP on 127.0.0.1 in a process the chaos case can kill -9.
"""

from __future__ import annotations

import argparse
from typing import Any

from chaos_engine import Ledger, ShopEffects, marks
from fastmcp import Context, FastMCP
from mcp_types import ToolAnnotations

from idempotency import KeyStore, open_store
from idempotency.fastmcp import IdempotencyMiddleware

GUARDED = ["pay", "set_value", "get_balance"]


def _marks(ctx: Context) -> tuple[str | None, int | None]:
    request = ctx.request_context
    return marks(request.meta if request is not None else None)


def build_shop(
    store: KeyStore | None, ledger: Ledger, *, lease: float, wait: float
) -> FastMCP[Any]:
    """The shop over `ledger`, guarded by `store` (None: the unguarded baseline)."""
    shop: FastMCP[Any] = FastMCP("chaos-shop")
    effects = ShopEffects(ledger)
    if store is not None:
        shop.add_middleware(IdempotencyMiddleware(store, tools=GUARDED, lease=lease, wait=wait))

    @shop.tool(description="Pay `cents` to `account` (an effect that must happen once).")
    async def pay(call_id: str, account: str, cents: int, ctx: Context) -> str:
        return effects.pay(call_id, account, cents, *_marks(ctx))

    @shop.tool(
        annotations=ToolAnnotations(idempotent_hint=True),
        description="Set `name` to `value` (naturally idempotent).",
    )
    async def set_value(call_id: str, name: str, value: int, ctx: Context) -> str:
        return effects.set_value(call_id, name, value, *_marks(ctx))

    @shop.tool(
        annotations=ToolAnnotations(read_only_hint=True),
        description="Cents paid to `account` so far.",
    )
    async def get_balance(account: str) -> str:
        return effects.balance(account)

    @shop.tool(description="Send a notification (not idempotent, not guarded).")
    async def notify(call_id: str, message: str, ctx: Context) -> str:
        return effects.notify(call_id, message, *_marks(ctx))

    return shop


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--store", default=None, help="key store URL; omit for the baseline")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--wait", type=float, default=10.0)
    args = parser.parse_args()
    store = open_store(args.store) if args.store else None
    shop = build_shop(store, Ledger(args.ledger), lease=args.lease, wait=args.wait)
    shop.run(
        "http",
        host="127.0.0.1",
        port=args.port,
        log_level="error",
        show_banner=False,
        uvicorn_config={"timeout_graceful_shutdown": 1},
    )


if __name__ == "__main__":
    main()
