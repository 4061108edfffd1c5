"""Resolve an in-doubt charge from the provider: `uv run python examples/reconcile.py`.

A server dies in the middle of `charge`, after the payment provider charged the card and before
the result was stored: the record is in doubt. Without `reconcile=`, every retry now gets
OUTCOME_UNKNOWN (-32012) until an operator settles the record. With it, the retry asks the
provider, and the provider can tell, because the tool gave it a key to look the charge up by:
`current_claim().downstream_key`, built from the record's name, the same on every retry,
takeover and replica of one call, new for a deliberate repeat, and distinct across tenants,
tools and servers (at most 85 characters: within Stripe's 255).

- the tool charges with `Idempotency-Key: current_claim().downstream_key`;
- the reconciler looks the charge up by `InDoubt.downstream_key` (the lost execution's): found,
  `Reconciled.happened(receipt)` (the same value the tool returns); not found,
  `Reconciled.not_happened()` and the tool runs, once, under the same key; the provider
  unreachable (an exception), the record stays UNKNOWN for an operator. A reconciler only asks:
  it never charges itself.

This script starts the provider (`examples/payment_provider.py`) as a real HTTP service, runs the
server over stdio with a crash right after the charge (the process SIGKILLs itself), restarts it
on the same key store, retries with the same key, and shows the answer and the provider's book.
`serve` runs the server alone: `reconcile.py serve --store keys.db --provider URL`.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.server.mcpserver import MCPServer

from idempotency import InDoubt, KeyStore, Reconciled, current_claim, idempotent, open_store, wire

sys.path.insert(0, str(Path(__file__).resolve().parent))
from payment_provider import ProviderClient

HERE = Path(__file__).resolve()
BANNER = re.compile(r"payment provider at (http://\S+)")
#: Short, so the restarted server finds the dead one's lease over within its own wait (10 s).
LEASE = 2.0


def receipt(charge: dict[str, Any]) -> dict[str, Any]:
    """What `charge` answers, from the provider's charge: the tool and the reconciler alike."""
    return {"charge": charge["id"], "order": charge["order"], "amount": charge["amount"]}


def build(
    store: KeyStore, provider: ProviderClient, *, reconcile: bool = True, die: str | None = None
) -> MCPServer:
    """The payments server. `die` ("before-charge", "after-charge") makes the process SIGKILL
    itself at that point of `charge`: the crash this example is about."""
    server = MCPServer("payments")

    async def look_up(doubt: InDoubt) -> Reconciled:
        charge = await provider.find(doubt.downstream_key)  # raises if it cannot be asked
        if charge is None:
            return Reconciled.not_happened()
        return Reconciled.happened(receipt(charge))

    @server.tool()
    @idempotent(store, lease=LEASE, reconcile={"charge": look_up} if reconcile else None)
    async def charge(order: str, cents: int) -> dict[str, Any]:
        claim = current_claim()
        if claim is None:
            raise RuntimeError("charge needs an idempotency key")
        if die == "before-charge":
            os.kill(os.getpid(), signal.SIGKILL)
        made = await provider.charge(claim.downstream_key, order, cents)
        if die == "after-charge":
            os.kill(os.getpid(), signal.SIGKILL)
        return receipt(made)

    return server


async def serve(args: argparse.Namespace) -> None:
    store = open_store(args.store)
    server = build(
        store, ProviderClient(args.provider), reconcile=not args.no_reconcile, die=args.die
    )
    try:
        await server.run_stdio_async()
    finally:
        with anyio.CancelScope(shield=True):
            await store.aclose()


def server_params(store: str, provider: str, *extra: str) -> StdioServerParameters:
    argv = [str(HERE), "serve", "--store", store, "--provider", provider, *extra]
    return StdioServerParameters(command=sys.executable, args=argv, env=dict(os.environ))


def start_provider(db: Path) -> tuple[subprocess.Popen[str], str]:
    """The provider as its own process; returns it and its URL (read from its banner)."""
    argv = [sys.executable, str(HERE.with_name("payment_provider.py")), "--db", str(db)]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        found = BANNER.search(line)
        if found:
            return proc, found.group(1)
    raise RuntimeError("the payment provider did not start")


async def demo(folder: Path) -> None:
    provider_proc, url = start_provider(folder / "charges.db")
    store = str(folder / "keys.db")
    call = {"order": "A-1", "cents": 500}
    meta = {wire.KEY_META: "order-A-1"}
    try:
        try:
            async with Client(server_params(store, url, "--die", "after-charge")) as client:
                await client.call_tool("charge", call, meta=meta)
        except Exception:  # the server died mid-call: the client's connection broke
            print("server 1 charged the card, then died before storing the result")
        async with Client(server_params(store, url)) as client:
            retry = await client.call_tool("charge", call, meta=meta)
        marker = (retry.meta or {})[wire.IDEMPOTENCY_META]
        print(f"the retry got {retry.structured_content} ({marker['status']},", end=" ")
        print(f"reconciled: {marker.get(wire.MARKER_RECONCILED, False)})")
        charges = ProviderClient(url).charges()
        print(f"the provider holds {len(charges)} charge(s) for order A-1")
    finally:
        provider_proc.terminate()
        provider_proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("serve", help="run the payments server over stdio")
    run.add_argument("--store", required=True, help="key store URL or SQLite file")
    run.add_argument("--provider", required=True, help="the payment provider's URL")
    run.add_argument("--no-reconcile", action="store_true", help="leave in-doubt records UNKNOWN")
    run.add_argument("--die", choices=["before-charge", "after-charge"], help="crash there")
    args = parser.parse_args()
    if args.command == "serve":
        anyio.run(serve, args)
        return
    with tempfile.TemporaryDirectory() as folder:
        anyio.run(demo, Path(folder))


if __name__ == "__main__":
    main()
