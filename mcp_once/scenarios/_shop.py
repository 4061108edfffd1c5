"""The chaos workload's server: four tools that cover every retry decision the contract makes.

- `pay`: an effect that must never happen twice (a payment), made safe by `@idempotent`.
- `set_value`: naturally idempotent (a write of a value), also guarded; its author declares it
  idempotent, so an expired lease is taken over instead of turning UNKNOWN.
- `get_balance`: read-only, no effect.
- `notify`: a non-idempotent effect that is *not* guarded and not annotated: a careful client
  must never retry it once it may have run.

Every effect is written to the `Ledger` by the tool body itself. The same builder makes the
baseline server (`guarded=False`): the same tools without mcp-once.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

from idempotency import InDoubt, KeyStore, Reconciled, current_claim, idempotent, wire
from mcp_once.scenarios._ledger import Ledger

__all__ = [
    "EFFECT_TOOLS",
    "READ_ONLY_TOOLS",
    "REEXECUTABLE_TOOLS",
    "UNGUARDED_TOOLS",
    "ShopEffects",
    "build_server",
    "marks",
]

#: Tools whose every execution is an effect recorded in the ledger.
EFFECT_TOOLS = frozenset({"pay", "set_value", "notify"})
#: Tools whose second execution is harmless by nature (re-execution is not a duplicate).
REEXECUTABLE_TOOLS = frozenset({"set_value"})
READ_ONLY_TOOLS = frozenset({"get_balance"})
#: Tools the server never guards: the client gate alone must keep them from running twice.
UNGUARDED_TOOLS = frozenset({"notify"})

_IDEMPOTENT = ToolAnnotations(idempotent_hint=True)
_READ_ONLY = ToolAnnotations(read_only_hint=True)


def marks(meta: Mapping[str, Any] | None) -> tuple[str | None, int | None]:
    """The key and attempt number a request's `_meta` carried, for the ledger."""
    meta = meta or {}
    key = meta.get(wire.KEY_META)
    attempt = meta.get(wire.ATTEMPT_META)
    return (
        key if isinstance(key, str) else None,
        attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
    )


class ShopEffects:
    """The shop's effects, each written to the ledger by the body that makes it: one
    implementation for every server framework that serves the shop (the checker knows the tools
    by name, so every shop must make the same effects the same way)."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def pay(
        self, call_id: str, account: str, cents: int, key: str | None, attempt: int | None
    ) -> str:
        receipt = f"receipt {uuid.uuid4().hex[:12]} {cents} to {account}"
        claim = current_claim()
        record = None if claim is None else claim.downstream_key
        self._ledger.record(call_id, "pay", receipt, key=key, attempt=attempt, record=record)
        return receipt

    def paid(self, doubt: InDoubt) -> Reconciled:
        """`pay`'s reconciler: the payment made under the in-doubt execution's downstream key,
        looked up in the ledger as a provider is asked by its idempotency key (sync: run in a
        worker thread)."""
        found = self._ledger.made_under(doubt.downstream_key, "pay")
        call_id = (doubt.arguments or {}).get("call_id")
        self._ledger.event("reconciled" if found else "reconciled_absent", call_id)
        return Reconciled.not_happened() if found is None else Reconciled.happened(found)

    def set_value(
        self, call_id: str, name: str, value: int, key: str | None, attempt: int | None
    ) -> str:
        written = f"{name}={value} (write {uuid.uuid4().hex[:12]})"
        self._ledger.record(call_id, "set_value", written, key=key, attempt=attempt)
        return written

    def balance(self, account: str) -> str:
        return f"{account}: {self._ledger.balance(account)}"

    def notify(self, call_id: str, message: str, key: str | None, attempt: int | None) -> str:
        sent = f"sent {uuid.uuid4().hex[:12]}: {message}"
        self._ledger.record(call_id, "notify", sent, key=key, attempt=attempt)
        return sent


def build_server(
    store: KeyStore | None,
    ledger: Ledger,
    *,
    name: str = "chaos-shop",
    lease: float = 30.0,
    wait: float = 10.0,
    hold: float = 0.0,
    hold_tools: frozenset[str] = frozenset({"pay", "set_value"}),
    retention: float | None = None,
    reconcile: bool = False,
) -> MCPServer:
    """The workload server over `ledger`; guarded by `store`, or the unguarded baseline (None).

    `hold` > 0 makes the first attempt of a `hold_tools` call pause that many seconds right
    after its effect (announcing it with a progress notification carrying the pid and a
    `started` ledger event): the window in which process-level faults strike mid-tool.

    `reconcile`: `pay` has a reconciler (rule 19) that asks the ledger for the payment made under
    the in-doubt record, so a payment a dead or frozen worker left in doubt is resolved by the
    retry instead of answered -32012.
    """
    server = MCPServer(name)
    effects = ShopEffects(ledger)
    options: dict[str, Any] = {"lease": lease, "wait": wait}
    if retention is not None:  # seconds a completed record is kept (a short one, for tests)
        options["retention"] = retention
    if reconcile:
        options["reconcile"] = {"pay": effects.paid}

    def guard(fn: Any) -> Any:
        return fn if store is None else idempotent(store, **options)(fn)

    async def maybe_hold(tool: str, call_id: str, attempt: int | None, ctx: Context) -> None:
        if hold <= 0 or tool not in hold_tools or attempt not in (None, 1):
            return
        ledger.event("started", call_id)
        try:
            await ctx.report_progress(1, 2, f"{os.getpid()} {call_id}")
            await anyio.sleep(hold)
        finally:
            ledger.event("finished", call_id)

    @server.tool(description="Pay `cents` to `account` (an effect that must happen once).")
    @guard
    async def pay(call_id: str, account: str, cents: int, ctx: Context) -> str:
        key, attempt = marks(ctx.request_context.meta)
        receipt = effects.pay(call_id, account, cents, key, attempt)
        await maybe_hold("pay", call_id, attempt, ctx)
        return receipt

    @server.tool(
        annotations=_IDEMPOTENT, description="Set `name` to `value` (naturally idempotent)."
    )
    @guard
    async def set_value(call_id: str, name: str, value: int, ctx: Context) -> str:
        key, attempt = marks(ctx.request_context.meta)
        written = effects.set_value(call_id, name, value, key, attempt)
        await maybe_hold("set_value", call_id, attempt, ctx)
        return written

    @server.tool(annotations=_READ_ONLY, description="Cents paid to `account` so far.")
    @guard
    async def get_balance(account: str) -> str:
        return effects.balance(account)

    @server.tool(description="Send a notification (not idempotent, not guarded).")
    async def notify(call_id: str, message: str, ctx: Context) -> str:
        return effects.notify(call_id, message, *marks(ctx.request_context.meta))

    return server
