"""A payments server whose effect is a line in a ledger file, for the process tests of rule 25
(`test_reconcile_processes.py`): servers of different names, each with a guarded tool `charge`
and a reconciler, on one key store, as teams sharing one Redis run them.

- `charge(order, cents)` appends its record's name (`current_claim().record`) to the server's
  own ledger, `<ledger>/<name>.effects` (flushed to disk), then with `--die` SIGKILLs its own
  process: the worker dies after the effect, before the result is stored.
- its reconciler appends `<name> <record>` to `<ledger>/asked` (every question any server's
  reconciler is asked, one file the servers cannot fake), and answers from its own ledger only:
  happened (the tool's receipt) if the record is there, else not happened. Asked about another
  server's record it therefore says "not happened": the wrong answer `keys reconcile` must never
  ask for.

`build(name, store, ledger)` is the server object (what `keys reconcile --app` imports);
`python charge_ledger_server.py --name N --store URL --ledger DIR [--die] [--no-reconcile]`
serves it over stdio.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import anyio
from mcp.server.mcpserver import MCPServer

from idempotency import InDoubt, KeyStore, Reconciled, current_claim, idempotent, open_store

#: Short, so that a killed worker's lease runs out soon after it died.
LEASE = 1.0


def _append(path: Path, line: str) -> None:
    with path.open("a") as ledger:
        ledger.write(line + "\n")
        ledger.flush()
        os.fsync(ledger.fileno())


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def receipt(name: str, record: str) -> dict[str, str]:
    return {"server": name, "charge": record[:12]}


def build(
    name: str, store: KeyStore, ledger: Path, *, reconcile: bool = True, die: bool = False
) -> MCPServer:
    server = MCPServer(name)
    effects = ledger / f"{name}.effects"

    def look_up(doubt: InDoubt) -> Reconciled:
        _append(ledger / "asked", f"{name} {doubt.record}")
        if doubt.record in lines(effects):
            return Reconciled.happened(receipt(name, doubt.record))
        return Reconciled.not_happened()

    @server.tool()
    @idempotent(store, lease=LEASE, wait=0.0, reconcile=look_up if reconcile else None)
    async def charge(order: str, cents: int) -> dict[str, str]:
        claim = current_claim()
        assert claim is not None
        _append(effects, claim.record)
        if die:
            os.kill(os.getpid(), signal.SIGKILL)
        return receipt(name, claim.record)

    return server


async def serve(args: argparse.Namespace) -> None:
    store = open_store(args.store)
    server = build(
        args.name, store, Path(args.ledger), reconcile=not args.no_reconcile, die=args.die
    )
    try:
        await server.run_stdio_async()
    finally:
        with anyio.CancelScope(shield=True):
            await store.aclose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--die", action="store_true")
    parser.add_argument("--no-reconcile", action="store_true")
    anyio.run(serve, parser.parse_args())


if __name__ == "__main__":
    main()
