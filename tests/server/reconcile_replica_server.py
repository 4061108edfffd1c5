"""A replica of `examples/reconcile.py`'s payments server whose reconciler can be held, for the
process tests of rule 19 (`test_reconcile_processes.py`). Same server name, tool and arguments as
the example, so both address the same records.

- `charge(order, cents)`: as in the example (the provider's key is `current_claim().record`).
- the reconciler counts its questions; with `--gated` it holds until `open_gate` (bounded by
  `--reconcile-timeout`, as every reconciler is).
- `wait_asked(count)`: returns this process's pid once its reconciler was asked `count` times;
  `asked_count()`: how often it was asked.
- `open_gate()`: lets a held reconciler answer.

`python reconcile_replica_server.py --store URL --provider URL [--gated]` (stdio).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer

from idempotency import InDoubt, Reconciled, current_claim, idempotent, open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from effect_server import Progress, serve_stdio
from payment_provider import ProviderClient
from reconcile import receipt


async def serve(args: argparse.Namespace) -> None:
    store = open_store(args.store)
    provider = ProviderClient(args.provider)
    server = MCPServer("payments")
    asked = Progress()
    gate = anyio.Event()

    async def look_up(doubt: InDoubt) -> Reconciled:
        asked.step()
        if args.gated:
            await gate.wait()
        charge = await provider.find(doubt.record)
        if charge is None:
            return Reconciled.not_happened()
        return Reconciled.happened(receipt(charge))

    options: dict[str, Any] = {
        "lease": args.lease,
        "wait": args.wait,
        "reconcile_timeout": args.reconcile_timeout,
    }

    @server.tool()
    @idempotent(store, reconcile={"charge": look_up}, **options)
    async def charge(order: str, cents: int) -> dict[str, Any]:
        claim = current_claim()
        assert claim is not None
        return receipt(await provider.charge(claim.record, order, cents))

    @server.tool()
    async def wait_asked(count: int = 1) -> int:
        return await asked.wait_for(count)

    @server.tool()
    async def asked_count() -> int:
        return asked.count

    @server.tool()
    async def open_gate() -> str:
        gate.set()
        return "open"

    await serve_stdio(server, store)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--provider", required=True)
    parser.add_argument("--gated", action="store_true")
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--reconcile-timeout", type=float, default=1.0)
    parser.add_argument("--wait", type=float, default=10.0)
    anyio.run(serve, parser.parse_args())


if __name__ == "__main__":
    main()
